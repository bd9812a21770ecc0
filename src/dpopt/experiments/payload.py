"""The in-memory results of a reproduction, as :func:`dpopt.experiments.reproduce` builds them and a
preset's notes, analyses and figures read them (before :func:`~dpopt.experiments.reproduce._classified`
turns them into results.json).

They are plain dicts; these types name their keys. A problem key is a string, or None for a
preset's one unnamed problem (its rows then have no ``problem``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

from .._validate import DpoptError
from ..json_types import JsonObject, JsonValue
from ..train import History

#: A problem of a preset: its name, or None for a preset's one unnamed problem.
ProblemKey = str | None
#: A t-test row: ``problem`` (keyed presets), ``epsilon``, ``ours``, ``baseline`` and ``p_<metric>``
#: for every test metric.
TTest = dict[str, str | float | None]


class Row(TypedDict):
    """A row of the report: a method at an ε on a problem, its final metrics summarised over seeds
    (mean and std per metric); ``_final`` (the per-seed values, for the t-tests) is dropped before
    the payload is returned."""

    problem: NotRequired[ProblemKey]
    algorithm: str
    epsilon: float | None
    seeds: int
    delta: float
    params: Mapping[str, object]
    metrics: dict[str, dict[str, float]]
    accountant: str
    neighboring_relation: str
    _final: NotRequired[dict[str, list[float]]]


class PaperRow(TypedDict):
    """A row of the paper's table: its keys and each metric's mean and std (None if not published)."""

    problem: NotRequired[str]
    algorithm: str
    epsilon: float | None
    delta: float
    metrics: dict[str, dict[str, JsonValue]]


class Tuned(TypedDict):
    """What a tuning of a method's grid returns (:func:`~dpopt.experiments._runner.explore_grid`'s form),
    labelled NOT PRIVATE: the values chosen, every point's score and the cost."""

    label: str
    chosen: dict[str, JsonValue]
    scores: Sequence[Mapping[str, object]]
    cost: dict[str, float]


class _Described(TypedDict):
    """What a reproduction's payload and its results.json both state about the run."""

    experiment: str
    randomness: str
    paper: list[PaperRow]
    seeds: int
    quick: bool
    log_points: int
    only: list[str]
    grids: dict[str, dict[str, Sequence[JsonValue]]]


class Payload(_Described):
    """A reproduction's results: its rows, the paper's, the t-tests, the problems' ``facts`` (one
    object per problem, keyed by the problem, or the one problem's object), the tuning, and
    ``_curves``: (problem, method, ε) → the runs' histories (for the figures; not in results.json;
    absent from a payload built without runs)."""

    rows: list[Row]
    facts: JsonObject
    t_tests: list[TTest]
    tuning: Mapping[str, Tuned] | JsonObject
    wall_time_s: float
    _curves: NotRequired[dict[tuple[ProblemKey, str, float | None], list[History]]]


class Diagnostics(TypedDict):
    """A row's non-private metrics, labelled."""

    label: str
    metrics: dict[str, dict[str, float]]


class ClassifiedRow(Row):
    """A row of results.json: its private metrics, and apart its non-private ones (labelled)."""

    diagnostics: Diagnostics


class ResultsDiagnostics(TypedDict):
    """What results.json holds apart, labelled NOT PRIVATE: facts and t-tests computed from
    training-data metrics, the tuning and the wall time."""

    label: str
    facts: list[JsonObject]
    t_tests: list[TTest]
    tuning: Mapping[str, Tuned] | JsonObject
    wall_time_s: float


class Results(_Described):
    """results.json (:func:`dpopt.experiments.reproduce`): every field classified."""

    rows: list[ClassifiedRow]
    facts: list[JsonObject]
    t_tests: list[TTest]
    diagnostics: ResultsDiagnostics


def named(key: ProblemKey) -> str:
    """The name of a keyed preset's problem (an error for the unnamed one)."""
    if key is None:
        raise DpoptError("this preset's problems are named: key=None names none of them")
    return key


def problem_facts(payload: Payload, key: str) -> JsonObject:
    """The facts of problem ``key`` of a keyed preset."""
    facts = payload["facts"][key]
    if not isinstance(facts, dict):
        raise DpoptError(f"facts[{key!r}] must be an object (the payload is not a keyed preset's)")
    return facts


def p_value(test: TTest, metric: str) -> float:
    """A t-test row's p-value of ``metric``."""
    value = test[f"p_{metric}"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DpoptError(f"t-test p_{metric}={value!r} must be a number")
    return value
