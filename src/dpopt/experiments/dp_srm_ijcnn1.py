"""Seed 000, Table 1: nonconvex logistic regression on ijcnn1 (DP-SRM vs its baselines).

Objective: F(θ) = (1/n) Σ log(1 + exp(−y_i⟨x_i, θ⟩)) + λ Σ_j θ_j²/(1 + θ_j²). ε ∈ {0.2, 0.5},
δ = 1e−5. DP-SRM with C1 = 1, C2 = 0.01, γ = C2 (the paper's settings); DP-GD, DP-AGD and
RRPSGD with clip 1; non-private STORM as the reference. Data passes are capped at the
paper's (DP-SRM 4/5, DP-GD 20, RRPSGD 8/10). Each method's step size (and batch sizes where
the paper tuned them) is tuned on the grid below by mean final training objective over three
tuning seeds (1000-1002), disjoint from the evaluation seeds (0..N-1); ``TUNED`` holds the
choice of the last ``--retune``, ``TUNING_COST`` what it cost. Tuning is not privacy-accounted,
as in the paper.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import DPAGD, DPSRM, Storm, dp_gd, rrpsgd
from ..data import load
from ..oracles import NonconvexLogistic
from ._runner import Method, Params, Problem, steps_for_passes
from .preset import Experiment

NAME = "dp-srm-ijcnn1"
DATASET = "ijcnn1"
REG = 1e-3
EPSILONS = (0.2, 0.5)
DELTA = 1e-5
PASSES = {"DP-SRM": {0.2: 4, 0.5: 5}, "RRPSGD": {0.2: 8, 0.5: 10}, "DP-GD": {0.2: 20, 0.5: 20}, "STORM": 5}
DPAGD_MAX_STEPS = 400
TUNING_SEEDS = (1000, 1001, 1002)

#: The paper's Table 1 (supplementary of Wang, Jayaraman, Evans, Gu): test error (std), passes,
#: CPU seconds, gradient norm (std).
PAPER = [
    {"algorithm": "DP-GD", "epsilon": 0.2, "test_error": (0.3160, 0.0120), "passes": 20, "cpu_time_s": 0.5180, "grad_norm": (0.0184, 0.0024)},
    {"algorithm": "DP-AGD", "epsilon": 0.2, "test_error": (0.2645, 0.0044), "passes": 346, "cpu_time_s": 90.05, "grad_norm": (0.0133, 0.0018)},
    {"algorithm": "RRPSGD", "epsilon": 0.2, "test_error": (0.3110, 0.0106), "passes": 8, "cpu_time_s": 47.64, "grad_norm": (0.0175, 0.0023)},
    {"algorithm": "DP-SRM", "epsilon": 0.2, "test_error": (0.2503, 0.0090), "passes": 4, "cpu_time_s": 0.4748, "grad_norm": (0.0117, 0.0008)},
    {"algorithm": "DP-GD", "epsilon": 0.5, "test_error": (0.2717, 0.0081), "passes": 20, "cpu_time_s": 0.4990, "grad_norm": (0.0171, 0.0024)},
    {"algorithm": "DP-AGD", "epsilon": 0.5, "test_error": (0.2416, 0.0029), "passes": 365, "cpu_time_s": 94.28, "grad_norm": (0.0397, 0.0025)},
    {"algorithm": "RRPSGD", "epsilon": 0.5, "test_error": (0.3033, 0.0110), "passes": 10, "cpu_time_s": 59.06, "grad_norm": (0.0160, 0.0018)},
    {"algorithm": "DP-SRM", "epsilon": 0.5, "test_error": (0.2341, 0.0042), "passes": 5, "cpu_time_s": 0.4368, "grad_norm": (0.0082, 0.0005)},
    {"algorithm": "STORM", "epsilon": None, "test_error": (0.2096, 0.002)},
]


def _dp_srm(epsilon: float) -> Any:
    def build(n: int, p: Params) -> tuple[Any, int]:
        b0 = p["batch_size"] * p["b0_factor"]
        algo = DPSRM(lr=p["lr"], clip=1.0, clip_diff=0.01, gamma=0.01, noise_multiplier0=1.0, noise_multiplier=1.0,
                     batch_size0=b0, batch_size=p["batch_size"])
        return algo, steps_for_passes(PASSES["DP-SRM"][epsilon], n, b0, p["batch_size"])
    return build


def _rrpsgd(epsilon: float) -> Any:
    def build(n: int, p: Params) -> tuple[Any, int]:
        algo = rrpsgd(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=p["batch_size"])
        return algo, steps_for_passes(PASSES["RRPSGD"][epsilon], n, p["batch_size"], p["batch_size"])
    return build


def _dp_gd(epsilon: float) -> Any:
    def build(n: int, p: Params) -> tuple[Any, int]:
        return dp_gd(lr=p["lr"], clip=1.0, noise_multiplier=1.0), PASSES["DP-GD"][epsilon]
    return build


def _dp_agd(epsilon: float) -> Any:
    def build(n: int, p: Params) -> tuple[Any, int]:
        return DPAGD(clip=1.0, obj_clip=1.0, noise_multiplier=1.0, max_step=p["max_step"]), DPAGD_MAX_STEPS
    return build


def _storm(epsilon: float) -> Any:
    def build(n: int, p: Params) -> tuple[Any, int]:
        b0 = p["batch_size"] * 2
        algo = Storm(lr=p["lr"], momentum=0.01, batch_size0=b0, batch_size=p["batch_size"])
        return algo, steps_for_passes(PASSES["STORM"], n, b0, p["batch_size"])
    return build


GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "DP-SRM": {"lr": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0), "batch_size": (50, 100, 250, 500), "b0_factor": (1, 4)},
    "DP-GD": {"lr": (10.0, 20.0, 50.0, 100.0, 200.0, 500.0)},
    "RRPSGD": {"lr": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0), "batch_size": (25, 50, 100, 250, 500)},
    "DP-AGD": {"max_step": (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)},
    "STORM": {"lr": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0), "batch_size": (50, 100, 250, 500)},
}

#: Chosen by ``dpopt reproduce dp-srm-ijcnn1 --retune`` on 2026-11-21 (the grids above; every
#: choice is inside its grid, not at an edge). STORM is non-private: one choice (key None).
TUNED: dict[str, dict[float | None, Params]] = {
    "DP-SRM": {0.2: {"lr": 4.0, "batch_size": 250, "b0_factor": 4}, 0.5: {"lr": 4.0, "batch_size": 250, "b0_factor": 4}},
    "DP-GD": {0.2: {"lr": 100.0}, 0.5: {"lr": 100.0}},
    "DP-AGD": {0.2: {"max_step": 2.0}, 0.5: {"max_step": 10.0}},
    "RRPSGD": {0.2: {"lr": 4.0, "batch_size": 250}, 0.5: {"lr": 1.0, "batch_size": 50}},
    "STORM": {None: {"lr": 32.0, "batch_size": 250}},
}
#: What that tuning cost: runs (grid points × 3 tuning seeds) and wall seconds, measured with 2
#: worker processes on the 2-core machine while other jobs shared it. Not privacy-accounted.
TUNING_COST: dict[str, Any] = {
    "DP-SRM ε=0.2": {"runs": 144, "wall_time_s": 296.0}, "DP-SRM ε=0.5": {"runs": 144, "wall_time_s": 230.9},
    "DP-GD ε=0.2": {"runs": 18, "wall_time_s": 1.5}, "DP-GD ε=0.5": {"runs": 18, "wall_time_s": 1.1},
    "DP-AGD ε=0.2": {"runs": 21, "wall_time_s": 96.7}, "DP-AGD ε=0.5": {"runs": 21, "wall_time_s": 80.0},
    "RRPSGD ε=0.2": {"runs": 90, "wall_time_s": 165.3}, "RRPSGD ε=0.5": {"runs": 90, "wall_time_s": 228.5},
    "STORM": {"runs": 96, "wall_time_s": 55.0},
}

BUILDERS = {"DP-SRM": _dp_srm, "DP-GD": _dp_gd, "DP-AGD": _dp_agd, "RRPSGD": _rrpsgd, "STORM": _storm}


def methods(epsilon: float, key: None = None) -> list[Method]:
    return [Method(name, BUILDERS[name](epsilon), GRIDS[name], TUNED.get(name, {}), private=name != "STORM")
            for name in BUILDERS]

OURS = "DP-SRM"
METRICS = ("test_error", "objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s", "epsilon")


def problem(data_dir: str | None, key: None = None) -> tuple[Problem, dict[str, Any]]:
    """The ijcnn1 oracle, its test error, and facts for the report (majority-class error)."""
    data = load(DATASET, data_dir)
    oracle = NonconvexLogistic(torch.as_tensor(data.X_train), torch.as_tensor(data.y_train), reg=REG)
    X_test, y_test = torch.as_tensor(data.X_test), torch.as_tensor(data.y_test)
    facts = {"n": data.n, "dim": data.dim, "majority_class_test_error": data.majority_error(), "source": data.source}
    return Problem(oracle, lambda theta: oracle.error(theta, X_test, y_test)), facts


def notes(payload: dict[str, Any]) -> str:
    """What the reader must know to read the table, including every comparison DP-SRM did not win."""
    majority = payload["facts"]["majority_class_test_error"]
    lines = [
        f"* The majority-class classifier has test error {majority:.4f} on ijcnn1. Every test error in the paper's "
        "Table 1 (0.21–0.32, non-private STORM included) is above it, so the paper's errors cannot come from this "
        "test set with a sign classifier (perhaps another split or metric); ours are measured as described.",
        "* Passes are records visited / n (DP-SRM visits each batch once and evaluates two gradients on it). "
        "DP-AGD is stopped at 400 iterations (one full pass each, plus its line search) or when its zCDP budget is "
        "spent, whichever is first; the paper reports 346/365 passes.",
        "* Times are training only (sampling, steps, ledger), not the logged evaluations, per seed, one thread.",
    ]
    misses = [t for t in payload["t_tests"] if max(t["p_objective"], t["p_grad_norm"]) >= 0.05]
    wins = len(payload["t_tests"]) - len(misses)
    lines.append(f"* DP-SRM has a lower final objective AND gradient norm than the baseline with p < 0.05 in "
                 f"{wins} of {len(payload['t_tests'])} comparisons.")
    for t in misses:
        lines.append(f"* **Miss:** at ε = {t['epsilon']}, DP-SRM vs {t['baseline']}: p = {t['p_objective']:.3g} "
                     f"(objective), {t['p_grad_norm']:.3g} (gradient norm) — not significant at 0.05 on every metric. "
                     + (_RRPSGD_MISS if t["baseline"] == "RRPSGD" else ""))
    return "\n".join(lines)


_RRPSGD_MISS = ("RRPSGD outputs the iterate of a uniformly random round, so its final objective varies widely "
                "between seeds (see its std); with this many seeds a one-sided Welch test has little power against "
                "that spread. Its grid optimum was not at a grid edge; we did not retune against the result.")


PRESET = Experiment(
    NAME=NAME, EPSILONS=EPSILONS, PAPER=PAPER, METRICS=METRICS,
    TABLE_METRICS=("test_error", "objective", "grad_norm", "passes", "cpu_time_s"),
    PAPER_METRICS=("test_error", "grad_norm", "passes"), TEST_METRICS=("objective", "grad_norm"),
    COMPARISONS=[(OURS, "DP-AGD"), (OURS, "DP-GD"), (OURS, "RRPSGD")], epochs=0,
    make_problem=lambda key, data_dir: problem(data_dir, key), make_methods=lambda key, epochs, tuned, eps: methods(eps),
    delta_of=lambda key: DELTA, describe=notes,
    CURVES={"objective": "objective", "gradient norm": "grad_norm"}, TUNING_COST=TUNING_COST, TUNING_SEEDS=TUNING_SEEDS)
