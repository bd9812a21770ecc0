"""Seed 004 (Kornowski, Liu, Talwar): DP-O2NC on nonsmooth nonconvex losses. **The paper has no
experiments**: these are ours, designed to test its claims.

Problems (ε = 1, δ = 1e−5, one pass over n = 8,000 training records for the O2NC methods):

* ``ijcnn1-relu``: a ReLU network 22 → 8 → 1 with the hinge loss max(0, 1 − y·out) on the first
  8,000 records of ijcnn1 (a fixed random order); test error on the first 5,000 test records;
* ``synthetic-d{8,32,128,512}``: robust regression with the truncated absolute loss
  min(|⟨x, θ⟩ − y|, 2) (nonsmooth, nonconvex, 1-Lipschitz per record: ‖x_i‖ = 1), y = ⟨x, w*⟩ +
  0.1·N(0, 1), ‖w*‖ = √d (unit-variance margins at every d), 10 % of labels replaced by ±5.

Methods, all from the theorems' settings with every hidden constant 1
(:mod:`dpopt.algorithms.o2nc_params`; L = 1, Φ = 2 (synthetic: F ≥ 0 and F(0) ≤ 2) or 1 (hinge
at θ0 ≈ 0), α = 0.05):

* "O2NC-ZO (ours)": Theorem 3.1, zeroth order, m = min(d²Σ² + dα²/D², 2048) directions (the
  theorem's m is O(d²Σ²): 10⁵–10⁹ here, so it is capped for compute);
* "Zhang et al. 2024": the same with m = d (their d^{3/2} sample complexity);
* "O2NC-FO (ours)": Theorem 6.1, first order;
* "DP-SGD": Poisson batches of 64, per-record clip 1, 5 epochs, step size tuned on
  {0.03, 0.1, 0.3, 1} (tuning seeds 1000, 1001, not privacy-accounted).

Metrics at each output θ: ``goldstein``, the estimate of ‖∂̄_{2α} F(θ)‖ (Lemma 2.4: a point
(α, β)-stationary for F_α is (2α, β)-stationary for F) from K = 32 full-data gradients
(:func:`dpopt.metrics.goldstein`, seed 0); ``function_evals`` and ``gradient_evals``, the
per-record oracle calls of the run; ``clip_rate``, how often an O2NC clip bit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import report
from ..algorithms import DPSGD
from ..algorithms import o2nc_params as params
from ..data import load
from ..metrics import goldstein
from ..oracles import TorchModel, TruncatedAbsolute
from ._runner import Method, Params, Problem

NAME = "o2nc-nonsmooth"
EPSILONS = (1.0,)
DELTA = 1e-5
DIMS = (8, 32, 128, 512)
PROBLEMS = ("ijcnn1-relu",) + tuple(f"synthetic-d{d}" for d in DIMS)
SMOKE_PROBLEMS = ("synthetic-d8-n2000",)  # --quick: the d = 8 problem on 2,000 records
N_TRAIN = 8000
N_TEST = 5000
ALPHA = 0.05
MAX_DIRECTIONS = 2048
GOLDSTEIN_POINTS = 32
DPSGD_EPOCHS, DPSGD_BATCH = 5, 64
PAPER: list[dict[str, Any]] = []  # the paper has no experiments
OURS = "O2NC-ZO (ours)"
ZHANG = "Zhang et al. 2024"
FIRST = "O2NC-FO (ours)"
COMPARISONS = [(OURS, ZHANG), (OURS, "DP-SGD"), (FIRST, "DP-SGD"), (FIRST, ZHANG)]
METRICS = ("goldstein", "objective", "test_error", "function_evals", "gradient_evals", "clip_rate", "epsilon",
           "passes", "wall_time_s")
TABLE_METRICS = ("goldstein", "objective", "test_error", "function_evals", "gradient_evals", "clip_rate", "epsilon",
                 "wall_time_s")
PAPER_METRICS: tuple[str, ...] = ()
TEST_METRICS = ("goldstein", "objective")
CURVES = {"training objective": "objective"}
TUNING_SEEDS = (1000, 1001)
TUNING_COST: dict[str, Any] = {}
LOG_POINTS = 20


def problems(quick: bool) -> tuple[str, ...]:
    return SMOKE_PROBLEMS if quick else PROBLEMS


class Counted:
    """An oracle that counts per-record oracle calls: function values (``losses_at``) and gradients
    (``gradients_at``, ``per_record``); :meth:`take` returns the counts and resets them."""

    def __init__(self, oracle: Any) -> None:
        self.oracle = oracle
        self.calls = {"function_evals": 0, "gradient_evals": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.oracle, name)

    def losses_at(self, points: Tensor, indices: Tensor) -> Tensor:
        self.calls["function_evals"] += points.shape[0] * points.shape[1]
        return self.oracle.losses_at(points, indices)

    def gradients_at(self, points: Tensor, indices: Tensor) -> Tensor:
        self.calls["gradient_evals"] += points.shape[0] * points.shape[1]
        return self.oracle.gradients_at(points, indices)

    def per_record(self, theta: Tensor, indices: Tensor) -> Any:
        self.calls["gradient_evals"] += len(indices)
        return self.oracle.per_record(theta, indices)

    def take(self) -> dict[str, float]:
        calls = {key: float(value) for key, value in self.calls.items()}
        self.calls = dict.fromkeys(self.calls, 0)
        return calls


def synthetic(d: int, n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(X, y, X_test, y_test) of the robust-regression family (module docstring)."""
    rng = np.random.default_rng(seed + d)
    X = rng.standard_normal((n + N_TEST, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    w = rng.standard_normal(d)
    w *= math.sqrt(d) / np.linalg.norm(w)
    y = X @ w + 0.1 * rng.standard_normal(n + N_TEST)
    outliers = rng.random(n + N_TEST) < 0.1
    y[outliers] = rng.choice([-5.0, 5.0], size=int(outliers.sum()))
    return X[:n], y[:n], X[n:], y[n:]


def hinge(out: Tensor, y: Tensor) -> Tensor:
    return torch.relu(1 - y * out.squeeze(-1))


def problem(data_dir: str | None, key: str) -> tuple[Problem, dict[str, Any]]:
    if key == "ijcnn1-relu":
        data = load("ijcnn1", data_dir)
        order = np.random.default_rng(0).permutation(len(data.X_train))[:N_TRAIN]
        X, y = torch.as_tensor(data.X_train[order]), torch.as_tensor(data.y_train[order])
        X_test, y_test = torch.as_tensor(data.X_test[:N_TEST]), torch.as_tensor(data.y_test[:N_TEST])
        torch.manual_seed(0)  # the network's initialisation (θ0 is what every method starts from)
        module = nn.Sequential(nn.Linear(X.shape[1], 8), nn.ReLU(), nn.Linear(8, 1)).double()
        base = TorchModel(module, hinge, X, y, engine="vmap")
        theta0, phi = base.flat_params(), 1.0
    else:
        d, n = _synthetic_key(key)
        X_np, y_np, Xt_np, yt_np = synthetic(d, n)
        X, y, X_test, y_test = (torch.as_tensor(a) for a in (X_np, y_np, Xt_np, yt_np))
        base = TruncatedAbsolute(X, y, cap=2.0)
        theta0, phi = None, 2.0
    oracle = Counted(base)

    def extra(theta: Tensor) -> dict[str, float]:
        stationarity = goldstein(base, theta, 2 * ALPHA, points=GOLDSTEIN_POINTS, seed=0)
        return {"goldstein": stationarity.value, **oracle.take()}

    facts = {"n": base.n, "d": base.dim, "phi": phi, "alpha": ALPHA, "goldstein_points": GOLDSTEIN_POINTS,
             "goldstein_seed": 0}
    return Problem(oracle, lambda theta: base.error(theta, X_test, y_test), extra, theta0=theta0), facts


def methods(epsilon: float, key: str) -> list[Method]:
    phi = 1.0 if key == "ijcnn1-relu" else 2.0
    settings = {"epsilon": epsilon, "delta": DELTA, "alpha": ALPHA, "lipschitz": 1.0, "phi": phi}
    caps = params.Constants(max_directions=MAX_DIRECTIONS)

    def o2nc(kind: str) -> Any:
        def build(n: int, p: Params) -> tuple[Any, int]:
            d = p["d"]
            if kind == "zhang":
                return params.zhang2024(n=n, d=d, constants=caps, **settings)
            return params.single_pass(n=n, d=d, estimator=kind, constants=caps, **settings)
        return build

    def dpsgd(n: int, p: Params) -> tuple[Any, int]:
        algo = DPSGD(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=DPSGD_BATCH)
        return algo, DPSGD_EPOCHS * n // DPSGD_BATCH

    dim = {"d": _dimension(key)}
    return [
        Method(OURS, o2nc("zeroth"), {}, {epsilon: dim}),
        Method(ZHANG, o2nc("zhang"), {}, {epsilon: dim}),
        Method(FIRST, o2nc("first"), {}, {epsilon: dim}),
        Method("DP-SGD", dpsgd, {"lr": (0.03, 0.1, 0.3, 1.0)}),
    ]


def _synthetic_key(key: str) -> tuple[int, int]:
    """(d, n) of "synthetic-d{d}" (n = N_TRAIN) or "synthetic-d{d}-n{n}"."""
    d, _, n = key.removeprefix("synthetic-d").partition("-n")
    return int(d), int(n) if n else N_TRAIN


def _dimension(key: str) -> int:
    if key == "ijcnn1-relu":
        return 22 * 8 + 8 + 8 + 1
    return _synthetic_key(key)[0]


def _cell(row: dict[str, Any], metric: str) -> str:
    value = row["metrics"][metric]
    return f"{value['mean']:.4g} ({value['std']:.2g})"


def _rows(payload: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["problem"], row["algorithm"]): row for row in payload["rows"]}


def notes(payload: dict[str, Any]) -> str:
    rows = _rows(payload)
    keys = [key for key in problems(payload["quick"]) if (key, OURS) in rows]
    lines = ["The paper (Kornowski, Liu, Talwar) reports no experiments: every number here is ours.", "",
             "Goldstein stationarity ‖∂̄_{2α}F‖ at the output, mean (std) over seeds, and the ratio "
             "Zhang et al. / ours (> 1: ours is more stationary):", ""]
    table = []
    for key in keys:
        ours, zhang, first, sgd = (rows[(key, name)] for name in (OURS, ZHANG, FIRST, "DP-SGD"))
        ratio = zhang["metrics"]["goldstein"]["mean"] / ours["metrics"]["goldstein"]["mean"]
        table.append({"problem": key, OURS: _cell(ours, "goldstein"), ZHANG: _cell(zhang, "goldstein"),
                      "Zhang/ours": ratio, FIRST: _cell(first, "goldstein"), "DP-SGD": _cell(sgd, "goldstein"),
                      "ZO calls (ours)": ours["metrics"]["function_evals"]["mean"],
                      "FO calls (ours)": first["metrics"]["gradient_evals"]["mean"],
                      "clip rate ZO/Zhang/FO": "/".join(f"{rows[(key, m)]['metrics']['clip_rate']['mean']:.3f}"
                                                        for m in (OURS, ZHANG, FIRST))})
    lines += [report.markdown_table(table, list(table[0]) if table else []), ""]
    verdicts = {(test.get("problem"), test["ours"], test["baseline"]): test["p_goldstein"]
                for test in payload["t_tests"]}
    for key in keys:
        said = [f"{ours} < {base}: p = {verdicts[(key, ours, base)]:.3g}" for ours, base in COMPARISONS
                if (key, ours, base) in verdicts]
        lines.append(f"* {key}: one-sided Welch tests on Goldstein stationarity: " + "; ".join(said) + ".")
    lines += ["", "The theorems' m (zeroth order) is d²Σ² + dα²/D², far beyond any budget here; it is capped at "
              f"{MAX_DIRECTIONS}, so the per-record clip of ours is d·L·√(log(dB/δ)/m) rather than the "
              "theorem's O(L): the √d advantage over Zhang et al. (m = d) shrinks to √(m/d) at this cap, "
              "and vanishes at d = m. The O2NC step sizes and radii are the theorems' (constants 1), "
              "untuned; DP-SGD's step size is tuned."]
    return "\n".join(lines)


def figures(out_dir: Path, payload: dict[str, Any]) -> None:
    """``goldstein_vs_d.png``: stationarity of each method against the dimension (synthetic family)."""
    rows = _rows(payload)
    keys = [key for key in problems(payload["quick"]) if key.startswith("synthetic") and (key, OURS) in rows]
    if not keys:
        return
    dims = np.array([_dimension(key) for key in keys], dtype=float)
    lines = {name: (dims, np.array([rows[(key, name)]["metrics"]["goldstein"]["mean"] for key in keys]))
             for name in (OURS, ZHANG, FIRST, "DP-SGD")}
    report.curves_figure(out_dir / "goldstein_vs_d.png", {"Goldstein stationarity at ε = 1": lines},
                         xlabel="dimension d", log_x=True)
