"""Seed 004 (Kornowski, Liu, Talwar): DP-O2NC on nonsmooth nonconvex losses. **The paper has no
experiments**: these are ours, designed to test its claims.

Problems (ε = 1, δ = 1e−5, one pass over n = 4,000 training records for the O2NC methods):

* ``ijcnn1-relu``: a ReLU network 22 → 8 → 1 with the hinge loss max(0, 1 − y·out) on the first
  4,000 records of ijcnn1 (a fixed random order); test error on the first 5,000 test records;
* ``synthetic-d{8,32,128,512}``: robust regression with the truncated absolute loss
  min(|⟨x, θ⟩ − y|, 2) (nonsmooth, nonconvex, 1-Lipschitz per record: ‖x_i‖ = 1), y = ⟨x, w*⟩ +
  0.1·N(0, 1), ‖w*‖ = √d (unit-variance margins at every d), 10 % of labels replaced by ±5.

Methods, from the theorems' settings (:mod:`dpopt.algorithms.o2nc_params`; L = 1, Φ = 2
(synthetic: F ≥ 0 and F(0) ≤ 2) or 1 (hinge at θ0 ≈ 0), α = 0.05):

* "O2NC-ZO (ours)": Theorem 3.1, zeroth order, m = min(d²Σ² + dα²/D², 1024) directions (the
  theorem's m is O(d²Σ²): 10⁵–10⁹ here, so it is capped for compute);
* "Zhang et al. 2024": the same with m = d (their d^{3/2} sample complexity);
* "O2NC-FO (ours)": Theorem 6.1, first order;
* "DP-SGD": Poisson batches of 64, per-record clip 1, 5 epochs, step size tuned on
  {0.03, 0.1, 0.3, 1} per problem (tuning seeds 1000, 1001, not privacy-accounted).

The theorems hide constants (Θ̃, ≲). Two of them are chosen, for the three O2NC methods alike:
c_D, a multiplier of the radius D (M, Σ, η and the clip C2 follow D), and c, the constant of the
clips' concentration term (:func:`~dpopt.algorithms.o2nc_params.clips`), on the grid of
``presets/o2nc-nonsmooth.toml`` by :func:`select_constants` (every point on the tuning seeds 1000,
1001 of ``synthetic-d32``, lowest mean final training objective; not privacy-accounted) and then
used on every problem (the file's ``tuned``; a constant does not depend on d). Privacy stays exact
whatever the constants: the clips are what the algorithm uses, and the noise is calibrated by the
ledger for them.

Metrics at each output θ: ``goldstein``, the estimate of ‖∂̄_{2α} F(θ)‖ (Lemma 2.4: a point
(α, β)-stationary for F_α is (2α, β)-stationary for F) from K = 32 full-data gradients
(:func:`dpopt.metrics.goldstein`, seed 0), also at 12 log points of every run (the iterate θ_t),
with the per-record oracle calls spent so far (``function_evals`` for zeroth order,
``gradient_evals`` otherwise, ``oracle_calls`` their sum) for (c), calls to a common threshold
(:func:`threshold`, :func:`calls_to_reach`); ``clip_rate``, how often an O2NC clip bit.

Sizes, chosen so that the full run (5 seeds) takes under 30 min on 2 shared cores: n = 4,000
(was 8,000), m ≤ 1,024 (was 2,048), 12 log points, after the estimator was made ~3× faster
(float32 Gaussian draws, no [B, 2m, d] point tensor for GLMs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .. import report
from ..algorithms import DPSGD
from ..algorithms import o2nc_params as params
from ..algorithms.o2nc import O2NC
from ..base import AlongDirections, PerRecord
from ..data import load
from ..data.bounds import Preparation
from ..json_types import JsonObject
from ..metrics import goldstein
from ..oracles import TorchModel, TruncatedAbsolute
from ..train import History
from . import declared
from ._runner import Method, Params, Problem, mean_curve
from .declared import Settings, number, text
from .payload import Payload, ProblemKey, Row, Tuned, named, problem_facts
from ..jobs.preparation import SYNTHETIC, registered
from .preset import Build, declared_experiment, declared_methods

DATA = declared.load("o2nc-nonsmooth")
NAME = DATA["name"]
DELTA = DATA["delta"]
N_TRAIN, N_TEST, ALPHA = DATA.parameter("n_train"), DATA.parameter("n_test"), DATA.parameter("alpha")
MAX_DIRECTIONS, GOLDSTEIN_POINTS = DATA.parameter("max_directions"), DATA.parameter("goldstein_points")
TUNING_PROBLEM, REACH_FRACTION = DATA.parameter("tuning_problem"), DATA.parameter("reach_fraction")
#: The method names (the file's order): ours zeroth order, Zhang et al., ours first order; then DP-SGD.
OURS, ZHANG, FIRST = O2NC_METHODS = tuple(name for name in DATA["methods"] if name != "DP-SGD")


class Counted:
    """An oracle that counts per-record oracle calls: function values (``losses_at``,
    ``losses_along``: 2m per record) and gradients (``gradients_at``, ``per_record``); :meth:`take`
    returns the counts and resets them, :attr:`calls` holds them so far."""

    def __init__(self, oracle: TorchModel | TruncatedAbsolute) -> None:
        self.oracle = oracle
        self.calls = {"function_evals": 0, "gradient_evals": 0}

    def __getattr__(self, name: str) -> object:
        return getattr(self.oracle, name)

    def losses_at(self, points: Tensor, indices: Tensor) -> Tensor:
        self.calls["function_evals"] += points.shape[0] * points.shape[1]
        return self.oracle.losses_at(points, indices)

    def gradients_at(self, points: Tensor, indices: Tensor) -> Tensor:
        self.calls["gradient_evals"] += points.shape[0] * points.shape[1]
        return self.oracle.gradients_at(points, indices)

    def per_record(self, theta: Tensor, indices: Tensor) -> PerRecord:
        self.calls["gradient_evals"] += len(indices)
        return self.oracle.per_record(theta, indices)

    def take(self) -> dict[str, float]:
        calls = {key: float(value) for key, value in self.calls.items()}
        self.calls = dict.fromkeys(self.calls, 0)
        return calls


class CountedAlong(Counted):
    """A :class:`Counted` oracle with the two-point fast path (:class:`~dpopt.base.AlongDirections`,
    a GLM's; a network has none): its calls counted too."""

    def __init__(self, oracle: TruncatedAbsolute) -> None:
        super().__init__(oracle)
        self.along = oracle.losses_along

    def losses_along(self, x: Tensor, directions: Tensor, alpha: float, indices: Tensor) -> Tensor:
        self.calls["function_evals"] += 2 * directions.shape[0] * directions.shape[1]
        return self.along(x, directions, alpha, indices)


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


def preparation(key: ProblemKey) -> Preparation:
    """How problem ``key``'s data are prepared: ijcnn1's registered public preparation (LIBSVM's
    scaling into [-1, 1]: nothing to do), or none for the synthetic family."""
    return registered("ijcnn1") if key == "ijcnn1-relu" else SYNTHETIC


def problem(key: ProblemKey, data_dir: str | None) -> tuple[Problem, JsonObject]:
    """The hinge network on ijcnn1 or a synthetic robust regression, its oracle counted (:class:`Counted`),
    and facts for the report (the Goldstein stationarity at θ0 among them)."""
    key = named(key)
    base: TorchModel | TruncatedAbsolute
    if key == "ijcnn1-relu":
        data = preparation(key).prepare(load("ijcnn1", data_dir))
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
    oracle = CountedAlong(base) if isinstance(base, AlongDirections) else Counted(base)

    def stationarity(theta: Tensor) -> float:
        return goldstein(base, theta, 2 * ALPHA, points=GOLDSTEIN_POINTS, seed=0).value

    def logged(theta: Tensor) -> dict[str, float]:
        """Goldstein stationarity of θ_t and the per-record oracle calls so far (not reset)."""
        calls = {key: float(value) for key, value in oracle.calls.items()}
        return {"goldstein": stationarity(theta), **calls, "oracle_calls": sum(calls.values())}

    start = torch.zeros(base.dim, dtype=torch.float64) if theta0 is None else theta0
    facts: JsonObject = {"n": base.n, "d": base.dim, "phi": phi, "alpha": ALPHA, "goldstein_points": GOLDSTEIN_POINTS,
                         "goldstein_seed": 0, "goldstein_start": stationarity(start)}
    return Problem(oracle, lambda theta: base.error(theta, X_test, y_test), lambda theta: oracle.take(),
                   theta0=theta0, log_metrics=logged), facts


def _o2nc(settings: Settings, epsilon: float, key: ProblemKey) -> Build[O2NC]:
    """O2NC with the theorems' settings (:mod:`dpopt.algorithms.o2nc_params`) for ``settings["estimator"]``:
    "zeroth" (Theorem 3.1), "first" (Theorem 6.1) or "zhang" (Zhang et al. 2024, m = d); L = 1, Φ = 1 on
    the hinge network, 2 on the synthetic family; the grid's constants c_D and c."""
    d, phi = _dimension(named(key)), 1.0 if key == "ijcnn1-relu" else 2.0
    estimator = text(settings["estimator"], "estimator")

    def build(n: int, p: Params) -> tuple[O2NC, int]:
        constants = params.Constants(radius=p["c_D"], concentration=p["c"], max_directions=MAX_DIRECTIONS)
        if estimator == "zhang":
            return params.zhang2024(n=n, d=d, constants=constants, epsilon=epsilon, delta=DELTA, alpha=ALPHA,
                                    lipschitz=1.0, phi=phi)
        return params.single_pass(n=n, d=d, estimator=estimator, constants=constants, epsilon=epsilon, delta=DELTA,
                                  alpha=ALPHA, lipschitz=1.0, phi=phi)
    return build


def _dpsgd(settings: Settings, epsilon: float, key: ProblemKey) -> Build[DPSGD]:
    """DP-SGD with clip 1 at the settings' batch size, for their epochs."""
    batch_size, epochs = int(number(settings["batch_size"], "batch_size")), int(number(settings["epochs"], "epochs"))

    def build(n: int, p: Params) -> tuple[DPSGD, int]:
        algo = DPSGD(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=batch_size)
        return algo, epochs * n // batch_size
    return build


BUILDERS = {OURS: _o2nc, ZHANG: _o2nc, FIRST: _o2nc, "DP-SGD": _dpsgd}


def methods(epsilon: float, key: str) -> list[Method]:
    return PRESET.methods(epsilon, key)


def _synthetic_key(key: str) -> tuple[int, int]:
    """(d, n) of "synthetic-d{d}" (n = N_TRAIN) or "synthetic-d{d}-n{n}"."""
    d, _, n = key.removeprefix("synthetic-d").partition("-n")
    return int(d), int(n) if n else N_TRAIN


def _dimension(key: str) -> int:
    if key == "ijcnn1-relu":
        return 22 * 8 + 8 + 8 + 1
    return _synthetic_key(key)[0]


def select_constants(data_dir: str | None = None, workers: int = 2) -> dict[str, Tuned]:
    """Re-select the tuned constants: every point of its grid for each O2NC method on the
    ``tuning_problem`` and tuning seeds of the preset file, scored by
    :func:`~dpopt.experiments._runner.explore_grid` (mean final training objective), at ε = 1. Tuning
    is not privacy-accounted."""
    from ..jobs import Pool
    from ._runner import explore_grid
    from .reproduce import _problem_of

    problem_ = problem(TUNING_PROBLEM, data_dir)[0]
    pool = Pool(workers, _problem_of, NAME, data_dir) if workers > 1 else None
    try:
        return {method.name: explore_grid(method, problem_, epsilon=1.0, delta=DELTA, seeds=PRESET.TUNING_SEEDS,
                                          pool=pool, key=TUNING_PROBLEM)
                for method in methods(1.0, TUNING_PROBLEM) if method.name in O2NC_METHODS}
    finally:
        if pool is not None:
            pool.close()


def _cell(row: Row, metric: str) -> str:
    value = row["metrics"][metric]
    return f"{value['mean']:.4g} ({value['std']:.2g})"


def _rows(payload: Payload) -> dict[tuple[str, str], Row]:
    return {(named(row.get("problem")), row["algorithm"]): row for row in payload["rows"]}


def _histories(payload: Payload, key: str, name: str) -> list[History]:
    return next(h for (problem_, method, _), h in payload["_curves"].items() if problem_ == key and method == name)


def threshold(payload: Payload, key: str) -> float:
    """τ, the common Goldstein threshold of problem ``key``: the worst (largest) of the four
    methods' mean Goldstein stationarity of the last logged iterate θ_T — a level every method
    reaches on average by its end, so that "calls to reach τ" is defined for all of them."""
    return max(float(np.mean([h.records[-1]["goldstein"] for h in _histories(payload, key, name)]))
               for name in (*O2NC_METHODS, "DP-SGD"))


def calls_to_reach(histories: Sequence[History], tau: float, start: float) -> list[float]:
    """Per seed: the per-record oracle calls (function evaluations for zeroth order, gradients
    otherwise) spent when a logged iterate's Goldstein stationarity is first ≤ τ (0 if θ0 already
    is); NaN for a seed that never reaches τ."""
    reached = []
    for history in histories:
        calls = 0.0 if start <= tau else next(
            (record["oracle_calls"] for record in history.records if record["goldstein"] <= tau), math.nan)
        reached.append(calls)
    return reached


def slope(dims: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of log(values) against log(d)."""
    return float(np.polyfit(np.log(dims), np.log(values), 1)[0])


def _reach_lines(payload: Payload, keys: list[str]) -> list[str]:
    table = []
    for key in keys:
        start = _start(payload, key)
        thresholds = (("worst last", threshold(payload, key)), (f"{REACH_FRACTION:g} × θ0", REACH_FRACTION * start))
        for label, tau in thresholds:
            row: dict[str, object] = {"problem": key, "Goldstein at θ0": start, "τ": f"{tau:.4g} ({label})"}
            for name in (*O2NC_METHODS, "DP-SGD"):
                calls = np.array(calls_to_reach(_histories(payload, key, name), tau, start))
                hit = calls[np.isfinite(calls)]
                spread = hit.std(ddof=1) if len(hit) > 1 else 0.0
                row[name] = (f"{hit.mean():.3g} ({spread:.2g}), {len(hit)}/{len(calls)}" if len(hit)
                             else f"not reached, 0/{len(calls)}")
            table.append(row)
    return ["(c) Per-record oracle calls (function evaluations for zeroth order, gradient evaluations for first "
            "order and DP-SGD) until a logged iterate first has Goldstein stationarity ≤ τ, mean (std) over the "
            "seeds that reached it, and how many did (0 calls: θ0 is already there). Two common thresholds: "
            "\"worst last\", the worst of the four methods' mean stationarity at their last iterate (every method "
            f"reaches it on average by its end), and {REACH_FRACTION:g} × the stationarity at θ0 (real progress, "
            "which the first may not ask for: it lies above θ0's value when no method improves on θ0). Iterates are "
            f"measured at {payload['log_points']} log points per run, so a count is at most one log interval late:",
            "", report.markdown_table(table, list(table[0]) if table else []), ""]


def _scaling_lines(payload: Payload, rows: dict[tuple[str, str], Row], keys: list[str]) -> list[str]:
    synthetic_keys = [key for key in keys if key.startswith("synthetic")]
    if len(synthetic_keys) < 2:
        return []
    dims = np.array([_dimension(key) for key in synthetic_keys], dtype=float)
    slopes = {name: slope(dims, np.array([rows[(key, name)]["metrics"]["goldstein"]["mean"]
                                          for key in synthetic_keys]))
              for name in (*O2NC_METHODS, "DP-SGD")}
    start = slope(dims, np.array([_start(payload, key) for key in synthetic_keys]))
    return [f"(b) Scaling with d (synthetic family, d = {', '.join(str(int(d)) for d in dims)}): log-log slope of the "
            "mean Goldstein stationarity at the output against d: "
            + ", ".join(f"{name} {value:+.3f}" for name, value in slopes.items())
            + f"; at θ0 {start:+.3f}. The paper's √d gain over Zhang et al. would show as a slope difference "
            f"Zhang − ours of +0.5 (at a fixed target); measured: {slopes[ZHANG] - slopes[OURS]:+.3f}.", ""]


def _start(payload: Payload, key: str) -> float:
    """The Goldstein stationarity at θ0 of problem ``key`` (its facts')."""
    return number(problem_facts(payload, key)["goldstein_start"], "goldstein_start")


def analyses(payload: Payload) -> list[str]:
    """What the report computes for this preset beyond the verdicts: the Goldstein stationarity
    table, (b) the scaling with d and (c) the oracle calls to a common threshold."""
    rows = _rows(payload)
    keys = [key for key in map(named, PRESET.problems(payload["quick"])) if (key, OURS) in rows]
    lines = ["", "Goldstein stationarity ‖∂̄_{2α}F‖ at the output, mean (std) over seeds, and the ratio "
             "Zhang et al. / ours (> 1: ours is more stationary):", ""]
    table = []
    for key in keys:
        ours, zhang, first, sgd = (rows[(key, name)] for name in (*O2NC_METHODS, "DP-SGD"))
        ratio = zhang["metrics"]["goldstein"]["mean"] / ours["metrics"]["goldstein"]["mean"]
        table.append({"problem": key, "at θ0": _start(payload, key),
                      OURS: _cell(ours, "goldstein"), ZHANG: _cell(zhang, "goldstein"),
                      "Zhang/ours": ratio, FIRST: _cell(first, "goldstein"), "DP-SGD": _cell(sgd, "goldstein"),
                      "ZO calls (ours)": ours["metrics"]["function_evals"]["mean"],
                      "FO calls (ours)": first["metrics"]["gradient_evals"]["mean"],
                      "clip rate ZO/Zhang/FO": "/".join(f"{rows[(key, m)]['metrics']['clip_rate']['mean']:.3f}"
                                                        for m in O2NC_METHODS)})
    lines += [report.markdown_table(table, list(table[0]) if table else []), ""]
    lines += _scaling_lines(payload, rows, keys)
    if "_curves" in payload:
        lines += _reach_lines(payload, keys)
    return lines


def figures(out_dir: Path, payload: Payload) -> None:
    """``goldstein_vs_d.png``: stationarity of each method against the dimension (synthetic family);
    ``goldstein_vs_calls.png``: stationarity of the iterate against per-record oracle calls."""
    rows = _rows(payload)
    keys = [key for key in map(named, PRESET.problems(payload["quick"])) if (key, OURS) in rows]
    synthetic_keys = [key for key in keys if key.startswith("synthetic")]
    if synthetic_keys:
        dims = np.array([_dimension(key) for key in synthetic_keys], dtype=float)
        lines = {name: report.Curve(dims, *(np.array([rows[(key, name)]["metrics"]["goldstein"][stat]
                                                      for key in synthetic_keys]) for stat in ("mean", "std")))
                 for name in (*O2NC_METHODS, "DP-SGD")}
        report.curves_figure(out_dir / "goldstein_vs_d.png", {"Goldstein stationarity of θ_T": lines},
                             xlabel="dimension d", log_x=True, title=f"Synthetic family at ε = {DATA.epsilons[0]:g}, "
                             f"δ = {DELTA:g}: mean over {payload['seeds']} seeds, band ± 1 std")
    if "_curves" in payload and keys:
        panels = {key: {name: mean_curve(_histories(payload, key, name), "goldstein", "oracle_calls")
                        for name in (*O2NC_METHODS, "DP-SGD")} for key in keys}
        report.curves_figure(out_dir / "goldstein_vs_calls.png", panels, xlabel="per-record oracle calls",
                             ylabel="Goldstein stationarity of the iterate", log_x=True,
                             title=f"Every problem at ε = {DATA.epsilons[0]:g}, δ = {DELTA:g}: mean over "
                                   f"{payload['seeds']} seeds, band ± 1 std")


PRESET = declared_experiment(DATA, make_problem=problem, make_methods=declared_methods(DATA, BUILDERS),
                             preparation=preparation, analyses=analyses, draw=figures)
