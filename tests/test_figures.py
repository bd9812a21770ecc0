"""Every figure dpopt writes is one a reader can use (``legibility.py`` states the rules): built
here from small synthetic inputs, each passes the check, and each mutant of it (its title
stripped, its legend over the data, an empty axes, a label dropped, a title wider than the
figure, a log axis over a flat curve) is caught."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpopt import report
from dpopt.bench import tables
from dpopt.cli.run import run_figure
from dpopt.experiments import o2nc_nonsmooth as o2nc
from legibility import problems


def _cell(epsilon: float, means: dict[str, float], metric: str, significant: bool) -> dict[str, Any]:
    winner = min(means, key=means.get)
    return {"epsilon": epsilon, "winner": winner, "p_value": 0.01 if significant else 0.3, "significant": significant,
            "methods": {name: {metric: {"mean": mean, "std": 0.05 * mean}, "epsilon_tuning_and_training": epsilon,
                               "expected_passes": 40.0} for name, mean in means.items()}}


#: Two problems with different methods, ε and metrics (the second names its metric).
BENCH = {"problems": [
    {"problem": "adult-logistic", "dataset": "adult", "model": "logistic", "delta": 1e-5, "seeds": 5,
     "cells": [_cell(e, {"dp-sgd": 0.16 + 0.01 / e, "dp-srm": 0.165 + 0.01 / e, "aclip": 0.2}, "test_error", e > 1)
               for e in (0.5, 1.0, 3.0, 8.0)]},
    {"problem": "housing", "dataset": "california_housing", "model": "mlp", "delta": 1e-6, "seeds": 5,
     "metric": "test_mse", "cells": [_cell(e, {"diff2": 0.5 + 1 / e, "dp-gd": 0.6 + 1 / e}, "test_mse", True)
                                     for e in (1.0, 8.0)]}],
    "diagnostics": {"wall_time_s": 1.0, "runs": []}}


def _history(test_error: list[float]) -> SimpleNamespace:
    records = [{"expected_passes": 0.5 * (k + 1), "test_error": error, "epsilon": 0.1 * (k + 1) ** 0.5}
               for k, error in enumerate(test_error)]
    return SimpleNamespace(records=records, delta=1e-5, accountant="pld", diagnostics={
        "records": [{"objective": 1.0 / (k + 1)} for k in range(len(test_error))]})


def _o2nc_payload() -> dict[str, Any]:
    keys = ("synthetic-d8", "synthetic-d32", "synthetic-d128")
    names = (*o2nc.O2NC_METHODS, "DP-SGD")
    curve = [SimpleNamespace(records=[{"goldstein": 1.0 / k, "oracle_calls": 10.0 ** k} for k in range(1, 5)])] * 2
    return {"quick": False, "seeds": 2, "_curves": {(key, name, 1.0): curve for key in keys for name in names},
            "rows": [{"problem": key, "algorithm": name,
                      "metrics": {"goldstein": {"mean": j + math.log(d), "std": 0.1}}}
                     for key, d in zip(keys, (8, 32, 128)) for j, name in enumerate(names)]}


#: Each writer of figures the project has, run on the synthetic inputs above → the files it writes.
WRITERS = [
    (lambda out: tables.figures(out, BENCH), ("adult-logistic.png", "housing.png", "summary.png")),
    (lambda out: run_figure(out / "curves.png", _history([0.31, 0.2, 0.16, 0.155, 0.155]), algorithm="dp-sgd",
                            dataset="adult", epsilon=1.0), ("curves.png",)),
    (lambda out: o2nc.figures(out, _o2nc_payload()), ("goldstein_vs_d.png", "goldstein_vs_calls.png")),
    # a reproduction's curves against data passes on a log axis spanning less than two decades
    (lambda out: report.curves_figure(
        out / "passes.png", {"test accuracy": {"dp-sgd": report.Curve(np.geomspace(2.5, 50, 20),
                                                                      np.linspace(0.96, 0.987, 20))}},
        title="test accuracy at ε = 3, δ = 1e-05", xlabel="expected data passes", log_x=True, log_y=False),
     ("passes.png",)),
]
FIGURES = [name for _, names in WRITERS for name in names]


def _figure(name: str, drawn: dict[str, Any], tmp_path: Path) -> Any:
    """Figure ``name``, drawn by its writer (which saves it through ``report.save_figure``)."""
    next(write for write, names in WRITERS if name in names)(tmp_path)
    return drawn[name]


def test_each_writer_writes_the_figures_listed(drawn_figures: dict[str, Any], tmp_path: Path) -> None:
    for write, names in WRITERS:
        drawn_figures.clear()
        write(tmp_path)
        assert sorted(drawn_figures) == sorted(names)


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_is_legible(name: str, drawn_figures: dict[str, Any], tmp_path: Path) -> None:
    assert problems(_figure(name, drawn_figures, tmp_path)) == []


def _strip_titles(fig: Any) -> None:
    fig.suptitle("")
    for ax in fig.axes:
        ax.set_title("")


def _legend_over_data(fig: Any) -> None:
    for legend in fig.legends:
        legend.remove()
    ax = fig.axes[0]
    line = next(line for line in ax.lines if len(line.get_xydata()))
    ax.legend(loc="center", bbox_to_anchor=tuple(line.get_xydata()[0]), bbox_transform=ax.transData)


#: mutant → (what it does to a figure, the problem the checker must report)
MUTANTS = {
    "title stripped": (_strip_titles, "neither the suptitle nor every axes' title names ε and δ"),
    "legend over the data": (_legend_over_data, "legend covers data of"),
    "an empty axes": (lambda fig: fig.add_axes((0.0, 0.0, 0.1, 0.1)), "empty axes"),
    "y label dropped": (lambda fig: fig.axes[0].set_ylabel(""), "no y label"),
    "title wider than the figure": (lambda fig: fig.suptitle("ε and δ " + "and a long title " * 20),
                                    "the suptitle is cut off at the figure's edge"),
}


@pytest.mark.parametrize("name,mutant", [(name, mutant) for name in FIGURES for mutant in MUTANTS
                                         if (name, mutant) != ("summary.png", "legend over the data")])  # no legend
def test_every_figure_mutant_is_caught(name: str, mutant: str, drawn_figures: dict[str, Any], tmp_path: Path) -> None:
    fig = _figure(name, drawn_figures, tmp_path)
    mutate, expected = MUTANTS[mutant]
    mutate(fig)
    assert any(expected in problem for problem in problems(fig)), problems(fig)


def test_a_log_axis_over_a_flat_curve_repeats_its_tick_labels(drawn_figures: dict[str, Any], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a nearly flat test error on a log axis printed "1.55×10⁻¹" at every tick; such an
    axis is drawn linear (report.LOG_SPAN). The mutant (log whatever the span) is caught."""
    flat = _history([0.155, 0.1550001, 0.155, 0.1550002])
    run_figure(tmp_path / "curves.png", flat, algorithm="dp-sgd", dataset="adult", epsilon=1.0)
    assert problems(drawn_figures["curves.png"]) == []
    assert drawn_figures["curves.png"].axes[0].get_yscale() == "linear"
    monkeypatch.setattr(report, "LOG_SPAN", 1.0)
    run_figure(tmp_path / "curves.png", flat, algorithm="dp-sgd", dataset="adult", epsilon=1.0)
    assert drawn_figures["curves.png"].axes[0].get_yscale() == "log"
    assert any("y tick labels repeated" in problem for problem in problems(drawn_figures["curves.png"]))


def test_a_panel_with_nothing_to_draw_is_dropped_and_named(drawn_figures: dict[str, Any], tmp_path: Path) -> None:
    x = np.arange(1.0, 4.0)
    left_out = report.curves_figure(tmp_path / "c.png", {"kept": {"a": (x, x)}, "gone": {"a": (x, -x)}},
                                    title="ε = 1, δ = 1e-5", xlabel="passes")
    fig = drawn_figures["c.png"]
    assert left_out == 3 and [ax.get_title() for ax in fig.axes] == ["kept"]
    assert "not drawn, nothing drawable: gone" in fig.get_suptitle() and problems(fig) == []


def test_bands_show_the_spread_over_seeds(drawn_figures: dict[str, Any], tmp_path: Path) -> None:
    """A Curve's spread is drawn as a band y ± spread (on a log axis, from y up where y − spread ≤ 0)."""
    x, y = np.array([1.0, 10.0, 100.0]), np.array([1.0, 0.1, 0.01])
    report.curves_figure(tmp_path / "c.png", {"p": {"a": report.Curve(x, y, np.array([0.5, 0.5, 0.001]))}},
                         title="ε = 1, δ = 1e-5", xlabel="passes", log_x=True)
    (band,) = [c for c in drawn_figures["c.png"].axes[0].collections]
    edges = set(np.round(band.get_paths()[0].vertices[:, 1], 6))
    assert edges == {1.5, 0.6, 0.011, 0.5, 0.1, 0.009}  # y ± spread; at y = 0.1, y − 0.5 < 0: from 0.1 up


def test_a_bench_figure_with_a_diverged_method_has_a_log_axis() -> None:
    """Finding (the California DIFF2 run): a method whose mean loss reached 1e26 flattened every
    other line to 0 on a linear axis; means spanning decades get a log axis."""
    problem = BENCH["problems"][1] | {"cells": [_cell(e, {"diff2": 1e26 / e, "dp-gd": 0.05}, "test_mse", True)
                                                for e in (1.0, 8.0)]}
    fig = tables.problem_figure(problem)
    assert fig.axes[0].get_yscale() == "log" and problems(fig) == []
    assert tables.problem_figure(BENCH["problems"][1]).axes[0].get_yscale() == "linear"


def test_a_bench_figure_on_a_log_axis_draws_no_error_bar_below_zero() -> None:
    """Finding (the California figure): a spread wider than its mean drew the bar to mean − std ≤ 0,
    which a log axis cannot show (it ran off the bottom of the axes). The lower bar stops at the
    mean there, and the title says so."""
    cells = [_cell(e, {"diff2": 1e6 / e, "dp-gd": 0.05}, "test_mse", True) for e in (1.0, 8.0)]
    cells[0]["methods"]["dp-gd"]["test_mse"]["std"] = 0.2  # mean − std < 0
    fig = tables.problem_figure(BENCH["problems"][1] | {"cells": cells})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    lows = [segment[:, 1].min() for collection in ax.collections if hasattr(collection, "get_segments")
            for segment in collection.get_segments()]
    assert lows and min(lows) > 0
    assert "lower bar omitted where mean − std ≤ 0" in ax.get_title()
    assert problems(fig) == []
    linear = tables.problem_figure(BENCH["problems"][1]).axes[0]
    assert "omitted" not in linear.get_title()
