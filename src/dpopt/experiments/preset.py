"""A preset experiment as one object: what :func:`dpopt.experiments.reproduce` reads from it.

Every preset is an :class:`Experiment`: upper-case fields are its declared settings; problems and
methods come from callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._runner import Method, Problem


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
    figures, if any) build the rest."""

    NAME: str
    EPSILONS: tuple[float, ...]
    PAPER: list[dict[str, Any]]
    METRICS: tuple[str, ...]
    TABLE_METRICS: tuple[str, ...]
    PAPER_METRICS: tuple[str, ...]
    TEST_METRICS: tuple[str, ...]
    COMPARISONS: list[tuple[str, str]]
    epochs: int
    make_problem: Callable[[Any, str | None], tuple[Problem, dict[str, Any]]]
    make_methods: Callable[[Any, int, Any, float], list[Method]]
    delta_of: Callable[[Any], float]
    describe: Callable[[dict[str, Any]], str]
    PROBLEMS: tuple[Any, ...] = (None,)
    CURVES: dict[str, str | tuple[str, str]] = field(default_factory=lambda: {"training objective": "objective"})
    TUNED: dict[Any, Any] = field(default_factory=dict)
    TUNING_COST: dict[str, Any] = field(default_factory=dict)
    TUNING_SEEDS: tuple[int, ...] = (1000, 1001, 1002)
    TUNE_EPSILON: float | None = None
    SMOKE_PROBLEMS: tuple[Any, ...] | None = None
    LOG_POINTS: int = 40
    SEEDS: int = 10
    draw: Callable[[Path, dict[str, Any]], None] | None = None

    @property
    def keyed(self) -> bool:
        """Whether the rows name their problem (False for one unnamed problem)."""
        return self.PROBLEMS != (None,)

    def problems(self, quick: bool) -> tuple[Any, ...]:
        return self.SMOKE_PROBLEMS if quick and self.SMOKE_PROBLEMS else self.PROBLEMS

    def problem(self, data_dir: str | None, key: Any) -> tuple[Problem, dict[str, Any]]:
        return self.make_problem(key, data_dir)

    def methods(self, epsilon: float, key: Any) -> list[Method]:
        return self.make_methods(key, self.epochs, self.TUNED.get(key, {}), epsilon)

    def delta(self, key: Any) -> float:
        return self.delta_of(key)

    def notes(self, payload: dict[str, Any]) -> str:
        return self.describe(payload)

    def figures(self, out_dir: Path, payload: dict[str, Any]) -> None:
        if self.draw is not None:
            self.draw(out_dir, payload)

