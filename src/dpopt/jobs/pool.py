"""Where the jobs of a reproduction or a bench run, and where they are kept.

A :class:`Job` is a unit of work on a problem; a :class:`Pool` runs jobs in this process or in
spawned worker processes, each worker building the problems it needs once; :class:`Saved` keeps
every finished job's result as an authenticated file, so that an interrupted reproduction or
bench resumes with the same results; :func:`running` stops the workers on an interrupt or an
error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import signal
import tempfile
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar, cast

import torch

from .. import _validate, checkpoint, journal
from ..progress import bar as progress_bar

#: A job's problem and result (:class:`Job`).
P = TypeVar("P")
R = TypeVar("R")
P_contra = TypeVar("P_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


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


@contextlib.contextmanager
def made_for(out_dir: Path) -> Iterator[Path]:
    """``writable(out_dir)`` while a command works in it; if the command fails (refused after the
    check, e.g. its data missing; or interrupted), the folders the check made are removed again
    where they are still empty: a refused command leaves nothing behind, saved runs stay."""
    missing = [folder for folder in (out_dir, *out_dir.parents) if not folder.exists()]  # deepest first
    try:
        yield writable(out_dir)
    except BaseException:
        for folder in missing:
            with contextlib.suppress(OSError):  # not empty: something was kept in it
                folder.rmdir()
        raise


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
    terminal, one every few seconds even while no job finishes: :mod:`dpopt.progress`) whose total
    is what :meth:`expect` announced; loaded jobs leave it.
    """

    def __init__(self, workers: int, make_problem: Callable[..., object] | None = None, *args: object,
                 saved: Saved | None = None, progress: bool = False) -> None:
        self.saved, self._loaded = saved, 0
        self._paths: list[Path | None] = []
        self.bar = progress_bar(0, desc="runs", unit="run", enabled=progress, leave=True, beat=True)
        if saved is not None:  # its folder is made by the first save: a refused command leaves none
            for stale in saved.folder.glob(".*.tmp"):  # a run killed while it was being saved
                stale.unlink(missing_ok=True)
        self._executor = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")
            self._executor = ProcessPoolExecutor(workers, mp_context=context,
                                                 initializer=partial(_worker_init, make_problem, args))

    def expect(self, runs: int) -> None:
        """``runs`` more runs will be submitted (the progress bar's total; negative: fewer than announced)."""
        self.bar.total += runs
        self.bar.refresh()

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
    any other error it stops them too (the finished jobs are saved).

    While a pool's workers run, this process computes on one torch thread: what it computes meanwhile
    (mnist-sota's scattering features, while the workers run the CNN's runs) shares the cores with
    them, and its threads would wait on each other at every parallel region while one of them is off
    the CPU (measured: on two threads beside two one-thread workers, each set of features took 186-229 s
    at about one core, against 30-34 s alone)."""
    threads = torch.get_num_threads()
    if pool._executor is not None:
        torch.set_num_threads(1)
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
    finally:
        torch.set_num_threads(threads)
    pool.close()
