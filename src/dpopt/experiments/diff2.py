"""Seed 003 (Murata & Suzuki 2023, §6 and appendix A): DIFF2-GD against DP-GD across P = 10
clients, presets ``diff2-regression`` and ``diff2-classification``.

Problems: the one-hidden-layer MLP (10 softplus units; squared loss, or cross-entropy for
classification) on California Housing, Gas Turbine CO (NOx removed) and BlogFeedback, and on
KDDCup99 (10 %) for classification (Cover Type is not available offline: see
shared/data/README.md). Data prepared as the paper does (:func:`dpopt.data.tabular.prepared`);
an i.i.d. equal split into P = 10 clients (:class:`dpopt.sampling.Clients`; the n mod 10
left-over training records are unused).

Methods (R = 2,000 rounds each; final metrics at the last iterate x_R, as the paper's curves):

* GD: the non-private reference (DIFF2 with T = 1, noise 0, no clipping, which is GD).
* DP-GD: DIFF2 with T = 1 (exactly DP-GD on the clients' records), clip C1.
* DIFF2-GD: C1, C2, T; z1 : z2 split as the paper's Proposition 4.1 with u = 1.25.

DIFF2-BVR-L-SGD (not in the paper's experiments) is NOT a line of these presets: its local steps
sample without replacement, which dp_accounting accounts only by RDP, and calibrating that event
for R = 2,000 rounds takes minutes per (method, ε) here (> 2 min for R = 500).

ε ∈ {3, 5}, δ = 1e−5, record-level replace-one privacy of each client's data set (PLD, or RDP
where local steps sample without replacement). Noise is calibrated jointly by the ledger. GD's
runs do not depend on the seed (no noise, every record every round, last iterate): it is run once.

Tuning: :func:`dpopt.experiments.patience_tuning.patience_tune` (the paper's procedure: η = 0.5^i
from large to small, the first that completes 2,000 rounds under the NaN / patience-5 / 1.05×
rule checked every 20 rounds; the grid point with the lowest final train loss wins), on one
tuning seed, **once per problem at ε = 3** (``TUNE_EPSILON``; the choice is used at ε = 5 too),
on a sub-grid of the paper's (the paper: C1, C2 ∈ {1, 3, 10, 30, 100}, T ∈ {6, 20, 60, 200},
100 DIFF2-GD points per problem and ε; here C1 ∈ {1, 3, 10}, C2 ∈ {3, 10, 30}, T ∈ {20, 60, 200}
and DP-GD's C1 ∈ {1, 3, 10}: per-record gradient norms at the initial point are 3.4–4.1 at the
median and 10–20 at the 99th percentile, so C1 ≥ 30 clips almost nothing and only adds noise).
BlogFeedback (a 2,000-round run costs ~2 min here) is tuned on η only, at the clip and restart
values chosen on California Housing. The values found are recorded in ``TUNED`` with their cost
(``TUNING_COST``); ``dpopt reproduce diff2-regression --retune`` searches again. The privacy of
tuning is not accounted by the paper; ``--retune`` reports it (``epsilon_composed``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..algorithms import DIFF2
from ..algorithms.diff2 import paper_ratios
from ..data import load
from ..data.tabular import prepared
from ..models import mlp_oracle
from ..sampling import Clients
from ..train import History
from ._runner import Method, Params, Problem
from .patience_tuning import patience_tune
from .preset import Experiment

EPSILONS = (3.0, 5.0)
DELTA = 1e-5
ROUNDS = 2_000
SEEDS = 5  # the paper's
CLIENTS = 10
U = 1.25
REGRESSION = ("california_housing", "gas_turbine", "blogfeedback")
CLASSIFICATION = ("kddcup99",)
#: The grids searched here (a sub-grid of the paper's, for compute: see the module docstring).
GRIDS = {"GD": {"clip": (math.inf,)}, "DP-GD": {"clip": (1.0, 3.0, 10.0)},
         "DIFF2-GD": {"clip": (1.0, 3.0, 10.0), "clip_diff": (3.0, 10.0, 30.0), "restart": (20, 60, 200)}}
#: ε at which each method is tuned once per problem; the choice is used at every ε.
TUNE_EPSILON = 3.0
#: Settings of a problem without TUNED values (the ``--quick`` subsets, KDDCup99): a middle point
#: of the grids with a step size that completes on every problem (not tuned).
DEFAULTS: dict[str, Params] = {
    "GD": {"clip": math.inf, "lr": 0.25}, "DP-GD": {"clip": 3.0, "lr": 0.125},
    "DIFF2-GD": {"clip": 1.0, "clip_diff": 3.0, "restart": 20, "lr": 0.125},
}
#: Problem → the problem whose tuned clip and restart values it uses (only η is searched on it).
TRANSFERRED = {"blogfeedback": "california_housing"}
#: Chosen by the tuning described in the module docstring (reproduce it with ``--retune``).
TUNED: dict[str, dict[str, Params]] = {
    "california_housing": {"GD": {"clip": math.inf, "lr": 0.25}, "DP-GD": {"clip": 3.0, "lr": 0.25},
                           "DIFF2-GD": {"clip": 1.0, "clip_diff": 10.0, "restart": 60, "lr": 0.125}},
    "gas_turbine": {"GD": {"clip": math.inf, "lr": 0.25}, "DP-GD": {"clip": 1.0, "lr": 0.125},
                    "DIFF2-GD": {"clip": 1.0, "clip_diff": 10.0, "restart": 20, "lr": 0.125}},
    "blogfeedback": {"GD": {"clip": math.inf, "lr": 0.125}, "DP-GD": {"clip": 3.0, "lr": 0.015625},
                     "DIFF2-GD": {"clip": 1.0, "clip_diff": 10.0, "restart": 60, "lr": 0.0625}},
}
#: What that tuning cost (2026-11-22, this 2-core machine shared with other jobs: wall times are
#: inflated). ``epsilon_composed``: ε(δ = 1e−5) of all the method's tuning runs composed, which
#: the paper does not account.
TUNING_COST: dict[str, Any] = {
    "california_housing GD ε=None": {"runs": 3, "rounds": 2040, "wall_time_s": 34, "epsilon_composed": 0.0},
    "california_housing DP-GD ε=3.0": {"runs": 13, "rounds": 11400, "wall_time_s": 172, "epsilon_composed": 8.27},
    "california_housing DIFF2-GD ε=3.0": {"runs": 170, "rounds": 76980, "wall_time_s": 1385,
                                          "epsilon_composed": 29.23},
    "gas_turbine GD ε=None": {"runs": 3, "rounds": 2040, "wall_time_s": 66, "epsilon_composed": 0.0},
    "gas_turbine DP-GD ε=3.0": {"runs": 16, "rounds": 14420, "wall_time_s": 351, "epsilon_composed": 9.55},
    "gas_turbine DIFF2-GD ε=3.0": {"runs": 186, "rounds": 86980, "wall_time_s": 2778, "epsilon_composed": 31.65},
    "blogfeedback GD ε=None": {"runs": 4, "rounds": 2060, "wall_time_s": 250, "epsilon_composed": 0.0},
    "blogfeedback DP-GD ε=3.0": {"runs": 7, "rounds": 6880, "wall_time_s": 876, "epsilon_composed": 6.11},
    "blogfeedback DIFF2-GD ε=3.0": {"runs": 5, "rounds": 2460, "wall_time_s": 357, "epsilon_composed": 3.41},
}
METRICS = ("objective", "min_objective", "grad_norm", "grad_norm_sq", "test_loss", "test_error", "passes",
           "wall_time_s", "epsilon")
TABLE_METRICS = ("objective", "grad_norm_sq", "test_loss", "min_objective", "epsilon", "wall_time_s")
#: ``min_objective`` (the lowest logged train loss of a run) is the paper's t-test; the issue's
#: acceptance comparison is the final value, ``objective``.
TEST_METRICS = ("objective", "grad_norm_sq", "test_loss", "min_objective")
COMPARISONS = [("DIFF2-GD", "DP-GD")]
LOG_POINTS = 40  # every 50 rounds (the tuner checks every 20)


def build_problem(key: str, data_dir: str | None) -> tuple[Problem, dict[str, Any]]:
    """Problem ``name`` or ``name:k`` (its first k training records: the smoke version)."""
    name, _, subset = key.partition(":")
    data = prepared(load(name, data_dir))
    X, y = data.X_train, data.y_train
    if subset:
        X, y = X[: int(subset)], y[: int(subset)]
    classes = int(max(data.y_train.max(), data.y_test.max())) + 1 if data.task == "multiclass" else None
    oracle = mlp_oracle(X, y, classes=classes)
    test = mlp_oracle(data.X_test, data.y_test, classes=classes)

    def test_error(theta: torch.Tensor) -> float:
        return float(test.loss(theta)) if classes is None else oracle.error(theta, test.X, test.y)

    def extra(theta: torch.Tensor) -> dict[str, float]:
        return {"grad_norm_sq": float(oracle.gradient(theta).norm()) ** 2, "test_loss": float(test.loss(theta))}

    facts = {"n": oracle.n, "n_test": test.n, "dim": oracle.dim, "features": int(X.shape[1]), "task": data.task,
             "clients": CLIENTS, "records_per_client": oracle.n // CLIENTS}
    return Problem(oracle, test_error, extra, history_metrics=lowest_loss, theta0=oracle.flat_params()), facts


def lowest_loss(history: History) -> dict[str, float]:
    """The lowest train loss over the run's logged points (every ``ROUNDS // LOG_POINTS``
    rounds and the last), which the paper's t-tests compare."""
    return {"min_objective": min(record["objective"] for record in history.records)}


def _builder(name: str) -> Callable[[int, Params], tuple[Any, int]]:
    def build(n: int, p: Params) -> tuple[Any, int]:
        clients = Clients(n, CLIENTS)
        if name in ("GD", "DP-GD"):
            z = 0.0 if name == "GD" else 1.0
            return DIFF2(lr=p["lr"], clip=p["clip"], clip_diff=1.0, restart=1, noise_multiplier1=z, noise_multiplier2=z,
                         clients=clients, output_rule="last"), ROUNDS
        return DIFF2(lr=p["lr"], clip=p["clip"], clip_diff=p["clip_diff"], restart=p["restart"],
                     noise_multiplier1=1.0, noise_multiplier2=1.0, clients=clients, output_rule="last",
                     noise_ratios=paper_ratios(ROUNDS, p["restart"], U)), ROUNDS
    return build


def build_methods(key: str, rounds: int, tuned: dict[str, Params], epsilon: float) -> list[Method]:
    """GD (non-private), DP-GD and DIFF2-GD with ``tuned`` or ``DEFAULTS``."""
    methods = []
    for name in GRIDS:
        chosen = tuned.get(name, DEFAULTS[name])
        private = name != "GD"
        methods.append(Method(name, _builder(name), grid(key, name), {epsilon if private else None: chosen},
                              private=private, tuner=patience_tune, deterministic=not private))
    return methods


def grid(key: str, name: str) -> dict[str, tuple[Any, ...]]:
    """The grid of method ``name`` on problem ``key``: ``GRIDS``, or for a problem in
    ``TRANSFERRED`` the one point chosen on its source problem (only η is searched)."""
    source = TRANSFERRED.get(key)
    if source is None:
        return GRIDS[name]
    return {field: (value,) for field, value in TUNED[source][name].items() if field != "lr"}


def verdicts(payload: dict[str, Any]) -> list[str]:
    """Per problem and ε: does DIFF2-GD beat DP-GD on final train loss (one-sided p < 0.05)?"""
    lines = []
    rows = {(row.get("problem"), row["algorithm"], row["epsilon"]): row for row in payload["rows"]}
    for test in payload["t_tests"]:
        if (test["ours"], test["baseline"]) != ("DIFF2-GD", "DP-GD"):
            continue
        problem, epsilon = test.get("problem"), test["epsilon"]
        ours = rows[(problem, "DIFF2-GD", epsilon)]["metrics"]["objective"]
        theirs = rows[(problem, "DP-GD", epsilon)]["metrics"]["objective"]
        beats = test["p_objective"] < 0.05
        lines.append(f"- {problem}, ε = {epsilon:g}: DIFF2-GD train loss {ours['mean']:.5g} ± {ours['std']:.2g} vs "
                     f"DP-GD {theirs['mean']:.5g} ± {theirs['std']:.2g}, p = {test['p_objective']:.3g}: "
                     f"{'DIFF2-GD beats DP-GD' if beats else 'DIFF2-GD does NOT beat DP-GD significantly'}.")
    return lines


def _notes(payload: dict[str, Any]) -> str:
    retuned = any("scores" in entry for entry in payload["tuning"].values())
    tuned = ("tuned by `--retune` in this run" if retuned else
             "the preset's TUNED values (the tuning recorded in `dpopt.experiments.diff2`; DEFAULTS where a problem "
             "has none)")
    lines = [
        "Verdicts (the acceptance comparison, final train loss, one-sided Welch t-test):", "",
        *verdicts(payload), "",
        "`p_min_objective`: the same test on each run's lowest logged train loss (every "
        f"{ROUNDS // LOG_POINTS} rounds), the quantity the paper's t-tests compare; the issue asks for the final value.",
        f"Hyper-parameters: {tuned}. Tuning as the paper (the patience rule) on one seed, once per problem at "
        f"ε = {TUNE_EPSILON:g} (used at every ε), on a sub-grid of the paper's; BlogFeedback: η only, at the "
        "clip and restart values chosen on California Housing. The paper did not account for the privacy of "
        "tuning; the cost below gives it as `epsilon_composed` (plain composition of every tuning run).",
        "Privacy: record-level, replace-one, for each client's data set (n_min = records per client); the "
        "noise multipliers z1 : z2 follow the paper's Proposition 4.1 split (u = 1.25) and are scaled jointly "
        "by the accountant (not by the paper's closed-form σ formula).",
        "Model initialisation U[−1/√w_in, 1/√w_in] (the paper's text reads √w_in; see dpopt.models.mlp), one "
        "fixed initialisation (seed 0) for all seeds; seeds vary the noise.",
        "x-axis of the figures: data passes = rounds (each round uses every client's records once). "
        "`test_error` is the test loss for regression, the classification error otherwise.",
    ]
    return "\n".join(lines)


def delta(key: str) -> float:
    return DELTA


def _preset(name: str, problems: tuple[str, ...], smoke: tuple[str, ...], cost: dict[str, Any]) -> Experiment:
    curves = {"train loss": "objective", "squared train gradient norm": "grad_norm_sq",
              "test loss / error": "test_error"}
    return Experiment(
        NAME=name, PROBLEMS=problems, EPSILONS=EPSILONS, PAPER=[], METRICS=METRICS, TABLE_METRICS=TABLE_METRICS,
        PAPER_METRICS=(), TEST_METRICS=TEST_METRICS, COMPARISONS=COMPARISONS, epochs=ROUNDS,
        make_problem=build_problem, make_methods=build_methods, delta_of=delta, describe=_notes, CURVES=curves,
        TUNED=TUNED, TUNING_COST=cost, TUNING_SEEDS=(1000,), TUNE_EPSILON=TUNE_EPSILON, SMOKE_PROBLEMS=smoke,
        LOG_POINTS=LOG_POINTS, SEEDS=SEEDS)


REGRESSION_PRESET = _preset("diff2-regression", REGRESSION, ("california_housing:2000",), TUNING_COST)
CLASSIFICATION_PRESET = _preset("diff2-classification", CLASSIFICATION, ("kddcup99:2000",), {})
