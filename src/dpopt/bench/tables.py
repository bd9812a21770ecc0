"""The bench's results (``bench.json``) as Markdown and figures.

Where the bench's randomness came from, then per problem: how its data were prepared, a table of
each method's metric (mean (std) over seeds) at every ε with the winner and its p-value (or the
methods that tie), a table of its cost (planned expected data passes, public), a table of its wall
time and trials run (NOT PRIVATE: only when the result has diagnostics), and a figure (metric
against ε). Over all problems: ``summary.png``, a heatmap of each method's gap to the best mean
of its (problem, ε) cell.

Everything is read from the result alone: problems may have different methods, ε and metrics (a
problem's ``"metric"``, default ``"test_error"``; lower is better for every metric).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from .. import report
from . import SIGNIFICANCE, TIE
from .results import BenchResult, Cell, MethodCell, ProblemResult, RunDiagnostics
from ..report import markdown_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Gaps to the best mean beyond this (in %) get the darkest colour of the summary figure.
GAP_CAP = 50.0


def metric(problem: ProblemResult) -> str:
    """The name of the problem's metric (``test_error`` if it names none)."""
    return problem.get("metric", "test_error")


def score(entry: MethodCell, name: str) -> dict[str, float]:
    """A method entry's metric summary ({mean, std, ...}): under the metric's name, ``"metric"``
    or ``"test_error"``, the first present."""
    keyed: Mapping[str, object] = entry
    return cast("dict[str, float]", next(keyed[key] for key in (name, "metric", "test_error") if key in keyed))


def _methods(problem: ProblemResult) -> list[str]:
    """The problem's methods in the order of their first appearance over its cells."""
    return list(dict.fromkeys(name for cell in problem["cells"] for name in cell["methods"]))


def markdown(result: BenchResult, command: str) -> str:
    """Per problem: the metric table (rows: methods, then the winner with its p-value against the
    runner-up; one column per ε), the planned cost and, if the result has diagnostics, the NOT
    PRIVATE wall time and trials run; without them, a line saying they are left out."""
    diagnostics = result.get("diagnostics")
    lines = [f"Command: `{command}`. Summary figure: `summary.png`.", ""]
    if diagnostics is None:
        lines += ["Trial counts and wall times are not shown: they reveal the number of trials K of each tuning, "
                  "which its guarantee needs kept secret (`--diagnostics` adds them, labelled NOT PRIVATE).", ""]
    else:
        lines += [f"Diagnostics ({diagnostics['label']}): total wall time {diagnostics['wall_time_s']:.0f} s; per "
                  "problem, the wall time and the trials run.", ""]
    if "randomness" in result:
        lines += [f"Randomness of the tunings: {result['randomness']}.", ""]
    for problem in result["problems"]:
        cells, name, methods = problem["cells"], metric(problem), _methods(problem)
        columns = [f"ε = {cell['epsilon']:g}" for cell in cells]

        # one row per label, a column per ε
        def table(head: str, label_rows: Mapping[str, Callable[[Cell], object]]) -> str:
            return markdown_table([{head: label} | {column: entry(cell) for column, cell in zip(columns, cells)}
                                   for label, entry in label_rows.items()], [head, *columns])

        rows: dict[str, Callable[[Cell], object]] = {
            method: functools.partial(_entry, name=method, metric_name=name) for method in methods}
        rows["winner (p vs runner-up)"] = _winner
        spent = max((entry["epsilon_tuning_and_training"] for cell in cells for entry in cell["methods"].values()),
                    default=0.0)
        lines += [f"## {problem['problem']}: {problem['model']} on {problem['dataset']}", "",
                  f"{name} of the privately selected θ, mean (std) over {problem['seeds']} seeds; δ = "
                  f"{problem['delta']:g}; trials per tuning: {problem['trials']}; steps: {_steps(problem['steps'])}; "
                  f"grids: {_grids(problem['grids'])}. Each ε is the total for tuning and training (RDP accountant); "
                  "the largest "
                  f"ε any tuning claimed: {spent:.4g}. Bold: the lowest mean, unless another is within {TIE:.1%} of it "
                  "(a tie: no winner).", "",
                  *([f"Data preparation: {problem['preparation']}.", ""] if "preparation" in problem else []),
                  table("method", rows), ""]
        if any("expected_passes" in entry for cell in cells for entry in cell["methods"].values()):
            passes = {method: functools.partial(_passes, method=method) for method in methods}
            lines += ["Cost: planned expected data passes of the whole tuning and training (expected trials × "
                      "one trial's passes; public: fixed by the plan before any data is seen).", "",
                      table("expected passes (planned)", passes), ""]
        if diagnostics is not None:
            walls = {(run["problem"], run["epsilon"], run["algorithm"]): run for run in diagnostics["runs"]}
            timed = {method: functools.partial(_wall_of, walls=walls, problem=problem["problem"], method=method)
                     for method in methods}
            lines += ["Cost, NOT PRIVATE wall time (it reveals the number of trials): seconds of tuning and training "
                      "per seed (trials run, summed over seeds).", "",
                      table("wall time (NOT PRIVATE)", timed), ""]
    return "\n".join(lines)


def _steps(steps: Mapping[str, object]) -> str:
    """``{"dp-sgd": 400, "dp-gd": 100}`` → ``"dp-sgd 400, dp-gd 100"``."""
    return ", ".join(f"{method} {count}" for method, count in steps.items())


def _grids(grids: Mapping[str, Mapping[str, Sequence[object]]]) -> str:
    """Each method's grid as ``method: lr ∈ {0.1, 0.3} × clip ∈ {1, 3}`` (``method: none`` for an empty grid)."""
    return "; ".join(f"{method}: " + (" × ".join(f"{name} ∈ {{{_values(values)}}}" for name, values in grid.items())
                                      or "none") for method, grid in grids.items())


def _values(values: Sequence[object]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _passes(cell: Cell, method: str) -> object:
    entry = cell["methods"].get(method)
    return "–" if entry is None else entry.get("expected_passes", "–")


def _wall_of(cell: Cell, walls: Mapping[tuple[str, float, str], RunDiagnostics], problem: str, method: str) -> str:
    return _wall(walls.get((problem, cell["epsilon"], method)))


def _winner(cell: Cell) -> str:
    """The winner with its p-value against the runner-up, or the methods that tie."""
    if cell["winner"] is None:
        return f"none: {', '.join(cell['tied'])} tie (within {TIE:.1%})"
    return f"{cell['winner']} (p = {cell['p_value']:.2g}{', significant' if cell['significant'] else ''})"


def _entry(cell: Cell, name: str, metric_name: str) -> str:
    if name not in cell["methods"]:
        return "–"
    value = score(cell["methods"][name], metric_name)
    text = f"{_number(value['mean'])} ({_number(value['std'])})"
    return f"**{text}**" if name == cell["winner"] else text


def _number(value: float) -> str:
    """4 decimals for a value between 0.001 and 1000 (an error rate, a loss), else 4 significant digits."""
    return f"{value:.4f}" if 1e-3 <= abs(value) < 1e3 or value == 0 else f"{value:.4g}"


def _wall(run: RunDiagnostics | None) -> str:
    if run is None:
        return "–"
    return f"{run['wall_time_s'] / len(run['trials_run']):.1f} s ({sum(run['trials_run'])} trials)"


def figures(out: Path, result: BenchResult) -> None:
    """``<problem>.png`` for every problem and ``summary.png``, in ``out``."""
    for problem in result["problems"]:
        report.save_figure(out / f"{problem['problem']}.png", problem_figure(problem))
    report.save_figure(out / "summary.png", summary_figure(result))


def problem_figure(problem: ProblemResult) -> Figure:
    """The problem's metric (mean ± std over seeds) against ε, one line per method side by side at
    each ε (on a log axis if the means span :data:`~dpopt.report.LOG_SPAN` or more, e.g. a method
    that diverged; there a lower bar that would reach mean − std ≤ 0 stops at the mean, and the
    title says so); the winner of each ε circled (none where methods tie), filled if significant."""
    plt = report.pyplot()
    cells, name, methods = problem["cells"], metric(problem), _methods(problem)
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    means = [score(entry, name)["mean"] for cell in cells for entry in cell["methods"].values()]
    ax.set_yscale(report.scale(True, [[m for m in means if m > 0]]))  # log where the means span decades
    omitted = False  # a lower bar stopped at the mean (a log axis cannot show mean − std ≤ 0)
    for j, method in enumerate(methods):  # ε on a categorical axis, the methods side by side at each ε
        at = [(i + 0.6 * (j - (len(methods) - 1) / 2) / max(1, len(methods)), cell)
              for i, cell in enumerate(cells) if method in cell["methods"]]
        x = [xi for xi, _ in at]
        values = [score(cell["methods"][method], name) for _, cell in at]
        mean, std = [v["mean"] for v in values], [v["std"] for v in values]
        low = report.lower_ends(ax, mean, std)
        omitted = omitted or any(end != m - s for end, m, s in zip(low, mean, std))
        ax.errorbar(x, mean, yerr=[[m - end for m, end in zip(mean, low)], std], marker="o", capsize=3,
                    label=method)
        for xi, (_, cell), value in zip(x, at, values):
            if cell["winner"] == method:
                ax.scatter([xi], [value["mean"]], s=160, zorder=3, edgecolors="black",
                           facecolors=(0, 0, 0, 0.25) if cell["significant"] else "none")
    ax.set_xticks(range(len(cells)), [f"{cell['epsilon']:g}" for cell in cells])
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_xlabel("ε (tuning and training)")
    ax.set_ylabel(f"{name.replace('_', ' ')} (mean ± std, {problem['seeds']} seeds)")
    epsilons = ", ".join(f"{cell['epsilon']:g}" for cell in cells)
    ax.set_title(f"{problem['problem']}: privately tuned at ε ∈ {{{epsilons}}}, δ = {problem['delta']:g}\n"
                 f"circled: the winner; filled: p < {SIGNIFICANCE:g} against the runner-up"
                 + ("\nlower bar omitted where mean − std ≤ 0 (log axis)" if omitted else ""), fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8)
    return fig


def summary_figure(result: BenchResult) -> Figure:
    """A heatmap over all problems and ε: a row per (problem, method), a column per ε; the colour is
    the method's gap to the best mean of that cell relative to it (:func:`_gap`, capped at
    :data:`GAP_CAP`), so problems with different metrics share one scale; each square shows the
    mean; the winner is starred (★; none where methods tie), and marked * when significant against
    the runner-up. Grey: not run."""
    import numpy as np

    plt = report.pyplot()
    problems = result["problems"]
    epsilons = sorted({cell["epsilon"] for problem in problems for cell in problem["cells"]})
    rows = [(problem, method) for problem in problems for method in _methods(problem)]
    gaps = np.full((len(rows), len(epsilons)), np.nan)
    labels = [f"{problem['problem']} [{metric(problem)}]: {method}" for problem, method in rows]
    width = 3.0 + 0.075 * max(len(label) for label in labels) + 1.1 * len(epsilons)
    fig, ax = plt.subplots(figsize=(max(8.0, width), 1.8 + 0.38 * len(rows)), layout="constrained")
    for r, (problem, method) in enumerate(rows):
        for cell in problem["cells"]:
            if method not in cell["methods"]:
                continue
            c = epsilons.index(cell["epsilon"])
            means = {m: score(entry, metric(problem))["mean"] for m, entry in cell["methods"].items()}
            gaps[r, c] = _gap(means[method], min((m for m in means.values() if not math.isnan(m)), default=math.nan))
            winner = method == cell["winner"]
            star = " *" if winner and cell["significant"] else ""
            ax.text(c, r, f"{'★ ' if winner else ''}{means[method]:.3g}{star}",
                    ha="center", va="center", fontsize=8, fontweight="bold" if winner else "normal",
                    color="white" if gaps[r, c] > GAP_CAP / 2 else "black")
    colours = plt.get_cmap("viridis_r").with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(np.minimum(gaps, GAP_CAP)), cmap=colours, vmin=0, vmax=GAP_CAP,
                      aspect="auto")
    fig.colorbar(image, ax=ax, extend="max", label="gap to the cell's best mean (%)")
    ax.set_xticks(range(len(epsilons)), [f"{e:g}" for e in epsilons])
    ax.set_yticks(range(len(rows)), labels)
    for r in range(1, len(rows)):  # a rule between problems
        if rows[r][0] is not rows[r - 1][0]:
            ax.axhline(r - 0.5, color="white", linewidth=3)
    ax.set_xlabel("ε (tuning and training)")
    ax.set_ylabel("problem [metric]: method")
    deltas = {problem["delta"] for problem in problems}
    delta = f"δ = {deltas.pop():g}" if len(deltas) == 1 else "δ: " + ", ".join(
        f"{p['problem']} {p['delta']:g}" for p in problems)
    fig.suptitle(f"Each method privately tuned and trained at the column's ε, {delta}\nmean over seeds (lower is "
                 f"better); grey: not run\n★ winner (none on a tie), * p < {SIGNIFICANCE:g} against the runner-up "
                 "(Welch)", fontsize=9)
    return fig


def _gap(mean: float, best: float) -> float:
    """100 (mean − best) / |best|: how far (in %) a mean is behind the best one."""
    if best == 0:
        return 0.0 if mean == 0 else math.inf
    return 100 * (mean - best) / abs(best)
