"""The reproduction driver: its JSON contract, report files, t-tests, and non-private rows once."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from dpopt import experiments
from dpopt.algorithms import DPSGD, Storm, dp_gd
from dpopt.experiments._runner import Method, Problem, mean_curve, one_sided_p
from dpopt.train import History
from dpopt.experiments.reproduce import reproduce
from dpopt.oracles import Logistic


def _problem(data_dir: str | None, key: None = None) -> tuple[Problem, dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(500, 4, generator=gen, dtype=torch.float64)
    y = torch.where(X @ torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64) > 0, 1.0, -1.0)
    oracle = Logistic(X[:400], y[:400])
    return Problem(oracle, lambda theta: oracle.error(theta, X[400:], y[400:])), {"n": 400}


def _methods(epsilon: float, key: None = None) -> list[Method]:
    return [
        Method("DP-SGD", lambda n, p: (DPSGD(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=40), 30),
               {"lr": (0.5,)}, {epsilon: {"lr": 0.5}}),
        Method("DP-GD", lambda n, p: (dp_gd(lr=p["lr"], clip=1.0, noise_multiplier=1.0), 10),
               {"lr": (0.01, 1.0)}),  # no preset: tuned on the grid
        Method("SGD", lambda n, p: (Storm(lr=0.5, momentum=1.0, batch_size0=40, batch_size=40), 30), {},
               {None: {}}, private=False),
    ]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    module = types.SimpleNamespace(
        NAME="toy", EPSILONS=(1.0, 2.0), DELTA=1e-5, TUNING_SEEDS=(100,), OURS="DP-SGD",
        METRICS=("test_error", "objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s", "epsilon"),
        PAPER=[{"algorithm": "DP-SGD", "epsilon": 1.0, "test_error": (0.1, 0.01), "passes": 3}],
        TUNING_COST={}, problem=_problem, methods=_methods, notes=lambda payload: "toy notes")
    monkeypatch.setitem(experiments.EXPERIMENTS, "toy", module)
    return "toy"


def test_reproduce_writes_the_documented_json(toy: str, tmp_path: Path) -> None:
    payload = reproduce(toy, seeds=3, out=tmp_path, workers=1)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["experiment"] == payload["experiment"] == "toy"
    assert {(row["algorithm"], row["epsilon"]) for row in written["rows"]} == {
        ("DP-SGD", 1.0), ("DP-GD", 1.0), ("SGD", None), ("DP-SGD", 2.0), ("DP-GD", 2.0)}
    for row in written["rows"]:
        assert set(row["metrics"]) == {"test_error", "objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s",
                                       "epsilon"}
        assert set(row["metrics"]["objective"]) == {"mean", "std"}
        if row["epsilon"] is not None:
            assert row["metrics"]["epsilon"]["mean"] <= row["epsilon"]
            assert row["accountant"] in ("pld", "rdp")
    assert written["paper"][0]["metrics"]["test_error"] == {"mean": 0.1, "std": 0.01}
    assert written["paper"][0]["metrics"]["passes"] == {"mean": 3, "std": None}
    # ours against each private baseline at the same ε (not against the non-private reference)
    assert {(t["epsilon"], t["baseline"]) for t in written["t_tests"]} == {(1.0, "DP-GD"), (2.0, "DP-GD")}
    assert written["tuning"]["DP-GD ε=1.0"]["chosen"] == {"lr": 1.0}  # 0.01 barely moves θ in 10 steps
    assert {p.name for p in tmp_path.iterdir()} == {"results.json", "results.md", "curves_eps1.0.png",
                                                   "curves_eps2.0.png"}
    assert "toy notes" in (tmp_path / "results.md").read_text()


def test_one_sided_p() -> None:
    assert one_sided_p([1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 1.9, 2.0]) < 1e-4
    assert one_sided_p([2.0, 2.1, 1.9, 2.0], [1.0, 1.1, 0.9, 1.0]) > 0.9999
    assert one_sided_p([1.0, 1.0], [2.0, 2.0]) == 0.0


def test_unknown_experiment_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="experiment='nope' must be one of: dp-srm-ijcnn1"):
        reproduce("nope")


def test_the_largest_problem_is_queued_first_and_reported_in_the_preset_order(
        toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs are queued largest problem first (n·d), so a pool's last runs are short; the report
    keeps the preset's order."""
    driver = sys.modules["dpopt.experiments.reproduce"]

    def problem(data_dir: str | None, key: str) -> tuple[Problem, dict[str, Any]]:
        made, _ = _problem(data_dir)
        size = {"small": 100, "large": 400}[key]
        gen = torch.Generator().manual_seed(0)
        X = torch.randn(size, 4, generator=gen, dtype=torch.float64)
        return Problem(Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0)), made.test_error), {"n": size}

    module = experiments.EXPERIMENTS[toy]
    monkeypatch.setattr(module, "PROBLEMS", ("small", "large"), raising=False)
    monkeypatch.setattr(module, "problem", problem)
    monkeypatch.setattr(module, "methods", lambda epsilon, key: _methods(epsilon)[:1])
    monkeypatch.setattr(module, "EPSILONS", (1.0,))
    monkeypatch.setattr(module, "PAPER", [])
    queued = []
    start = driver.start_seeds
    monkeypatch.setattr(driver, "start_seeds", lambda *args, key, **kw: queued.append(key) or start(*args, key=key, **kw))
    payload = reproduce(toy, seeds=1, out=tmp_path, workers=1)
    assert queued == ["large", "small"]
    assert [row["problem"] for row in payload["rows"]] == ["small", "large"]
    assert list(payload["facts"]) == ["small", "large"]


def test_a_derived_curve_is_the_mean_of_the_function_over_seeds() -> None:
    """‖∇F‖² curves average the squares (5, 10 here), not square the average (4, 9)."""
    def history(norms: list[float]) -> History:
        records = [{"passes": float(k), "grad_norm": g} for k, g in enumerate(norms)]
        return History(records=records, final={}, theta=torch.zeros(1), delta=1e-5, accountant="pld",
                       neighboring_relation="replace_one", steps_done=2, randomness="seed 0")

    xs, values = mean_curve([history([1.0, 2.0]), history([3.0, 4.0])], "grad_norm_sq")
    assert xs.tolist() == [0.0, 1.0] and values == pytest.approx([5.0, 10.0])
    assert mean_curve([history([1.0, 2.0]), history([3.0, 4.0])], "grad_norm")[1] == pytest.approx([2.0, 3.0])
