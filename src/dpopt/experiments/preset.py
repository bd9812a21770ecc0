"""A preset experiment as an object: what :func:`dpopt.experiments.reproduce` reads from it.

A module can be a preset (``dp_srm_ijcnn1``); an :class:`Experiment` is the same interface for
presets that share code (the AClip presets): problems and methods come from callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._runner import Method, Params, Problem


@dataclass(frozen=True)
class Experiment:
    """Upper-case fields are the preset attributes documented in ``reproduce``; ``make_problem(key,
    data_dir)``, ``make_methods(key, epochs, tuned, epsilon)`` and ``delta_of(key)`` build the rest;
    ``SMOKE_PROBLEMS`` replace ``PROBLEMS`` under ``--quick`` when set."""

    NAME: str
    PROBLEMS: tuple[str, ...]
    EPSILONS: tuple[float, ...]
    PAPER: list[dict[str, Any]]
    METRICS: tuple[str, ...]
    TABLE_METRICS: tuple[str, ...]
    PAPER_METRICS: tuple[str, ...]
    TEST_METRICS: tuple[str, ...]
    COMPARISONS: list[tuple[str, str]]
    OURS: str
    epochs: int
    make_problem: Callable[[str, str | None], tuple[Problem, dict[str, Any]]]
    make_methods: Callable[[str, int, dict[str, Params], float], list[Method]]
    delta_of: Callable[[str], float]
    describe: Callable[[dict[str, Any]], str]
    CURVES: dict[str, str | tuple[str, str]] = field(default_factory=lambda: {"training objective": "objective"})
    TUNED: dict[str, dict[str, Params]] = field(default_factory=dict)
    TUNING_COST: dict[str, Any] = field(default_factory=dict)
    TUNING_SEEDS: tuple[int, ...] = (1000, 1001, 1002)
    TUNE_EPSILON: float | None = None
    SMOKE_PROBLEMS: tuple[str, ...] | None = None
    LOG_POINTS: int = 40
    SEEDS: int = 10

    def problems(self, quick: bool) -> tuple[str, ...]:
        return self.SMOKE_PROBLEMS if quick and self.SMOKE_PROBLEMS else self.PROBLEMS

    def problem(self, data_dir: str | None, key: str) -> tuple[Problem, dict[str, Any]]:
        return self.make_problem(key, data_dir)

    def methods(self, epsilon: float, key: str) -> list[Method]:
        return self.make_methods(key, self.epochs, self.TUNED.get(key, {}), epsilon)

    def delta(self, key: str) -> float:
        return self.delta_of(key)

    def notes(self, payload: dict[str, Any]) -> str:
        return self.describe(payload)
