"""Shared machinery of the reproductions: methods, tuning by training objective, seeds, tests.

A :class:`Method` builds an (uncalibrated) algorithm and its number of steps from the data size,
the privacy target and its hyper-parameters; the runs of a private method take its
:class:`~dpopt.plan.Plan` calibrated to the target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import multiprocessing
import signal
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from .. import _validate, checkpoint, journal
from ..accounting import scaled
from ..base import Algorithm, S
from ..json_types import JsonValue
from ..outputs import NOT_PRIVATE
from ..report import Curve, summarise
from ..resume import describe
from ..plan import Plan
from ..progress import bar as progress_bar
from ..train import History, Options, train
from .payload import Tuned

Params = dict[str, Any]
#: A job's problem and result (:class:`Job`).
P = TypeVar("P")
R = TypeVar("R")
P_contra = TypeVar("P_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


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
    #: How ``grid`` is searched: :func:`tune`'s signature; None is :func:`tune` itself.
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
    about it that changes the run (a saved run is found again by it)."""

    def run(self, problem: Problem, plan: Plan[S], seed: int, log_every: int) -> History: ...


@dataclass(frozen=True)
class Problem:
    """An oracle with its test-error function (``test_error(θ)``) and, optionally, more final
    metrics of the output θ (``extra_metrics(θ) -> {name: value}``) and of the whole run
    (``history_metrics(history) -> {name: value}``), both added to ``History.final``.
    ``theta0``: the starting point (default 0; a network's initial weights); ``train_metrics``:
    whether the run logs F and ‖∇F‖; ``log_metrics(θ) -> {name: value}``: more measurements at
    every log point and at the output (see :func:`dpopt.train.run`). ``run_cost``: what one run
    costs, relative to the other problems of its experiment (e.g. measured CPU seconds), which
    orders the queue (costliest first); None: the oracle's records × dimensions. The problems
    run together give it all or none."""

    oracle: Any
    test_error: Callable[[Tensor], float]
    extra_metrics: Callable[[Tensor], dict[str, float]] | None = None
    history_metrics: Callable[[History], dict[str, float]] | None = None
    theta0: torch.Tensor | None = None
    train_metrics: bool = True
    log_metrics: Callable[[Tensor], dict[str, float]] | None = None
    run_cost: float | None = None

    @property
    def queue_weight(self) -> float:
        """How early this problem's runs are queued: :attr:`run_cost`, else records × dimensions."""
        return self.run_cost if self.run_cost is not None else float(self.oracle.n * self.oracle.dim)

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
    algorithm, steps = method.build(problem.oracle.n, params)
    loop = None if method.loop is None else method.loop(params)
    steps = max(1, round(steps * step_fraction))
    # a reproduction runs at its paper's δ (AClip's is 1/n), which its results state beside every row
    plan = Plan(algorithm, n=problem.oracle.n, steps=steps, delta=delta, allow_large_delta=True)
    if method.private:
        plan = plan.calibrated(epsilon)
        if method.noise_scale != 1.0:
            plan = plan.with_algorithm(scaled(plan.algorithm, method.noise_scale, plan.algorithm.noise_ratios))
    log_every = max(1, steps // log_points)
    seeds = list(seeds)[:1] if method.deterministic else list(seeds)
    if pool is not None:
        futures = pool.submit(problem, plan, log_every, seeds, key, loop)
        return lambda: [future.result() for future in futures]
    histories = [Training(plan, log_every, seed, loop).run(problem) for seed in seeds]
    return lambda: histories


def writable(out_dir: Path) -> Path:
    """``out_dir``, made if missing, once a file could be created in it; else a DpoptError."""
    if out_dir.exists() and not out_dir.is_dir():
        raise _validate.DpoptError(f"out={str(out_dir)!r} must be a directory (it is a file)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as err:
        raise _validate.DpoptError(f"out={str(out_dir)!r} must be a writable directory ({err.strerror})") from None
    return out_dir


def source_digest() -> str:
    """A hash of dpopt's source files: saved runs of other code are not reused."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


class Job(Protocol[P_contra, R_co]):
    """A unit of work a :class:`Pool` runs on the problem its key names, and keeps: ``run(problem)``
    gives the result (a value :mod:`dpopt.checkpoint` can save), ``described(problem)`` everything
    that determines it (the name it is saved under)."""

    def run(self, problem: P_contra) -> R_co: ...

    def described(self, problem: P_contra) -> dict[str, str]: ...


@dataclass(frozen=True)
class Training:
    """A reproduction's job: one training run of the calibrated ``plan`` on ``seed``, logged every
    ``log_every`` steps, by ``loop`` (None: the algorithm's own update); its result is the
    :class:`~dpopt.train.History`."""

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
        theta0 = None if problem.theta0 is None else hashlib.sha256(
            problem.theta0.detach().cpu().numpy().tobytes()).hexdigest()
        loop = {} if self.loop is None else {"loop": self.loop}
        return describe(self.plan.algorithm, problem.oracle, seed=self.seed, theta0=theta0,
                        train_metrics=problem.train_metrics, steps=self.plan.steps, delta=self.plan.delta,
                        log_every=self.log_every, **loop)


@dataclass(frozen=True)
class Saved:
    """Finished jobs kept as files in ``folder``, authenticated: each is a checkpoint (written
    atomically, read without running code) tagged under the user's checkpoint ``key``
    (:func:`dpopt.journal.key`, kept outside ``--out``), holding the job's name and its result.

    A job's name is the sha256 of ``context`` (the experiment's or bench's name and
    :func:`source_digest`), the problem key and everything that determines the job
    (:meth:`Job.described`); its file is named by the name's first 32 hex digits. So a file is
    found again by the same job of the same code only; a changed configuration or a changed dpopt
    never picks up a stale one. :meth:`load` refuses, in one line, a file whose tag does not verify
    (edited, its digest recomputed or not; written under another key or without one) or that holds
    another job's name (a genuine file renamed or copied over this one's): whoever can write
    ``folder`` but not read the key cannot make a job's result."""

    folder: Path
    context: str
    key: checkpoint.Key = field(default_factory=journal.key, repr=False)

    @classmethod
    def of(cls, out: Path, context: str) -> Saved:
        """The saved jobs of the output folder ``out`` (in its ``runs`` folder); refused if the state
        folder is inside ``out`` (:func:`dpopt.journal.outside`)."""
        return cls(out / "runs", context, journal.key(out))

    def name(self, job: Job[P, object], problem: P, key: Hashable) -> str:
        """The name of ``job`` on ``problem`` (named ``key``): 64 hex digits."""
        described = {"context": self.context, "key": repr(key)} | job.described(problem)
        return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()

    def path(self, job: Job[P, object], problem: P, key: Hashable) -> Path:
        """The file of ``job`` on ``problem`` (named ``key``)."""
        return self.at(self.name(job, problem, key))

    def at(self, name: str) -> Path:
        """The file of the job named ``name``."""
        return self.folder / f"{name[:32]}.pt"

    def save(self, name: str, result: object) -> None:
        """Keep the result of the job named ``name``, tagged under the key."""
        checkpoint.save(self.at(name), {"job": name, "result": result}, self.key)

    def load(self, name: str) -> object:
        """The kept result of the job named ``name``; a DpoptError if its file is not authenticated
        under the key or holds another job."""
        path = self.at(name)
        fix = f"remove {str(path)!r} to run its job again"
        try:
            kept = checkpoint.load(path, self.key)
        except _validate.DpoptError as err:
            raise _validate.DpoptError(f"saved job: {err}; {fix}") from None
        if not (isinstance(kept, dict) and set(kept) == {"job", "result"} and kept["job"] == name):
            raise _validate.DpoptError(f"saved job {str(path)!r} holds another job's result (a file renamed or copied "
                                       f"over this job's); it was not used: {fix}")
        return kept["result"]


class Pool:
    """Where the jobs of a reproduction or a bench execute (:class:`Job`), and where they are kept.

    ``workers`` > 1: spawned worker processes (one torch thread each; they ignore SIGINT, the
    driver stops them); each builds the problem named ``key`` once, by ``make_problem(*args,
    key)`` — a module-level function, so it can be pickled — and keeps it for later jobs on the
    same key. ``workers`` = 1: the jobs execute in this process, on the problem given.

    With ``saved``, each finished job is saved as it completes, by the process that ran it, and a
    job already saved is loaded instead of run again, once its file is authenticated
    (:meth:`Saved.load`): an interrupted reproduction or bench resumes with the same results.
    ``progress``: a bar over the jobs (with an ETA; plain lines where standard error is not a
    terminal, :mod:`dpopt.progress`) whose total is what :meth:`expect` announced; loaded jobs leave it.
    """

    def __init__(self, workers: int, make_problem: Callable[..., object] | None = None, *args: object,
                 saved: Saved | None = None, progress: bool = False) -> None:
        self.saved, self._loaded = saved, 0
        self._paths: list[Path | None] = []
        self.bar = progress_bar(0, desc="runs", unit="run", enabled=progress, leave=True)
        if saved is not None:  # its folder is made by the first save: a refused command leaves none
            for stale in saved.folder.glob(".*.tmp"):  # a run killed while it was being saved
                stale.unlink(missing_ok=True)
        self._executor = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")
            self._executor = ProcessPoolExecutor(workers, mp_context=context,
                                                 initializer=partial(_worker_init, make_problem, args))

    def expect(self, runs: int) -> None:
        """``runs`` more runs will be submitted (the progress bar's total)."""
        self.bar.total += runs
        self.bar.refresh()

    def submit(self, problem: Problem, plan: Plan[S], log_every: int, seeds: Sequence[int],
               key: Hashable = None, loop: Loop | None = None) -> list[Future[History]]:
        """One training run of ``plan`` per seed (:class:`Training`, by ``loop``); their futures give
        the histories."""
        return [self.start(Training(plan, log_every, seed, loop), problem, key) for seed in seeds]

    def start(self, job: Job[P, R], problem: P, key: Hashable = None) -> Future[R]:
        """``job`` on ``problem`` (named ``key`` in the workers): loaded if saved, else queued in
        the workers or run now; the future gives its result."""
        kept = None if self.saved is None else (self.saved, self.saved.name(job, problem, key))
        path = None if kept is None else kept[0].at(kept[1])
        self._paths.append(path)
        if kept is not None and path is not None and path.exists():
            loaded = cast("R", kept[0].load(kept[1]))  # (the result its job gave when it was saved)
            self._loaded += 1
            self.bar.total = max(self.bar.n, self.bar.total - 1)
            self.bar.set_postfix_str(f"{self._loaded} loaded from {kept[0].folder}")
            return _finished(loaded)
        if self._executor is not None:
            future = self._executor.submit(_worker_run, (key, job, kept))
            future.add_done_callback(lambda _: self.bar.update())
            return future
        result = _finished(_run_and_save(job, problem, kept))
        self.bar.update()
        return result

    def saved_runs(self) -> tuple[int, int]:
        """(runs saved in the folder, runs submitted so far)."""
        return sum(path is not None and path.exists() for path in self._paths), len(self._paths)

    def close(self, *, abort: bool = False) -> None:
        """Wait for the queued runs; with ``abort``, drop them and stop the workers now (a run in
        progress is lost; every finished one is saved)."""
        self.bar.close()
        if self._executor is None:
            return
        if abort:  # (Python 3.14: executor.terminate_workers())
            for process in list((self._executor._processes or {}).values()):
                process.terminate()
        self._executor.shutdown(wait=True, cancel_futures=abort)


def _finished(result: R) -> Future[R]:
    future: Future[R] = Future()
    future.set_result(result)
    return future


_WORKER: dict[str, Any] = {}


def _worker_init(make_problem: Callable[..., object] | None, args: tuple[object, ...]) -> None:
    torch.set_num_threads(1)
    _validate.warnings_in_one_line()  # as the command line shows them
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the driver stops the workers,
    signal.signal(signal.SIGTERM, _unwind)  # by SIGTERM, which unwinds (no temporary file is left)
    _WORKER.update(make=make_problem, args=args, problems={})


def _unwind(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _worker_run(queued: tuple[Hashable, Job[P, R], tuple[Saved, str] | None]) -> R:
    key, job, kept = queued
    problems = _WORKER["problems"]
    if key not in problems:  # kept: the driver queues the jobs of every problem at once
        problems[key] = _WORKER["make"](*_WORKER["args"], key)
    return _run_and_save(job, problems[key], kept)


def _run_and_save(job: Job[P, R], problem: P, kept: tuple[Saved, str] | None) -> R:
    """``job``'s result, saved (``kept``: where, and the job's name) if given."""
    result = job.run(problem)
    if kept is not None:
        kept[0].save(kept[1], result)
    return result


@contextlib.contextmanager
def running(pool: Pool) -> Iterator[Pool]:
    """``pool`` while its jobs are queued and gathered, then closed. Interrupted (KeyboardInterrupt), it
    stops the workers and raises KeyboardInterrupt saying how many jobs are saved and how to resume; on
    any other error it stops them too (the finished jobs are saved)."""
    try:
        yield pool
    except KeyboardInterrupt:
        pool.close(abort=True)
        saved, submitted = pool.saved_runs()
        where = pool.saved.folder if pool.saved is not None else "no folder"
        raise KeyboardInterrupt(f"{saved} of the {submitted} runs started are saved in {where}; run the same "
                                "command again to resume (saved runs are loaded, not run again); no "
                                "report was written") from None
    except BaseException:
        pool.close(abort=True)
        raise
    pool.close()


def grid_points(grid: Mapping[str, Sequence[object]]) -> list[Params]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[key] for key in keys))]


def tune(method: Method, problem: Problem, *, epsilon: float, delta: float, seeds: Sequence[int],
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


def one_sided_p(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """Welch's t-test p-value for mean(ours) < mean(theirs), from each sample's mean and standard
    deviation (:func:`_moments`)."""
    if np.allclose(ours, ours[0]) and np.allclose(theirs, theirs[0]):
        return 0.0 if ours[0] < theirs[0] else 1.0
    (mean, std), (other_mean, other_std) = _moments(ours), _moments(theirs)
    return float(stats.ttest_ind_from_stats(mean, std, len(ours), other_mean, other_std, len(theirs), equal_var=False,
                                            alternative="less").pvalue)


def _moments(sample: Sequence[float]) -> tuple[float, float]:
    """(mean, standard deviation with ddof 1) of ``sample``; the deviation of equal values is exactly
    0. (Every seed can end at the same error, e.g. the majority class's: scipy's ``ttest_ind``
    finds such a sample "nearly identical" and warns of precision loss, though the test is exact.)"""
    values = np.asarray(sample, dtype=float)
    return float(values.mean()), 0.0 if len(values) == 1 or (values == values[0]).all() else float(values.std(ddof=1))


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
