"""A preset experiment as one object: what :func:`dpopt.experiments.reproduce` reads from it.

Every preset is an :class:`Experiment`: upper-case fields are its declared settings; problems and
methods come from callables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..base import Algorithm
from ..data.bounds import Preparation
from ..json_types import JsonObject
from ._runner import Method, Params, Problem
from .declared import Declared, PaperEntry, Settings
from .payload import Payload, ProblemKey, Tuned, problem_facts
from .patience_tuning import patience_tune
from .verdicts import comparison_lines


A = TypeVar("A")
#: A method's ``build(n, params) -> (algorithm, steps)``, of algorithm type ``A``.
Build = Callable[[int, Params], tuple[A, int]]
#: The tuned values of a problem's methods: method → {ε (None: a non-private method): values}.
Tuning = dict[str, dict[float | None, Params]]
#: ``make_problem(key, data_dir) -> (problem, facts)``.
MakeProblem = Callable[[ProblemKey, str | None], tuple[Problem, JsonObject]]
#: ``make_methods(key, epochs, tuned, epsilon) -> methods``.
MakeMethods = Callable[[ProblemKey, int, Tuning, float], list[Method]]


@dataclass(frozen=True)
class Experiment:
    """A preset: ``NAME``; the ε it runs at (``EPSILONS``); ``PROBLEMS`` (problem keys; ``(None,)``
    for a preset with one unnamed problem, whose rows then have no ``problem`` column) and
    ``SMOKE_PROBLEMS`` (they replace ``PROBLEMS`` under ``--quick`` when set); ``PAPER`` (rows of the
    paper's table); ``METRICS`` (summarised per row), ``TABLE_METRICS`` and ``PAPER_METRICS`` (the
    columns of results.md), ``TEST_METRICS`` (the t-tests' metrics) and ``COMPARISONS`` ((ours,
    baseline) name pairs); ``CURVES`` (figure panels: title -> metric, or (metric, x)); ``TUNED``
    (problem key -> the values a method builder reads), ``TUNING_COST``, ``TUNING_SEEDS`` and
    ``TUNE_EPSILON`` (tune once, at that ε, and use the choice at every ε; None: at every ε);
    ``LOG_POINTS`` (logged points per run: measurement only) and ``SEEDS`` (default seed count).
    ``make_problem(key, data_dir)``, ``make_methods(key, epochs, tuned, epsilon)``, ``delta_of(key)``,
    ``describe(payload)`` (the report's notes) and ``draw(out_dir, payload)`` (a preset's own
    figures, if any) build the rest. ``preparation(key)`` declares how problem ``key``'s data are
    prepared (:mod:`dpopt.jobs.preparation`; ``make_problem`` prepares them so), which the
    report shows, labelled NOT PRIVATE where it reads the data. ``run_cost_of(key)``: what one run
    on problem ``key`` costs relative to the other problems (e.g. measured CPU seconds), known
    before its data are read, which orders the queue (costliest first); None where not declared
    (the problems of an experiment declare it all or none)."""

    NAME: str
    EPSILONS: tuple[float, ...]
    PAPER: list[PaperEntry]
    METRICS: tuple[str, ...]
    TABLE_METRICS: tuple[str, ...]
    PAPER_METRICS: tuple[str, ...]
    TEST_METRICS: tuple[str, ...]
    COMPARISONS: list[tuple[str, str]]
    epochs: int
    make_problem: MakeProblem
    make_methods: MakeMethods
    delta_of: Callable[[ProblemKey], float]
    describe: Callable[[Payload], str]
    preparation: Callable[[ProblemKey], Preparation]
    PROBLEMS: tuple[ProblemKey, ...] = (None,)
    CURVES: dict[str, str | tuple[str, str]] = field(default_factory=lambda: {"training objective": "objective"})
    TUNED: dict[ProblemKey, Tuning] = field(default_factory=dict)
    TUNING_COST: JsonObject = field(default_factory=dict)
    TUNING_SEEDS: tuple[int, ...] = (1000, 1001, 1002)
    TUNE_EPSILON: float | None = None
    SMOKE_PROBLEMS: tuple[ProblemKey, ...] | None = None
    LOG_POINTS: int = 40
    SEEDS: int = 10
    draw: Callable[[Path, Payload], None] | None = None
    #: How the ``TUNED`` values were chosen (the command and its date), for the report.
    TUNED_BY: str = ""
    #: A line added to every figure's title ("" for none).
    FIGURE_NOTE: str = ""
    run_cost_of: Callable[[ProblemKey], float | None] = lambda key: None

    @property
    def keyed(self) -> bool:
        """Whether the rows name their problem (False for one unnamed problem)."""
        return self.PROBLEMS != (None,)

    def problems(self, quick: bool) -> tuple[ProblemKey, ...]:
        return self.SMOKE_PROBLEMS if quick and self.SMOKE_PROBLEMS else self.PROBLEMS

    def problem(self, data_dir: str | None, key: ProblemKey) -> tuple[Problem, JsonObject]:
        return self.make_problem(key, data_dir)

    def methods(self, epsilon: float, key: ProblemKey) -> list[Method]:
        return self.make_methods(key, self.epochs, self.TUNED.get(key, {}), epsilon)

    def delta(self, key: ProblemKey) -> float:
        return self.delta_of(key)

    def run_cost(self, key: ProblemKey) -> float | None:
        return self.run_cost_of(key)

    def notes(self, payload: Payload) -> str:
        return self.describe(payload)

    def figures(self, out_dir: Path, payload: Payload) -> None:
        if self.draw is not None:
            self.draw(out_dir, payload)


#: Builds a method's ``build(n, params) -> (algorithm, steps)`` from its declared ``settings``, the ε
#: and the problem key; None where the method does not run at that ε on that problem. (An algorithm of
#: any state type: each method's own.)
Builder = Callable[[Settings, float, ProblemKey], Callable[[int, Params], tuple[Algorithm[Any], int]] | None]


def declared_experiment(data: Declared, *, make_problem: MakeProblem, make_methods: MakeMethods,
                        preparation: Callable[[ProblemKey], Preparation],
                        analyses: Callable[[Payload], list[str]] | None = None,
                        draw: Callable[[Path, Payload], None] | None = None,
                        run_cost: Callable[[ProblemKey], float | None] = lambda key: None) -> Experiment:
    """The :class:`Experiment` of a preset file: its declared fields, the code's problem and method
    builders, its problems' preparation and run costs, and as notes the file's text (``notes``, a ``problem_note``
    per problem, the ``quick_note`` under ``--quick``), then
    :func:`~dpopt.experiments.verdicts.comparison_lines` (the generic rule), then what
    ``analyses(payload)`` computes for this preset, if anything."""
    delta = data["delta"]

    def describe(payload: Payload) -> str:
        lines = [data["notes"].strip().format(facts=payload["facts"], seeds=payload["seeds"],
                                              log_points=payload["log_points"], parameters=data["parameters"],
                                              epochs=data.get("epochs"))]
        if "problem_note" in data.values:
            lines += [data["problem_note"].strip().format(key=key, **problem_facts(payload, key))
                      for key in payload["facts"]]
        if payload["quick"] and "quick_note" in data.values:
            lines.append(data["quick_note"].strip().format(parameters=data["parameters"]))
        lines += comparison_lines(payload, data["verdict_metrics"], data["explanations"])
        return "\n".join(lines + (analyses(payload) if analyses is not None else []))

    return Experiment(
        NAME=data["name"], EPSILONS=data.epsilons, PAPER=data.paper(), METRICS=tuple(data["metrics"]),
        TABLE_METRICS=tuple(data["table_metrics"]), PAPER_METRICS=tuple(data["paper_metrics"]),
        TEST_METRICS=tuple(data["test_metrics"]), COMPARISONS=[tuple(pair) for pair in data["comparisons"]],
        epochs=data.get("epochs", 0), make_problem=make_problem, make_methods=make_methods,
        delta_of=(lambda key: delta[key]) if isinstance(delta, dict) else (lambda key: delta), describe=describe,
        preparation=preparation,
        PROBLEMS=tuple(data.get("problems", [None])),
        SMOKE_PROBLEMS=tuple(data["smoke_problems"]) if "smoke_problems" in data.values else None,
        CURVES={title: spec if isinstance(spec, str) else tuple(spec) for title, spec in data["curves"].items()},
        TUNED=data.tuned(), TUNING_COST=data.get("tuning", {}).get("cost", {}),
        TUNING_SEEDS=tuple(data["tuning_seeds"]),
        TUNE_EPSILON=data.get("tune_epsilon"), LOG_POINTS=data["log_points"], SEEDS=data["seeds"], draw=draw,
        TUNED_BY=f"{_command(tuning['command'])} on {tuning['date']}" if (tuning := data.get("tuning")) else "",
        FIGURE_NOTE=data.get("figure_note", ""), run_cost_of=run_cost)


#: How a method's grid is searched, by the name a preset file gives (``tuner``): every grid point
#: scored by its final training objective (:func:`~dpopt.experiments._runner.explore_grid`), or the DIFF2
#: paper's step-size search with patience (:func:`~dpopt.experiments.patience_tuning.patience_tune`).
TUNERS: dict[str, Callable[..., Tuned] | None] = {"grid": None, "patience": patience_tune}


def declared_methods(data: Declared, builders: Mapping[str, Builder]) -> MakeMethods:
    """``make_methods`` of a preset file: its methods in the file's order, each built by
    ``builders[name]`` from its ``settings``, with its grid, tuned values and tuner."""
    def make(key: ProblemKey, epochs: int, tuned: Tuning, epsilon: float) -> list[Method]:
        found = []
        for name, spec in data["methods"].items():
            build = builders[name](spec.get("settings", {}), epsilon, key)
            if build is not None:
                found.append(Method(name, build, {k: tuple(v) for k, v in spec["grid"].items()}, tuned.get(name, {}),
                                    private=spec.get("private", True), noise_scale=spec.get("noise_scale", 1.0),
                                    deterministic=spec.get("deterministic", False),
                                    tuner=TUNERS[spec.get("tuner", "grid")]))
        return found
    return make


def _command(how: str) -> str:
    """A preset's ``tuning.command`` as a reader sees it: a command (starting ``dpopt`` or ``python``)
    as code, a sentence (how the values were chosen without one command) as it is."""
    return f"`{how}`" if how.split(" ", 1)[0] in ("dpopt", "python") else how
