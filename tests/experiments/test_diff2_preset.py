"""The DIFF2 presets' quick mode and the paper's patience tuner (with its privacy cost)."""

from __future__ import annotations

import dataclasses
import json
import math

import dp_accounting as dpa
import torch

from dpopt.accounting import calibrate, epsilon_of
from dpopt.algorithms import DIFF2
from dpopt.experiments._runner import Method, Problem
from dpopt.experiments.patience_tuning import patience_run, patience_tune
from dpopt.plan import Plan
from dpopt.experiments.reproduce import reproduce
from dpopt.oracles import LeastSquares
from dpopt.sampling import Clients


def test_quick_regression_preset_runs_every_method_at_its_privacy_target(tmp_path, shared_data_dir):
    payload = reproduce("diff2-regression", quick=True, out=tmp_path, data_dir=str(shared_data_dir), workers=1)
    written = json.loads((tmp_path / "results.json").read_text())
    assert {(row["algorithm"], row["epsilon"]) for row in written["rows"]} == {
        ("GD", None), *((name, eps) for name in ("DP-GD", "DIFF2-GD") for eps in (3.0, 5.0))}
    # GD (no noise, full batch, last iterate) does not depend on the seed: one run; the others one per seed
    assert {row["algorithm"]: row["seeds"] for row in written["rows"]} == {"GD": 1, "DP-GD": 2, "DIFF2-GD": 2}
    for row in written["rows"]:
        spent = row["metrics"]["epsilon"]["mean"]
        # (strict JSON: ε = ∞ of the non-private row is the string "inf")
        assert spent == "inf" if row["epsilon"] is None else 0.99 * row["epsilon"] <= spent <= row["epsilon"]
        train = row["diagnostics"]["metrics"]  # NOT PRIVATE: the paper reports them
        assert row["delta"] == 1e-5 and train["objective"]["mean"] > 0
        # the lowest logged train loss (the paper's t-test) is at most the final one, seed by seed
        assert 0 < train["min_objective"]["mean"] <= train["objective"]["mean"]
    tests = payload["diagnostics"]["t_tests"]  # on training losses: NOT PRIVATE
    pairs = {(t["ours"], t["baseline"], t["epsilon"]) for t in tests}
    assert pairs == {("DIFF2-GD", "DP-GD", eps) for eps in (3.0, 5.0)}
    assert all(0 <= t["p_objective"] <= 1 and 0 <= t["p_min_objective"] <= 1 for t in tests)
    markdown = (tmp_path / "results.md").read_text()
    assert "DIFF2-GD is below its baseline" in markdown and "Quick mode" in markdown
    assert (tmp_path / "curves_california_housing-2000_eps3.0.png").exists()


def _ridge() -> Problem:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(400, 5, generator=gen, dtype=torch.float64)
    y = X @ torch.ones(5, dtype=torch.float64) + 0.1 * torch.randn(400, generator=gen, dtype=torch.float64)
    oracle = LeastSquares(X, y)
    return Problem(oracle, lambda theta: float(oracle.loss(theta)))


def _diff2(n: int, p: dict) -> tuple[DIFF2, int]:
    return DIFF2(lr=p["lr"], clip=p["clip"], clip_diff=4.0, restart=5, noise_multiplier1=1.0, noise_multiplier2=1.0,
                 clients=Clients(n, 4), output_rule="last"), 40


def test_patience_run_abandons_a_diverging_step_size_and_completes_a_good_one():
    problem = _ridge()
    algorithm, steps = _diff2(400, {"lr": 0.5, "clip": 100.0})
    clean = Plan(dataclasses.replace(algorithm, noise_multiplier1=0.0, noise_multiplier2=0.0), n=problem.oracle.n,
                 steps=steps, delta=1e-5)
    loss, ledger, rounds = patience_run(clean, problem, seed=0, check_every=2)
    assert rounds == steps and loss < 0.1 and ledger.steps == steps
    # η = 4 on this quadratic (curvature ≈ 1) grows every round: each check from the second one is a
    # strike (loss > 1.05 × best), the fifth strike abandons the run at the sixth check
    faster = clean.with_algorithm(dataclasses.replace(clean.algorithm, lr=4.0))
    loss, ledger, rounds = patience_run(faster, problem, seed=0, check_every=2)
    assert math.isnan(loss) and rounds == 12 and ledger.steps == 12


def test_patience_tune_keeps_the_first_step_size_that_completes_and_reports_the_composed_epsilon():
    problem = _ridge()
    method = Method("DIFF2-GD", _diff2, {"clip": (1.0, 10.0)})
    result = patience_tune(method, problem, epsilon=1.0, delta=1e-5, seeds=(7,), step_sizes=(1e300, 0.5, 0.25),
                           check_every=10)
    scores = result["scores"]
    assert result["label"].startswith("NOT PRIVATE")  # chosen by the training loss without noise
    assert [s["abandoned"] for s in scores] == [[1e300], [1e300]]
    assert all(s["lr"] == 0.5 and math.isfinite(s["objective"]) for s in scores)
    assert result["chosen"] == min(scores, key=lambda s: s["objective"])["params"] | {"lr": 0.5}
    assert result["cost"]["runs"] == 4 and result["cost"]["rounds"] == 2 * 40 + 2 * 10  # abandoned at the first check
    # 4 runs calibrated to ε = 1 each, two of them abandoned early: more than one run's ε, less than 4 whole runs'
    calibrated = [calibrate(_diff2(400, {"lr": 0.5, "clip": c})[0], epsilon=1.0, delta=1e-5, n=400, steps=40)
                  for c in (1.0, 10.0)]
    four = dpa.ComposedDpEvent([a.planned_event(400, 40) for a in calibrated for _ in range(2)])
    assert 1.0 < result["cost"]["epsilon_composed"] < epsilon_of(four, 1e-5, calibrated[0].relation())
