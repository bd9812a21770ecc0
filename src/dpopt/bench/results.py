"""The types of what a bench writes (``bench.json``) and of what its jobs return."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ..json_types import JsonValue
from ..tuning.space import Value


class Tuned(TypedDict):
    """A :class:`Tuning` job's result: the selected θ's test metric; NOT PRIVATE, only if the job
    asked for diagnostics: the trials run and the wall time."""

    test_error: float
    trials_run: NotRequired[int]
    wall_time_s: NotRequired[float]


class Planned(TypedDict):
    """What a :class:`Tuning` job claims before it runs (:meth:`Tuning.planned`): the ε of tuning and
    training, and the expected data passes of the whole tuning."""

    epsilon: float
    expected_passes: float


class MethodCell(TypedDict):
    """A method at one ε of a problem: its metric's mean and std over seeds (``test_error``), the
    ε its tunings claim and their planned expected passes (:class:`Planned`)."""

    test_error: dict[str, float]
    epsilon_tuning_and_training: float
    expected_passes: float


class Cell(TypedDict):
    """One ε of a problem (:func:`cell`): every method's entry and the winner, or the methods that tie."""

    epsilon: float
    winner: str | None
    runner_up: str | None
    p_value: float | None
    significant: bool
    tied: list[str]
    methods: dict[str, MethodCell]


class ProblemResult(TypedDict):
    """A problem's part of ``bench.json``: what it is, how it was run, and its cells."""

    problem: str
    metric: NotRequired[str]
    task: dict[str, JsonValue]
    dataset: str
    model: str
    preparation: NotRequired[str]
    delta: float
    seeds: int
    trials: str
    steps: dict[str, int]
    grids: dict[str, dict[str, list[Value]]]
    cells: list[Cell]


class RunDiagnostics(TypedDict):
    """NOT PRIVATE: a method's wall time at one ε of a problem and its trials run, per seed."""

    problem: str
    epsilon: float
    algorithm: str
    wall_time_s: float
    trials_run: list[int]


class Diagnostics(TypedDict):
    label: str
    runs: list[RunDiagnostics]
    wall_time_s: float


class BenchResult(TypedDict):
    """``bench.json`` (without its command); ``diagnostics`` only if asked for."""

    problems: list[ProblemResult]
    randomness: NotRequired[str]
    diagnostics: NotRequired[Diagnostics]


class BenchRun(BenchResult):
    """What :func:`run_bench` returns for printing: the result, its Markdown and the folder written."""

    markdown: str
    out: str
