"""The o2nc-nonsmooth preset: its problems, the oracle-call counter, and ``--quick`` end to end."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpopt.experiments import o2nc_nonsmooth as preset
from dpopt.experiments.reproduce import reproduce


def test_synthetic_family_is_unit_lipschitz_with_unit_margins():
    X, y, X_test, _ = preset.synthetic(32, 4000)
    assert X.shape == (4000, 32) and X_test.shape == (preset.N_TEST, 32)
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0)
    outliers = np.isclose(np.abs(y), 5.0)
    assert 0.08 < outliers.mean() < 0.12  # 10 % of labels replaced by ±5 (binomial sd 0.5 %)
    assert 0.8 < y[~outliers].std() < 1.2  # ⟨x, w*⟩ has unit variance, plus 0.1 noise


def test_ijcnn1_problem_is_a_relu_network_from_its_initialisation(shared_data_dir):
    problem, facts = preset.problem("ijcnn1-relu", str(shared_data_dir))
    assert facts["n"] == preset.N_TRAIN and facts["d"] == 22 * 8 + 8 + 8 + 1 == preset._dimension("ijcnn1-relu")
    assert problem.theta0.shape == (facts["d"],) and float(problem.theta0.abs().sum()) > 0
    assert 0.0 <= problem.test_error(problem.theta0) <= 1.0


def test_counted_oracle_counts_per_record_calls():
    problem, _ = preset.problem("synthetic-d8-n2000", None)
    oracle = problem.oracle
    points = torch.zeros(3, 5, 8, dtype=torch.float64)
    oracle.losses_at(points, torch.arange(3))
    oracle.gradients_at(points[:, :2], torch.arange(3))
    oracle.per_record(torch.zeros(8, dtype=torch.float64), torch.arange(4))
    assert oracle.take() == {"function_evals": 15.0, "gradient_evals": 10.0}
    assert oracle.take() == {"function_evals": 0.0, "gradient_evals": 0.0}


def test_quick_reproduction_runs_every_method_at_its_privacy_target(tmp_path):
    payload = reproduce("o2nc-nonsmooth", quick=True, out=tmp_path, workers=1)
    rows = {row["algorithm"]: row["metrics"] | row["diagnostics"]["metrics"] for row in payload["rows"]}
    assert set(rows) == {preset.OURS, preset.ZHANG, preset.FIRST, "DP-SGD"}
    for metrics in rows.values():
        assert 0.99 <= metrics["epsilon"]["mean"] <= 1.0
        assert math.isfinite(metrics["goldstein"]["mean"]) and metrics["goldstein"]["mean"] >= 0
    for name in (preset.OURS, preset.ZHANG):
        assert rows[name]["function_evals"]["mean"] > 0 and rows[name]["gradient_evals"]["mean"] == 0
    assert rows[preset.FIRST]["gradient_evals"]["mean"] > 0 and rows[preset.FIRST]["function_evals"]["mean"] == 0
    assert 0 <= rows[preset.OURS]["clip_rate"]["mean"] <= 1 and math.isnan(rows["DP-SGD"]["clip_rate"]["mean"])
    assert {row["neighboring_relation"] for row in payload["rows"]} == {"replace-one", "add/remove-one"}
    text = (tmp_path / "results.md").read_text()
    assert "reports no experiments" in text and "Zhang/ours" in text
    assert (tmp_path / "goldstein_vs_d.png").stat().st_size > 0


def _history(goldstein: list[float], calls: list[float]) -> SimpleNamespace:
    return SimpleNamespace(records=[{"goldstein": g, "oracle_calls": c} for g, c in zip(goldstein, calls)])


def test_calls_to_reach_the_threshold_are_read_off_the_logged_curve():
    curves = [_history([0.5, 0.3, 0.2], [10, 20, 30]), _history([0.5, 0.45, 0.4], [10, 20, 30])]
    got = preset.calls_to_reach(curves, 0.3, start=0.6)
    assert got[0] == 20 and math.isnan(got[1])  # the second seed never gets to 0.3
    assert preset.calls_to_reach(curves, 0.3, start=0.25) == [0.0, 0.0]  # θ0 is already there
    payload = {"_curves": {("p", name, 1.0): curves for name in (*preset.O2NC_METHODS, "DP-SGD")}}
    payload["_curves"][("p", "DP-SGD", 1.0)] = [_history([0.9], [1]), _history([0.7], [1])]
    assert preset.threshold(payload, "p") == pytest.approx(0.8)  # DP-SGD's mean last value is the worst


def test_slope_of_a_power_law_is_its_exponent():
    dims = np.array([8.0, 32.0, 128.0, 512.0])
    assert preset.slope(dims, 3 * dims**-0.5) == pytest.approx(-0.5)


def test_the_o2nc_methods_share_one_grid_of_constants_and_build_from_it():
    methods = {m.name: m for m in preset.methods(1.0, "synthetic-d32")}
    for name in preset.O2NC_METHODS:
        assert methods[name].grid == {"c_D": (1.0, 4.0, 16.0), "c": (1.0, 0.1, 0.01)}
    assert methods[preset.OURS].tuned[1.0] == {"c_D": 4.0, "c": 0.01}
    assert methods[preset.ZHANG].tuned[1.0] == methods[preset.FIRST].tuned[1.0] == {"c_D": 1.0, "c": 0.01}
    small, _ = methods[preset.OURS].build(4000, {"c_D": 1.0, "c": 1.0})
    large, _ = methods[preset.OURS].build(4000, {"c_D": 4.0, "c": 0.1})
    # D = c_D·(the theorem's D at its own T; a larger D shortens Σ, so T moves a little);
    # c scales the clips' concentration term
    assert 3.5 * small.radius < large.radius < 4.5 * small.radius and large.clip0 < small.clip0
