"""The regime of DP-O2NC: the o2nc-nonsmooth experiment swept in n and in ε (preset
``presets/o2nc-nonsmooth-sweep.toml``, a variant of o2nc-nonsmooth).

Problems and methods are o2nc-nonsmooth's (:mod:`dpopt.experiments.o2nc_nonsmooth`: its problem,
its builders, its Goldstein measurement), restricted to a cross: every problem (the synthetic
family at one d, n growing) at the first ε, and every ε on the first problem only
(:func:`on_the_cross`). Methods: "O2NC-ZO (ours)" (Theorem 3.1) and DP-SGD; each run's ε is
calibrated and read from its ledger as in the main experiment.

The theory beside the measurements (:func:`bound`): Theorem 3.1's single pass returns an
(α, β)-Goldstein-stationary point once

    n ≳ 1/(αβ³) + d/(εαβ²) + d^{3/4}/(ε^{1/2}αβ^{5/2})

(the paper's sample complexity with L = Φ = 1 and its poly-log factors dropped; the same three
terms give the radius D of :func:`dpopt.algorithms.o2nc_params.single_pass`). Solved for β:

    β(n, ε) = max{(αn)^{−1/3}, (d/(εαn))^{1/2}, d^{3/10}·ε^{−1/5}·(αn)^{−2/5}},

a log-log slope in n between −1/3 and −1/2 (the privacy term d/(εαn) gives −1/2) and in ε between 0
and −1/2. The report fits the measured slopes (:func:`fit`) and sets them beside the bound's over the
same points. "Leaves θ0": the mean Goldstein stationarity at the output is below ``reach_fraction``
(o2nc-nonsmooth's) × θ0's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import report
from . import declared
from . import o2nc_nonsmooth as base
from .declared import Settings
from .payload import Payload, ProblemKey, Row, named
from .preset import Builder, declared_experiment, declared_methods

DATA = declared.load("o2nc-nonsmooth-sweep")
NAME = DATA["name"]
#: The ε every problem runs at; the problems the ε sweep runs on (the first full and the first quick one).
BASE_EPSILON = DATA.epsilons[0]
EPSILON_SWEPT = frozenset({DATA["problems"][0], DATA["smoke_problems"][0]})
METHODS = (base.OURS, "DP-SGD")


def on_the_cross(builder: Builder) -> Builder:
    """``builder`` where the sweep runs it: at :data:`BASE_EPSILON` on every problem, at another ε
    only on a problem of :data:`EPSILON_SWEPT`; None (the method does not run) elsewhere."""
    def build(settings: Settings, epsilon: float, key: ProblemKey) -> object:
        return builder(settings, epsilon, key) if epsilon == BASE_EPSILON or key in EPSILON_SWEPT else None
    return build  # type: ignore[return-value]  # the wrapped builder's own algorithm type


BUILDERS = {name: on_the_cross(base.BUILDERS[name]) for name in METHODS}


def bound(n: float, d: float, epsilon: float, alpha: float = base.ALPHA) -> float:
    """β(n, ε) of Theorem 3.1 (module docstring): constants, L, Φ and logarithms set to 1."""
    return max((alpha * n) ** (-1 / 3), math.sqrt(d / (epsilon * alpha * n)),
               d ** 0.3 * epsilon ** -0.2 * (alpha * n) ** -0.4)


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, its standard error) of the least-squares line of log y against log x (NaN error with
    fewer than three points)."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    slope, intercept = np.polyfit(lx, ly, 1)
    if len(lx) < 3:
        return float(slope), math.nan
    residual = ly - (slope * lx + intercept)
    return float(slope), float(math.sqrt(residual @ residual / (len(lx) - 2) / np.sum((lx - lx.mean()) ** 2)))


def _rows(payload: Payload) -> dict[tuple[str, str, float | None], Row]:
    return {(named(row.get("problem")), row["algorithm"], row["epsilon"]): row for row in payload["rows"]}


def sweeps(payload: Payload) -> dict[str, list[tuple[str, float]]]:
    """The two sweeps as (problem, ε) points with every method's row: "n" at :data:`BASE_EPSILON`
    (n increasing), "epsilon" on the ε-swept problem (ε increasing)."""
    rows = _rows(payload)
    done = sorted({(key, eps) for key, _, eps in rows if eps is not None
                   and all((key, name, eps) in rows for name in METHODS)}, key=lambda p: (_n(p[0]), p[1]))
    return {"n": [p for p in done if p[1] == BASE_EPSILON],
            "epsilon": [p for p in done if p[0] in EPSILON_SWEPT and any(q[0] == p[0] and q[1] != p[1] for q in done)]}


def _n(key: str) -> int:
    return base._synthetic_key(key)[1]


def _finals(payload: Payload, key: str, name: str, epsilon: float) -> list[float]:
    """The Goldstein stationarity of each seed's output (from its history)."""
    return [h.final["goldstein"] for h in payload["_curves"][(key, name, epsilon)]]


def _table(payload: Payload, points: list[tuple[str, float]]) -> list[dict[str, object]]:
    rows = _rows(payload)
    table = []
    for key, eps in points:
        start = base._start(payload, key)
        d = base._dimension(key)
        line: dict[str, object] = {"n": _n(key), "ε": eps, "at θ0": start}
        for name in METHODS:
            line[name] = base._cell(rows[(key, name, eps)], "goldstein")
        ours = rows[(key, base.OURS, eps)]["metrics"]["goldstein"]["mean"]
        line["ours / θ0"] = ours / start
        line["leaves θ0"] = "yes" if ours < base.REACH_FRACTION * start else "no"
        line["bound β(n, ε)"] = bound(_n(key), d, eps)
        table.append(line)
    return table


def _slopes(payload: Payload, points: list[tuple[str, float]], axis: str) -> str:
    """Fitted log-log slopes of the sweep along ``axis`` ("n" or "ε"), each seed a point."""
    if len(points) < 2:
        return ""
    x_of = (lambda key, eps: _n(key)) if axis == "n" else (lambda key, eps: eps)
    parts = []
    for name in METHODS:
        x = [x_of(key, eps) for key, eps in points for _ in _finals(payload, key, name, eps)]
        y = [value for key, eps in points for value in _finals(payload, key, name, eps)]
        slope, error = fit(np.array(x), np.array(y))
        parts.append(f"{name} {slope:+.3f} ± {error:.3f}")
    xs = np.array([x_of(key, eps) for key, eps in points], dtype=float)
    start = fit(xs, np.array([base._start(payload, key) for key, _ in points]))[0]
    theory = fit(xs, np.array([bound(_n(key), base._dimension(key), eps) for key, eps in points]))[0]
    return (f"Log-log slope of the Goldstein stationarity at the output against {axis} (least squares over every "
            f"seed's output, ± its standard error): {', '.join(parts)}; θ0 {start:+.3f}; the bound β {theory:+.3f}.")


def analyses(payload: Payload) -> list[str]:
    """The sweep tables (Goldstein stationarity against n and against ε), where DP-O2NC leaves θ0,
    and the fitted slopes beside the bound's."""
    if "_curves" not in payload:
        return []
    lines = []
    for axis, points in sweeps(payload).items():
        if not points:
            continue
        table = _table(payload, points)
        left = [line[axis if axis == "n" else "ε"] for line in table if line["leaves θ0"] == "yes"]
        label = "n" if axis == "n" else "ε"
        lines += ["", f"Goldstein stationarity ‖∂̄_{{2α}}F‖ at the output against {label}, mean (std) over seeds:", "",
                  report.markdown_table(table, list(table[0])), "",
                  f"DP-O2NC leaves θ0 (mean < {base.REACH_FRACTION:g} × θ0's) at {label} = "
                  f"{', '.join(str(v) for v in left) if left else 'none of the sweep'}.",
                  _slopes(payload, points, label), ""]
    return lines


def figures(out_dir: Path, payload: Payload) -> None:
    """``goldstein_vs_n_eps.png``: the stationarity at the output against n and against ε: θ0's,
    the bound β (constants 1) and each method's mean ± std."""
    if "_curves" not in payload:
        return
    rows = _rows(payload)
    panels = {}
    for axis, points in sweeps(payload).items():
        if len(points) < 2:
            continue
        x = np.array([_n(key) if axis == "n" else eps for key, eps in points], dtype=float)
        lines = {"θ0": report.Curve(x, np.array([base._start(payload, key) for key, _ in points])),
                 "bound β (constants 1)": report.Curve(x, np.array([bound(_n(key), base._dimension(key), eps)
                                                                    for key, eps in points]))}
        lines |= {name: report.Curve(x, *(np.array([rows[(key, name, eps)]["metrics"]["goldstein"][stat]
                                                    for key, eps in points]) for stat in ("mean", "std")))
                  for name in METHODS}  # drawn last: on top of θ0's line where they coincide
        key, eps = points[0]
        title = (f"against n (ε = {eps:g})" if axis == "n"
                 else f"against ε (n = {_n(key):,}, d = {base._dimension(key)})")
        panels[title] = lines
    if panels:
        report.curves_figure(out_dir / "goldstein_vs_n_eps.png", panels, log_x=True,
                             xlabel={title: "n" if title.startswith("against n") else "ε" for title in panels},
                             ylabel="Goldstein stationarity at the output",
                             title=f"{NAME}: δ = {base.DELTA:g}, mean over {payload['seeds']} seeds, band ± 1 std")


PRESET = declared_experiment(DATA, make_problem=base.problem, make_methods=declared_methods(DATA, BUILDERS),
                             preparation=base.preparation, analyses=analyses, draw=figures)
