"""``dpopt bench``: which private optimiser to use, at which ε, with tuning in the budget.

The problems are data (``problems.toml`` beside this module). For every problem, ε and method,
the method is tuned privately (:func:`dpopt.tuning.tune`, the same total (ε, δ) for tuning and
training for every method) once per seed; a cell reports each method's test metric of the
selected θ under the key ``test_error`` (mean, std over seeds; the problem's ``metric`` says
which: ``test_error`` a misclassification rate, ``test_mse``/``test_mae``/``test_loss`` a
regression error, all lower-is-better), the ε of tuning and training, the planned expected data
passes of the whole tuning, the winner (lowest mean, unless another mean ties with it: :func:`cell`)
and Welch's one-sided p-value of the winner against the runner-up. The ε and the passes are
computed from each job's public settings and the calibration (:meth:`Tuning.planned`), never read
from a job's result. Wall times and trial counts are NOT PRIVATE diagnostics (they reveal the
number of trials): computed and written only when asked for (``diagnostics``).

Randomness (:class:`Randomness`): repeat-and-select is private only while the number of trials K,
the candidates and every trial's noise stay secret. A bench draws one secret per run from the
operating system, kept in the user's state folder, never in ``--out`` (:func:`randomness`), or
takes the user's ``--seed`` (then reproducible), and derives every job's randomness from it; the
outputs say which. The jobs saved in ``--out``/runs for a resume are authenticated under the
user's checkpoint key (:class:`~dpopt.jobs.Saved`).
"""

from __future__ import annotations

import json
import math
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _validate, atomic, report
from ..base import Digested
from ..outputs import NOT_PRIVATE
from ..jobs.preparation import described
from ..report import summarise
from ..tuning import Space, tuning_plan
from ..tuning.private import Dominated
from ..tuning.space import Value
from ..tuning.task import Task, builder, tune_task
from ..tuning.trials import trials_of
from .results import BenchResult, BenchRun, Cell, Planned, ProblemResult, RunDiagnostics, Tuned
from .secret import BENCH_ID as BENCH_ID, SEEDED as SEEDED, Randomness, randomness  # the bench's names too
from .tasks import build_task, preparation

if TYPE_CHECKING:
    from ..jobs import Pool

PROBLEMS = Path(__file__).with_name("problems.toml")
#: A winner's p-value below this is reported as significant.
SIGNIFICANCE = 0.05
#: A mean within this relative distance of the lowest one ties with it (:func:`cell`): closer than the
#: tables' four digits can show, and than a few seeds can resolve.
TIE = 1e-3


@dataclass(frozen=True)
class Method:
    """A method of a problem, by its ``name`` (the key of its table): the registered ``algorithm``
    (the table's ``algorithm`` key; default: the name) with the ``fixed`` settings for ``steps``
    steps, tuned over ``space`` (the table's ``grid``: its first values are the reference the noise is
    calibrated on; :func:`dpopt.tuning.tune`)."""

    name: str
    algorithm: str
    steps: int
    fixed: Mapping[str, Any]
    grid: Mapping[str, tuple[Value, ...]]

    @property
    def space(self) -> Space:
        return Space.grid(**self.grid)


@dataclass(frozen=True)
class Problem:
    """A declared problem: its ``task`` settings (``kind`` and the kind's keyword arguments,
    :mod:`dpopt.bench.tasks`), the privacy target, the cells' ε and seeds, and its methods.
    ``allow_large_delta`` (key ``allow_large_delta = true``) accepts a δ ≥ 1/n knowingly."""

    name: str
    task: Mapping[str, Any]
    delta: float
    validation_fraction: float
    epsilons: tuple[float, ...]
    seeds: int
    trials: Any
    methods: tuple[Method, ...]
    allow_large_delta: bool = False


def problems(variant: str | None = None, path: Path = PROBLEMS) -> dict[str, Problem]:
    """The problems declared in ``path``; with ``variant``, those that declare a block of that
    name, with its overrides (``quick``: the CI smoke version, every problem has one; ``main``:
    the compact comparison ``./dev run`` runs)."""
    try:
        declared = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise _validate.DpoptError(f"file={str(path)!r} is not a readable problems file: {err}") from None
    chosen = {name: _problem(name, spec, variant) for name, spec in declared.items()
              if variant is None or variant in spec}
    if not chosen:
        raise _validate.DpoptError(f"variant={variant!r}: no problem of {str(path)!r} declares such a block")
    return chosen


def _problem(name: str, spec: dict[str, Any], variant: str | None) -> Problem:
    overrides = spec[variant] if variant is not None else {}
    settings = spec | overrides
    fraction = settings.get("step_fraction", 1.0)
    trials = trials_of(settings["trials"]["mean"], settings["trials"].get("shape", 1.0))
    methods = tuple(Method(name, m.get("algorithm", name), max(1, round(fraction * m["steps"])), m.get("fixed", {}),
                           {key: tuple(values) for key, values in m["grid"].items()})
                    for name, m in spec["methods"].items())
    task = spec["task"] | overrides.get("task", {})  # a variant overrides single task settings
    return Problem(name, task, settings["delta"], settings["validation_fraction"], tuple(settings["epsilons"]),
                   settings["seeds"], trials, methods, settings.get("allow_large_delta", False))


@dataclass(frozen=True)
class Tuning:
    """A bench job (:class:`~dpopt.jobs.Job`): ``method`` tuned privately at
    ``epsilon`` with the secret seed ``seed`` (:meth:`Randomness.seed`; :func:`dpopt.tuning.task.tune_task`,
    ``trials`` trials on average); its result (:class:`Tuned`) is the test metric of the selected θ
    under ``test_error`` and, with ``diagnostics`` (NOT PRIVATE), the trials run and the wall time.
    What it claims is not in its result: :meth:`planned`."""

    method: Method
    trials: Any
    epsilon: float
    delta: float
    seed: int
    allow_large_delta: bool = field(default=False, repr=False)  # a permission: the result does not depend on it
    diagnostics: bool = False

    def run(self, task: Task) -> Tuned:
        clock = time.perf_counter()
        method = self.method
        tuned = tune_task(task, method.algorithm, method.fixed, space=method.space, trials=self.trials,
                          epsilon=self.epsilon, delta=self.delta, steps=method.steps, seed=self.seed,
                          diagnostics=self.diagnostics, allow_large_delta=self.allow_large_delta)
        result: Tuned = {"test_error": tuned.final.get("test_error", math.nan)}
        if tuned.diagnostics is not None:
            result["trials_run"] = int(tuned.diagnostics["trials_run"])
            result["wall_time_s"] = time.perf_counter() - clock
        return result

    def planned(self, task: Task) -> Planned:
        """The ε of the job's tuning and training and its planned expected passes (mean trials × one
        trial's passes), from its public settings and the calibration alone, as :func:`dpopt.tuning.tune`
        computes them before its first trial: what a table reports for a job, run or loaded, never read
        from its result."""
        method, n = self.method, task.oracle.n
        plan = tuning_plan(builder(method.algorithm, n, method.fixed)(method.space.reference()), trials=self.trials,
                           epsilon=self.epsilon, delta=self.delta, n=n, steps=method.steps,
                           allow_large_delta=self.allow_large_delta)
        return {"epsilon": plan.epsilon(), "expected_passes": self.trials.mean * Dominated(plan).passes}

    def described(self, task: Task) -> dict[str, str]:
        """The job's settings and the task's data (size and digest, where the oracle has one)."""
        oracle = task.oracle
        return {"job": repr(self), "n": str(oracle.n), "dim": str(oracle.dim),
                "data": oracle.data_digest if isinstance(oracle, Digested) else "no digest"}


def task_key(problem: Problem) -> str:
    """What names a problem's task in the workers: its declared settings and validation split."""
    return json.dumps({"settings": dict(problem.task), "validation_fraction": problem.validation_fraction},
                      sort_keys=True)


def task_of(data_dir: str | None, key: str) -> Task:
    """The task :func:`task_key` names (built once in each worker process)."""
    declared = json.loads(key)
    return build_task(declared["settings"], validation_fraction=declared["validation_fraction"], data_dir=data_dir)


def shown_command(argv: Sequence[str]) -> str:
    """The command line as the outputs show it: ``dpopt`` and ``argv`` with the value of ``--seed``
    replaced by ``<secret>`` (the guarantee rests on it staying secret)."""
    shown, hide = ["dpopt"], False
    for arg in argv:
        shown.append("<secret>" if hide else "--seed=<secret>" if arg.startswith("--seed=") else arg)
        hide = arg == "--seed"
    return " ".join(shown)


def bench(chosen: Sequence[Problem], pool: Pool, *, randomness: Randomness, data_dir: str | None = None,
          progress: bool = False, diagnostics: bool = False) -> BenchResult:
    """Every problem of ``chosen``, at each of its ε, every method tuned privately on seed slots 0,
    1, … (one :class:`Tuning` job each, seeded by ``randomness``, all queued in ``pool`` before any
    is waited for); each method's ε and passes from its plan (:meth:`Tuning.planned`). With
    ``diagnostics``, NOT PRIVATE: each job's trials run and wall time (they reveal K)."""
    started = time.perf_counter()
    queued = []
    for problem in chosen:
        key = task_key(problem)
        task = task_of(data_dir, key)
        allow = f"allow_large_delta = true in problem {problem.name!r} of the problems file"
        _validate.meaningful_delta(problem.delta, task.oracle.n, allow_large_delta=problem.allow_large_delta,
                                   override=allow)
        pool.expect(len(problem.epsilons) * len(problem.methods) * problem.seeds)
        tunings = {(epsilon, method.name): [Tuning(method, problem.trials, epsilon, problem.delta,
                                                   randomness.seed(slot, f"{problem.name}/{epsilon!r}/{method.name}"),
                                                   problem.allow_large_delta, diagnostics)
                                            for slot in range(problem.seeds)]
                   for epsilon in problem.epsilons for method in problem.methods}
        jobs = {at: [pool.start(tuning, task, key) for tuning in slots] for at, slots in tunings.items()}
        planned = {at: slots[0].planned(task) for at, slots in tunings.items()}  # (the slots differ in seed only)
        queued.append((problem, task.metric, jobs, planned))
    results: list[ProblemResult] = []
    runs_shown: list[RunDiagnostics] = []
    for problem, metric, jobs, planned in queued:
        cells: list[Cell] = []
        for epsilon in problem.epsilons:
            runs = {method.name: [future.result() for future in jobs[epsilon, method.name]]
                    for method in problem.methods}
            for name, rs in runs.items():
                if diagnostics:  # (every job then has them: a job asked for them is saved apart)
                    runs_shown.append({"problem": problem.name, "epsilon": epsilon, "algorithm": name,
                                       "wall_time_s": sum(r["wall_time_s"] for r in rs),
                                       "trials_run": [r["trials_run"] for r in rs]})
                if progress:
                    error = summarise([r["test_error"] for r in rs])
                    print(f"{problem.name} ε={epsilon:g} {name}: {metric} {error['mean']:.4f} ({error['std']:.4f})",
                          file=sys.stderr, flush=True)
            cells.append(cell(epsilon, runs, {name: planned[epsilon, name] for name in runs}))
        kind = problem.task["kind"]
        results.append({"problem": problem.name, "metric": metric, "task": dict(problem.task),
                        "dataset": problem.task.get("dataset", kind), "model": problem.task.get("model", kind),
                        "preparation": described(preparation(problem.task)),
                        "delta": problem.delta, "seeds": problem.seeds, "trials": str(problem.trials),
                        "steps": {m.name: m.steps for m in problem.methods},
                        "grids": {m.name: {k: list(values) for k, values in m.grid.items()} for m in problem.methods},
                        "cells": cells})
    result: BenchResult = {"problems": results, "randomness": randomness.origin}
    if diagnostics:
        result["diagnostics"] = {"label": NOT_PRIVATE + " (wall times and trial counts reveal the number of trials K, "
                                 "which repeat-and-select's guarantee needs kept secret)", "runs": runs_shown,
                                 "wall_time_s": time.perf_counter() - started}
    return result


def cell(epsilon: float, runs: Mapping[str, Sequence[Tuned]], planned: Mapping[str, Planned]) -> Cell:
    """The result of one ε from each method's jobs (``runs``: method → one :meth:`Tuning.run` result
    per seed) and plans (``planned``: method → :meth:`Tuning.planned`): every method's metric (mean,
    std over seeds), the ε its tunings claim and its planned passes; and the winner.

    The winner is the method of the lowest mean, with Welch's one-sided p-value against the
    runner-up (the next lowest mean), unless methods tie: a mean within a relative :data:`TIE` of
    the lowest (e.g. every method at the majority class's error). Then no method wins: ``tied``
    names the methods at the lowest mean, and the winner, runner-up and p-value are None."""
    from ..jobs.statistics import one_sided_p

    errors = {name: [r["test_error"] for r in rs] for name, rs in runs.items()}
    means = {name: summarise(values)["mean"] for name, values in errors.items()}
    ranked = sorted(means, key=lambda name: (math.isnan(means[name]), means[name]))  # a diverged (NaN) mean last
    best = means[ranked[0]]
    tied = [name for name in ranked if means[name] - best <= TIE * abs(best)] or ranked  # (all NaN: all tie)
    winner = ranked[0] if len(tied) == 1 else None
    runner_up = ranked[1] if winner is not None and len(ranked) > 1 else None
    p = None if winner is None else one_sided_p(errors[winner], errors[runner_up]) if runner_up else 0.0
    return {"epsilon": epsilon, "winner": winner, "runner_up": runner_up, "p_value": p,
            "significant": p is not None and p < SIGNIFICANCE,
            "tied": [name for name in tied] if winner is None else [],
            "methods": {name: {"test_error": {**summarise(errors[name])},
                               "epsilon_tuning_and_training": planned[name]["epsilon"],
                               "expected_passes": planned[name]["expected_passes"]}
                        for name in runs}}


def select(names: Sequence[str] | None, variant: str | None, path: Path = PROBLEMS) -> list[Problem]:
    """The problems of ``path`` named in ``names`` (by default all that have ``variant``), in their
    ``variant``."""
    declared = problems(variant, path)
    for name in names or ():
        _validate.one_of("problem" if variant is None else f"problem (with variant {variant!r})", name, declared)
    return [declared[name] for name in (names or declared)]


def run_bench(chosen: Sequence[Problem], *, out: Path, workers: int, seed: int | None, command: str,
              data_dir: str | None = None, progress: bool = False, diagnostics: bool = False) -> BenchRun:
    """``dpopt bench`` of the problems ``chosen``: run, write ``bench.json``, ``bench.md``, a figure per
    problem and ``summary.png`` to ``out``; the result (with its Markdown) for printing.

    The jobs run in ``workers`` processes; ``out`` and the state folder (outside ``out``: it holds
    the checkpoint key and the bench's secret) are checked before any work, and every finished job
    is saved in ``out``/runs as it completes, authenticated under the user's checkpoint key: run
    again, the same command loads them instead of running them (an interrupted bench resumes, with
    the secret :func:`randomness` kept in the state folder; ``seed``: the user's, or None); a saved
    job that is not authenticated is refused (:class:`~dpopt.jobs.Saved`).
    ``command``: the command line as the outputs show it (:func:`shown_command`). ``progress``: each
    cell's result on standard error as it completes. ``diagnostics``: the NOT PRIVATE trial counts
    and wall times in the result and the outputs (they reveal K)."""
    from ..jobs import Pool, Saved, made_for, running, source_digest
    from .tables import figures, markdown

    _validate.positive_int("workers", workers)
    saved = Saved.of(Path(out), f"bench {source_digest()}")  # (the state folder checked before out is made)
    with made_for(Path(out)) as out:
        secret = randomness(seed, out)
        pool = Pool(workers, task_of, data_dir, saved=saved)
        with running(pool):
            result = bench(chosen, pool, randomness=secret, data_dir=data_dir, progress=progress,
                           diagnostics=diagnostics)
        text = markdown(result, command)
        report.write_json(out / "bench.json", result | {"command": command})
        atomic.write_text(out / "bench.md", text)
        figures(out, result)
    return BenchRun(**result, markdown=text, out=str(out))
