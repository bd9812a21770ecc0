"""Shared machinery of the reproductions: methods, tuning by training objective, seeds, tests.

A :class:`Method` builds an (uncalibrated) algorithm and its number of steps from the data size,
the privacy target and its hyper-parameters; the runs of a private method take its
:class:`~dpopt.plan.Plan` calibrated to the target.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from ..accounting import scaled
from ..base import Algorithm, S
from ..jobs import Job, Pool
from ..json_types import JsonValue
from ..outputs import NOT_PRIVATE
from ..report import Curve, summarise
from ..resume import describe
from ..plan import Plan
from ..progress import bar as progress_bar
from ..train import History, Options, train
from .payload import Tuned

Params = dict[str, Any]
R = TypeVar("R")


@dataclass(frozen=True)
class Method:
    """A method of a reproduction: ``build(n, params) -> (algorithm, steps)``; ``grid`` is what
    is tuned (by final training objective); ``tuned[ε]`` the values chosen by the last tuning
    (``tuned[None]`` for a non-private method)."""

    name: str
    build: Callable[[int, Params], tuple[Algorithm[Any], int]]
    grid: dict[str, Sequence[JsonValue]]
    tuned: dict[float | None, Params] = field(default_factory=dict)
    private: bool = True
    #: Multiplies the calibrated noise multipliers. 1 for every private method; < 1 only for a
    #: comparison row labelled NOT PRIVATE (its ledger then reports the larger ε it really spent).
    noise_scale: float = 1.0
    #: How ``grid`` is searched: :func:`explore_grid`'s signature; None is :func:`explore_grid` itself.
    tuner: Callable[..., Tuned] | None = None
    #: Whether a run does not depend on its seed (no noise, no sampling, a deterministic output
    #: rule): then only the first seed is run, and the report says so.
    deterministic: bool = False
    #: How a run drives its calibrated plan: None is :func:`dpopt.train.train` (the algorithm's own
    #: update, :meth:`Problem.run`); else ``loop(params)`` gives the :class:`Loop` of the values
    #: ``params`` (e.g. a torch optimizer fed by :class:`dpopt.Private`'s releases).
    loop: Callable[[Params], Loop] | None = None


class Loop(Protocol):
    """A run of a calibrated plan other than the algorithm's own update: ``run(problem, plan, seed,
    log_every) -> History`` (logged as :meth:`Problem.run` logs); its ``repr`` names everything
    about it that changes the run (a saved run is found again by it). ``trajectory()``: what sets its
    iterates, the loop but for its output rule (e.g. a moving average of the iterates); loops of one
    trajectory run once together, ``run_outputs(problem, plan, seed, log_every, loops)`` giving each
    loop's history, the one its own ``run`` would give (but for its training time)."""

    def run(self, problem: Problem, plan: Plan[S], seed: int, log_every: int) -> History: ...

    def trajectory(self) -> Hashable: ...

    def run_outputs(self, problem: Problem, plan: Plan[S], seed: int, log_every: int,
                    loops: Sequence[Any]) -> list[History]: ...


@dataclass(frozen=True)
class Problem:
    """An oracle with its test-error function (``test_error(θ)``) and, optionally, more final
    metrics of the output θ (``extra_metrics(θ) -> {name: value}``) and of the whole run
    (``history_metrics(history) -> {name: value}``), both added to ``History.final``.
    ``theta0``: the starting point (default 0; a network's initial weights); ``train_metrics``:
    whether the run logs F and ‖∇F‖; ``log_metrics(θ) -> {name: value}``: more measurements at
    every log point and at the output (see :func:`dpopt.train.run`)."""

    oracle: Any
    test_error: Callable[[Tensor], float]
    extra_metrics: Callable[[Tensor], dict[str, float]] | None = None
    history_metrics: Callable[[History], dict[str, float]] | None = None
    theta0: torch.Tensor | None = None
    train_metrics: bool = True
    log_metrics: Callable[[Tensor], dict[str, float]] | None = None

    @property
    def queue_weight(self) -> float:
        """How early this problem's runs are queued where its experiment declares no run costs
        (:meth:`~dpopt.experiments.preset.Experiment.run_cost`): records × dimensions."""
        return float(self.oracle.n * self.oracle.dim)

    def run(self, plan: Plan[S], seed: int, log_every: int) -> History:
        """One run of ``plan`` on ``seed``, logged every ``log_every`` steps, with the papers'
        non-private measurements (labelled) merged in (:func:`with_diagnostics`)."""
        options = Options(seed=seed, test_error=self.test_error, log_every=log_every, progress=False,
                          diagnostics=True, train_metrics=self.train_metrics, diagnostic_sample=None,
                          log_metrics=self.log_metrics)
        return self.completed(train(plan, self.oracle, options, self.theta0))

    def completed(self, history: History) -> History:
        """A finished run's ``history`` with its diagnostics merged in (:func:`with_diagnostics`) and
        the problem's final metrics added."""
        history = with_diagnostics(history)
        if self.extra_metrics is not None:
            history.final.update(self.extra_metrics(history.theta))
        if self.history_metrics is not None:
            history.final.update(self.history_metrics(history))
        return history


def with_diagnostics(history: History) -> History:
    """``history`` with its diagnostics merged into ``records`` and ``final``, for a reproduction's
    tables and figures, which report the papers' non-private measurements (training objective,
    gradient norm, realised passes, times) labelled as such."""
    diagnostics = history.diagnostics
    assert diagnostics is not None, "a reproduction's runs are made with diagnostics"
    records = [private | logged for private, logged in zip(history.records, diagnostics["records"], strict=True)]
    return dataclasses.replace(history, records=records, final=history.final | diagnostics["final"])


def time_to_target(history: History, *, target_error: float, passes: str = "passes") -> dict[str, float]:
    """Training wall time, CPU time and data passes (the logged quantity ``passes``) at the first
    logged point whose test error is ≤ ``target_error`` (NaN if none), and whether it was reached
    (1 or 0)."""
    hit = next((r for r in history.records if r["test_error"] <= target_error), None)
    return {"time_to_target_s": hit["wall_time_s"] if hit else math.nan,
            "cpu_time_to_target_s": hit["cpu_time_s"] if hit else math.nan,
            "epochs_to_target": hit[passes] if hit else math.nan, "reached_target": float(hit is not None)}


def steps_for_passes(passes: float, n: int, first: int, rest: int) -> int:
    """Steps whose expected records visited, first + (T−1)·rest, stay within ``passes``·n (at least 1)."""
    return max(1, 1 + int((passes * n - first) // rest))


def run_seeds(method: Method, params: Params, problem: Problem, *, epsilon: float, delta: float,
              seeds: Sequence[int], log_points: int = 40, step_fraction: float = 1.0,
              pool: Pool | None = None, key: Hashable = None) -> list[History]:
    """Calibrate (private methods) once, then run ``method`` once per seed (in ``pool`` if given),
    for ``step_fraction`` of its steps (calibrated for that shorter run); a deterministic method
    on the first seed only."""
    return start_seeds(method, params, problem, epsilon=epsilon, delta=delta, seeds=seeds, log_points=log_points,
                       step_fraction=step_fraction, pool=pool, key=key)()


def start_seeds(method: Method, params: Params, problem: Problem, *, epsilon: float, delta: float,
                seeds: Sequence[int], log_points: int = 40, step_fraction: float = 1.0,
                pool: Pool | None = None, key: Hashable = None) -> Callable[[], list[History]]:
    """:func:`run_seeds` without waiting: the runs are queued in ``pool`` (so that the runs of
    several methods share the workers) and the returned function waits for their histories.
    Without a pool they run now."""
    return start_rows([(method, params, epsilon)], problem, delta=delta, seeds=seeds, log_points=log_points,
                      step_fraction=step_fraction, pool=pool, key=key)[0]


@dataclass(frozen=True)
class Planned:
    """What one row's runs are: the calibrated ``plan``, logged every ``log_every`` steps, on ``seeds``,
    by ``loop`` (None: the algorithm's own update)."""

    plan: Plan[Any]
    log_every: int
    seeds: tuple[int, ...]
    loop: Loop | None

    def shares_runs_with(self, other: Planned) -> bool:
        """Whether ``other``'s runs are these but for the loop's output rule (:meth:`Loop.trajectory`)."""
        return (self.loop is not None and other.loop is not None and self.plan == other.plan
                and (self.log_every, self.seeds) == (other.log_every, other.seeds)
                and self.loop.trajectory() == other.loop.trajectory())


def planned(method: Method, params: Params, problem: Problem, *, epsilon: float | None, delta: float,
            seeds: Sequence[int], log_points: int, step_fraction: float) -> Planned:
    """The runs of ``method`` with ``params`` at ``epsilon`` (calibrated once, for a private method),
    for ``step_fraction`` of its steps; a deterministic method's on the first seed only."""
    algorithm, steps = method.build(problem.oracle.n, params)
    steps = max(1, round(steps * step_fraction))
    # a reproduction runs at its paper's δ (AClip's is 1/n), which its results state beside every row
    plan = Plan(algorithm, n=problem.oracle.n, steps=steps, delta=delta, allow_large_delta=True)
    if method.private:
        assert epsilon is not None
        plan = plan.calibrated(epsilon)
        if method.noise_scale != 1.0:
            plan = plan.with_algorithm(scaled(plan.algorithm, method.noise_scale, plan.algorithm.noise_ratios))
    return Planned(plan, max(1, steps // log_points), tuple(seeds)[:1] if method.deterministic else tuple(seeds),
                   None if method.loop is None else method.loop(params))


def start_rows(rows: Sequence[tuple[Method, Params, float]], problem: Problem, *, delta: float, seeds: Sequence[int],
               log_points: int = 40, step_fraction: float = 1.0, pool: Pool | None = None,
               key: Hashable = None) -> list[Callable[[], list[History]]]:
    """:func:`start_seeds` of each row ``(method, params, ε)``, in order. Rows whose runs differ only in
    their outputs (:meth:`Planned.shares_runs_with`: e.g. the last iterate and a moving average of the
    same iterates, post-processing) share one run per seed (:class:`Together`), which gives each row
    the histories its own runs would give (but for their training time)."""
    runs = [planned(method, params, problem, epsilon=epsilon, delta=delta, seeds=seeds, log_points=log_points,
                    step_fraction=step_fraction) for method, params, epsilon in rows]
    shared: dict[int, list[int]] = {}  # the first row of each run -> the rows it gives
    for i, run in enumerate(runs):
        shared.setdefault(next((first for first in shared if runs[first].shares_runs_with(run)), i), []).append(i)
    waits: dict[int, Callable[[], list[History]]] = {}
    for first, rows_of_run in shared.items():
        run = runs[first]
        if len(rows_of_run) == 1:
            waits[first] = _started([Training(run.plan, run.log_every, seed, run.loop) for seed in run.seeds],
                                    problem, pool, key)
            continue
        loops = tuple(cast(Loop, runs[i].loop) for i in rows_of_run)
        if pool is not None:  # announced as each row's runs
            pool.expect(-(len(rows_of_run) - 1) * len(run.seeds))
        together = _started([Together(run.plan, run.log_every, seed, loops) for seed in run.seeds], problem, pool, key)
        waits |= {i: functools.partial(_output, together, k) for k, i in enumerate(rows_of_run)}
    return [waits[i] for i in range(len(runs))]


def _output(together: Callable[[], list[list[History]]], k: int) -> list[History]:
    """The ``k``-th output's history of each seed's run together."""
    return [histories[k] for histories in together()]


def _started(jobs: Sequence[Job[Problem, R]], problem: Problem, pool: Pool | None,
             key: Hashable) -> Callable[[], list[R]]:
    """``jobs`` queued in ``pool`` (or run now, without one), and a function that waits for their results."""
    if pool is not None:
        futures = [pool.start(job, problem, key) for job in jobs]
        return lambda: [future.result() for future in futures]
    results = [job.run(problem) for job in jobs]
    return lambda: results


@dataclass(frozen=True)
class Training:
    """A reproduction's job (:class:`dpopt.jobs.Job`): one training run of the calibrated ``plan``
    on ``seed``, logged every ``log_every`` steps, by ``loop`` (None: the algorithm's own update);
    its result is the :class:`~dpopt.train.History`."""

    plan: Plan[Any]
    log_every: int
    seed: int
    loop: Loop | None = None

    def run(self, problem: Problem) -> History:
        if self.loop is None:
            return problem.run(self.plan, self.seed, self.log_every)
        return self.loop.run(problem, self.plan, self.seed, self.log_every)

    def described(self, problem: Problem) -> dict[str, str]:
        """The problem's oracle and starting point, the calibrated plan, the logging, the seed and
        the loop (if any)."""
        loop = {} if self.loop is None else {"loop": self.loop}
        return _described(self.plan, problem, self.seed, log_every=self.log_every, **loop)


@dataclass(frozen=True)
class Together:
    """A reproduction's job (:class:`dpopt.jobs.Job`) for the rows whose runs differ only in their
    outputs: one training run of the calibrated ``plan`` on ``seed``, logged every ``log_every``
    steps, by ``loops`` (of one trajectory, :meth:`Loop.trajectory`); its result is each loop's
    :class:`~dpopt.train.History`, in order (:meth:`Loop.run_outputs`)."""

    plan: Plan[Any]
    log_every: int
    seed: int
    loops: tuple[Loop, ...]

    def run(self, problem: Problem) -> list[History]:
        return self.loops[0].run_outputs(problem, self.plan, self.seed, self.log_every, self.loops)

    def described(self, problem: Problem) -> dict[str, str]:
        """:meth:`Training.described` with every loop."""
        return _described(self.plan, problem, self.seed, log_every=self.log_every, loops=self.loops)


def _described(plan: Plan[Any], problem: Problem, seed: int, **settings: object) -> dict[str, str]:
    """The problem's oracle and starting point, the calibrated plan, the seed and ``settings``."""
    theta0 = None if problem.theta0 is None else hashlib.sha256(
        problem.theta0.detach().cpu().numpy().tobytes()).hexdigest()
    return describe(plan.algorithm, problem.oracle, seed=seed, theta0=theta0, train_metrics=problem.train_metrics,
                    steps=plan.steps, delta=plan.delta, **settings)


def grid_points(grid: Mapping[str, Sequence[object]]) -> list[Params]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[key] for key in keys))]


def explore_grid(method: Method, problem: Problem, *, epsilon: float, delta: float, seeds: Sequence[int],
                 progress: bool = False, pool: Pool | None = None, key: Hashable = None) -> Tuned:
    """Every grid point on ``seeds`` (distinct from the evaluation seeds); the point with the
    lowest mean final training objective wins (diverged runs count as +∞). Returns the choice,
    every point's score and the cost (runs, wall seconds), labelled NOT PRIVATE: the scores are
    training objectives without noise and the tuning is not privacy-accounted (the private
    selection is :func:`dpopt.tuning.tune`)."""
    start = time.perf_counter()
    scores: list[Params] = []  # {"params": the point, "objective": its score}
    points = grid_points(method.grid)
    if pool is not None:
        pool.expect(len(points) * (1 if method.deterministic else len(seeds)))
    with progress_bar(len(points), desc=f"tune {method.name} ε={epsilon}", unit="point", enabled=progress) as bar:
        for params in points:
            histories = run_seeds(method, params, problem, epsilon=epsilon, delta=delta, seeds=seeds, log_points=1,
                                  pool=pool, key=key)
            objectives = [h.final["objective"] for h in histories]
            score = float(np.mean(objectives)) if all(math.isfinite(o) for o in objectives) else math.inf
            scores.append({"params": params, "objective": score})
            bar.update()
    best = min(scores, key=lambda s: s["objective"])
    return {"label": NOT_PRIVATE, "chosen": best["params"], "scores": scores,
            "cost": {"runs": len(scores) * len(seeds), "wall_time_s": time.perf_counter() - start}}


def metrics(histories: Sequence[History], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Mean (std) over seeds of each final metric in ``names`` (NaN where a method does not report it)."""
    return {name: summarise([h.final.get(name, math.nan) for h in histories]) for name in names}


#: Curves of a function of a logged quantity: name → (logged quantity, function).
DERIVED_CURVES: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "grad_norm_sq": ("grad_norm", np.square), "test_accuracy": ("test_error", lambda error: 1 - error)}


def mean_curve(histories: Sequence[History], metric: str, x: str = "passes") -> Curve:
    """(mean of ``x``, mean of ``metric``, its standard deviation (ddof 1; None for one seed)) over
    seeds at the logged steps; a metric of :data:`DERIVED_CURVES` is the mean of the function of its
    logged quantity (‖∇F‖²: the mean of the squares). A run that stopped early (diverged) counts as
    NaN where it has no record, so the mean of ``metric`` is NaN there (the x of the others is kept)."""
    logged, function = DERIVED_CURVES.get(metric, (metric, np.asarray))
    length = max(len(h.records) for h in histories)

    def padded(values: list[float]) -> np.ndarray:
        return np.concatenate([np.asarray(values, dtype=float), np.full(length - len(values), np.nan)])

    xs = np.nanmean([padded([r[x] for r in h.records]) for h in histories], axis=0)
    values = np.array([function(padded([r[logged] for r in h.records])) for h in histories])
    return Curve(xs, values.mean(axis=0), values.std(axis=0, ddof=1) if len(histories) > 1 else None)
