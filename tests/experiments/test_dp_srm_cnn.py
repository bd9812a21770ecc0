"""The DP-SRM network presets: the paper's settings, time to target, and both quick versions end to
end (JSON shape, privacy spent ≤ target)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dpopt.data import DataError
from dpopt.experiments import dp_srm_cnn
from dpopt.experiments._runner import steps_for_passes
from dpopt.experiments.reproduce import reproduce
from dpopt.train import History
from dpopt.sampling import Poisson


def _check_payload(payload: dict, epsilons: dict[str, tuple[float, ...]]) -> None:
    """The JSON contract of the presets and the privacy of every row: 0.99 ε ≤ spent ≤ ε."""
    assert set(payload) >= {"experiment", "rows", "paper", "seeds", "facts", "t_tests"}
    found = {(row["problem"], row["algorithm"], row["epsilon"]) for row in payload["rows"]}
    assert found == {(key, name, eps) for key, eps_of in epsilons.items() for eps in eps_of
                     for name in ("DP-SRM", "DP-SGD")}
    for row in payload["rows"]:
        assert row["delta"] == 1e-5
        assert row["accountant"] == "pld" and row["neighboring_relation"] == "add/remove-one"
        assert set(row["metrics"]) | set(row["diagnostics"]["metrics"]) == set(dp_srm_cnn.MNIST.METRICS)
        assert set(row["metrics"]) == {"test_error", "reached_target", "epsilon"}
        spent = row["metrics"]["epsilon"]["mean"]
        assert 0.99 * row["epsilon"] <= spent <= row["epsilon"]
        assert 0.0 <= row["metrics"]["test_error"]["mean"] <= 1.0
        assert math.isfinite(row["diagnostics"]["metrics"]["objective"]["mean"])
        assert row["metrics"]["reached_target"]["mean"] in (0.0, 1.0)
    for row in payload["paper"]:
        assert set(row) == {"problem", "algorithm", "epsilon", "delta", "metrics"}


def test_mnist_quick_version(shared_data_dir, tmp_path):
    payload = reproduce("dp-srm-mnist", quick=True, seeds=1, out=tmp_path, data_dir=str(shared_data_dir), workers=1)
    _check_payload(payload, {"mnist-cnn:mnist-smoke": (7.0, 3.0, 1.0)})
    assert json.loads((tmp_path / "results.json").read_text())["experiment"] == "dp-srm-mnist"
    paper = {(r["algorithm"], r["epsilon"]): r["metrics"]["test_error"]["mean"] for r in payload["paper"]}
    assert paper == {("DP-SRM", 7.0): 0.0291, ("DP-SGD", 7.0): 0.0293}
    facts, = (f for f in payload["facts"] if f["problem"] == "mnist-cnn:mnist-smoke")
    assert (facts["n"], facts["n_test"], facts["dim"], facts["data"]) == (500, 500, 26_010, "mnist")
    assert payload["log_points"] == 10
    assert {p.name for p in tmp_path.glob("*.png")} == {f"curves_mnist-cnn-mnist-smoke_eps{e}.png"
                                                        for e in (7.0, 3.0, 1.0)}
    assert "1,000" not in (tmp_path / "results.md").read_text()  # the report names the subset it used
    assert "500 training / 500 test records" in (tmp_path / "results.md").read_text()


def test_cifar10_quick_version_on_random_images(tmp_path):
    """No CIFAR-10 here: the smoke version runs CNN5 (ε = 6, 8, 10) and CNN6 (ε = 8 only) on random
    CIFAR-shaped images, one step per run, and writes no figure for CNN6 at the other ε."""
    payload = reproduce("dp-srm-cifar10", quick=True, seeds=1, out=tmp_path, workers=1)
    _check_payload(payload, {"cnn5:cifar10-smoke": (6.0, 8.0, 10.0), "cnn6:cifar10-smoke": (8.0,)})
    assert {f["problem"]: f["data"] for f in payload["facts"]}["cnn6:cifar10-smoke"] == "random CIFAR-shaped images"
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "curves_cnn5-cifar10-smoke_eps6.0.png", "curves_cnn5-cifar10-smoke_eps8.0.png",
        "curves_cnn5-cifar10-smoke_eps10.0.png", "curves_cnn6-cifar10-smoke_eps8.0.png"}
    cnn6 = {r["algorithm"]: r["metrics"] for r in payload["paper"] if r["problem"] == "cnn6:cifar10"}
    assert cnn6["DP-SGD"]["time_to_target_s"]["mean"] == 5176.0 and cnn6["DP-SRM"]["steps_to_target"]["mean"] == 2.6e4


def test_cifar10_full_version_names_the_missing_data(tmp_path):
    with pytest.raises(DataError, match="cifar10.*dpopt data fetch cifar10"):
        dp_srm_cnn.build_problem("cnn5:cifar10", str(tmp_path))


def test_cifar10_methods_follow_the_papers_settings():
    """C1 = 2, γ = C2, b0 = factor·b, the docs/algorithms.md §1 grids, CNN6 only at ε = 8, 100 passes."""
    grids = {m.name: m.grid for m in dp_srm_cnn.CIFAR10.methods(8.0, "cnn5:cifar10")}
    assert grids["DP-SRM"]["clip_diff"] == (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99)
    assert grids["DP-SRM"]["lr"] == grids["DP-SGD"]["lr"] == (0.01, 0.02, 0.05, 0.1, 0.2)
    assert grids["DP-SRM"]["batch_size"] == grids["DP-SGD"]["batch_size"] == (32, 64, 128)
    assert grids["DP-SRM"]["b0_factor"] == (1, 2, 4)
    assert dp_srm_cnn.CIFAR10.methods(6.0, "cnn6:cifar10") == []
    methods = {m.name: m for m in dp_srm_cnn.CIFAR10.methods(8.0, "cnn6:cifar10")}
    assert methods["DP-SRM"].tuned == {} and methods["DP-SRM"].grid == grids["DP-SRM"]  # tuned when first run
    srm, steps = methods["DP-SRM"].build(50_000, {"lr": 0.1, "clip_diff": 0.3, "batch_size": 64, "b0_factor": 4})
    assert ((srm.clip, srm.clip_diff, srm.gamma, srm.batch_size0, srm.batch_size, srm.lr)
            == (2.0, 0.3, 0.3, 256, 64, 0.1))
    assert steps == 1 + (100 * 50_000 - 256) // 64
    sgd, steps = methods["DP-SGD"].build(50_000, {"lr": 0.05, "batch_size": 128})
    assert (sgd.clip, sgd.batch_size, sgd.sampling, steps) == (2.0, 128, Poisson, 100 * 50_000 // 128)


def test_mnist_methods_use_the_tuned_settings_at_every_epsilon():
    for epsilon, passes in dp_srm_cnn.SETTINGS["mnist-cnn:mnist"].epochs.items():
        methods = {m.name: m for m in dp_srm_cnn.MNIST.methods(epsilon, "mnist-cnn:mnist")}
        params = methods["DP-SRM"].tuned[epsilon]
        srm, steps = methods["DP-SRM"].build(60_000, params)
        assert (srm.clip, srm.gamma, srm.batch_size0) == (1.0, params["clip_diff"], 4 * 256)
        assert steps == steps_for_passes(passes, 60_000, 1024, 256)
        sgd, steps = methods["DP-SGD"].build(60_000, methods["DP-SGD"].tuned[epsilon])
        assert (sgd.clip, sgd.batch_size, steps) == (1.0, 256, passes * 60_000 // 256)


def test_time_to_target_is_the_first_logged_point_below_the_target():
    records = [{"test_error": e, "wall_time_s": t, "cpu_time_s": c, "passes": p}
               for e, t, c, p in ((0.1, 1.0, 0.9, 0.5), (0.031, 2.0, 1.8, 1.0), (0.03, 3.5, 3.0, 1.5),
                                  (0.02, 5.0, 4.1, 2.0))]
    history = History(records, {}, torch.zeros(1), 1e-5, "pld", "add/remove-one", 4, randomness="seed 0")
    assert dp_srm_cnn.time_to_target(history, target_error=0.03) == {
        "time_to_target_s": 3.5, "cpu_time_to_target_s": 3.0, "epochs_to_target": 1.5, "reached_target": 1.0}
    missed = dp_srm_cnn.time_to_target(history, target_error=0.01)
    assert math.isnan(missed["time_to_target_s"]) and math.isnan(missed["epochs_to_target"])
    assert missed["reached_target"] == 0.0


def test_mnist_report_states_misses_and_times():
    """The notes put our ε = 7 errors beside the paper's and call a miss a miss."""
    def row(name: str, error: float, wall: float, cpu: float) -> dict:
        return {"problem": "mnist-cnn:mnist", "algorithm": name, "epsilon": 7.0, "metrics": {
            "test_error": {"mean": error}, "time_to_target_s": {"mean": wall}, "cpu_time_to_target_s": {"mean": cpu},
            "reached_target": {"mean": 1.0 if math.isfinite(wall) else 0.5}}}

    facts = {"mnist-cnn:mnist": {"model": "mnist-cnn", "dim": 26_010, "data": "mnist", "n": 60_000, "n_test": 10_000,
                                 "epochs": {"7.0": 10}, "target_error": 0.03}}
    paper = [{"algorithm": "DP-SRM", "metrics": {"test_error": {"mean": 0.0291}}},
             {"algorithm": "DP-SGD", "metrics": {"test_error": {"mean": 0.0293}}}]
    payload = {"facts": facts, "paper": paper, "quick": False, "log_points": 20, "seeds": 2,
               "t_tests": [{"problem": "mnist-cnn:mnist", "epsilon": 7.0, "ours": "DP-SRM", "baseline": "DP-SGD",
                            "p_test_error": 0.2}],
               "rows": [row("DP-SRM", 0.0350, 400.0, 300.0), row("DP-SGD", 0.0300, 200.0, 150.0)]}
    notes = dp_srm_cnn.MNIST.notes(payload)
    assert "60,000 training / 10,000 test records" in notes
    assert "DP-SRM test error 3.50% **misses** the paper's 2.91%" in notes
    assert "DP-SGD test error 3.00% matches or beats the paper's 2.93%" in notes
    assert "DP-SRM is **slower**" in notes and "ratio DP-SGD/DP-SRM 0.50 (wall), 0.50 (CPU)" in notes
    assert "**Miss:** mnist-cnn:mnist, ε = 7, DP-SRM vs DP-SGD: p = 0.2 (test_error)" in notes
    payload["rows"][0] = row("DP-SRM", 0.0350, math.nan, math.nan)
    assert "**not every seed reached 97 % accuracy** (fraction of seeds: {'DP-SRM': 0.5, 'DP-SGD': 1.0})" in \
        dp_srm_cnn.MNIST.notes(payload)
