"""How the processes of a run come to form one group, on this machine and nowhere else.

``dpopt run --nproc K`` (:func:`launch`): K processes on this machine, meeting through a file in a
private folder, gloo on the loopback interface; they die with the launcher, and a rank that stops
answering is reported within ``--rank-timeout``. ``torchrun --nproc-per-node K -m dpopt.cli run ...``:
each process joins torchrun's group via :func:`init_from_env`. Either way rank 0 alone writes
results and checkpoints and prints; the other ranks train silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._validate import DpoptError, positive, positive_int

R = TypeVar("R")
Beats = ctypes.Array[ctypes.c_ulonglong]  # each rank's heartbeat count, in shared memory

#: Seconds a launched rank may show no sign of life before the launcher stops the run.
RANK_TIMEOUT = 60.0
#: Seconds the ranks get to exit after SIGTERM before they are killed.
GRACE = 2.0
#: Signals that stop a launch: the launcher stops its ranks, removes its folder, then raises.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The loopback interface, for gloo's sockets (``GLOO_SOCKET_IFNAME``).
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
#: The loopback address.
HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def init_from_env(backend: str = "gloo", rank_timeout: float = RANK_TIMEOUT) -> bool:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE``,
    ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; ``env://``), if there is one of more than one
    process and no group exists yet. A collective that waits longer than ``rank_timeout`` seconds
    for another rank fails with a :class:`~dpopt._validate.DpoptError`. Returns whether this call
    created the group (then the caller destroys it with ``torch.distributed.destroy_process_group()``)."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=rank_timeout))
    return True


def launch(fn: Callable[..., R], nproc: int, *args: object, rank_timeout: float = RANK_TIMEOUT) -> list[R]:
    """``fn(*args)`` in ``nproc`` fresh processes (spawned) that form one gloo group on this
    machine (CPU); returns each rank's return value, by rank.

    ``fn`` and ``args`` must be picklable (``fn`` a module-level function). Each process uses
    ``cpu_count // nproc`` torch threads (at least 1).

    Nothing listens beyond this machine or this user: the ranks meet through a file store in a
    private (0700) temporary folder, and gloo's sockets are bound to the loopback interface.
    The ranks run in their own process group and die with the launcher (Linux: the kernel kills
    them when it exits, however it exits; elsewhere they notice within a second). SIGINT, SIGTERM
    or SIGHUP to the launcher stop the ranks (SIGTERM, then SIGKILL after :data:`GRACE`
    seconds), remove the folder and raise KeyboardInterrupt (SIGINT) or SystemExit(128 + signal).

    Failures, each a :class:`~dpopt._validate.DpoptError` raised here after every other rank
    was stopped: the first DpoptError a rank raises, with its message; a rank that dies (a
    signal, or an exit without an exception), naming the rank and the signal, with the Python
    stack of each of its threads for a fatal signal (SIGSEGV, SIGABRT, ...); a rank that shows
    no sign of life (stopped, or hung outside Python) for ``rank_timeout`` seconds, naming the
    rank. A collective that waits more than twice ``rank_timeout`` fails on the waiting rank. Any
    other exception in a rank raises a RuntimeError with that rank's traceback.
    """
    positive_int("nproc", nproc)
    positive("rank_timeout", rank_timeout)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or dist.is_initialized():
        raise DpoptError(f"nproc={nproc} needs a process that is not already part of a process group "
                         "(under torchrun, drop --nproc: torchrun starts the processes)")
    context = mp.get_context("spawn")
    beats = context.RawArray("Q", nproc)  # each rank's heartbeat count, in shared memory
    folder = tempfile.mkdtemp(prefix="dpopt-launch-")  # 0700: the rendezvous file, results, errors
    ranks = [context.Process(target=_worker, args=(rank, fn, args, nproc, folder, beats, rank_timeout, os.getpid()),
                             name=f"dpopt-rank-{rank}") for rank in range(nproc)]
    try:
        with _stopped_by_signals():
            for process in ranks:
                process.start()
            _supervise(ranks, beats, rank_timeout, Path(folder))
        return [pickle.loads(Path(folder, f"result-{rank}.pkl").read_bytes()) for rank in range(nproc)]
    finally:
        _stop(ranks)
        shutil.rmtree(folder, ignore_errors=True)


def _supervise(ranks: Sequence[BaseProcess], beats: Beats, rank_timeout: float, folder: Path) -> None:
    """Wait until every rank has exited 0; raise the first failure (see :func:`launch`). Each
    round decides from one reading of the exit codes, so a rank that dies between two readings
    is still seen as failed (not as finished)."""
    seen = list(beats)  # last heartbeat count
    alive_at: list[float | None] = [None] * len(ranks)  # and when it changed
    while True:
        codes = [process.exitcode for process in ranks]
        failed = {rank: code for rank, code in enumerate(codes) if code is not None and code != 0}
        if failed:  # a rank killed by a signal first: the others' errors are usually its consequence
            rank = min(failed, key=lambda rank: (failed[rank] > 0, rank))
            raise _failure(rank, failed[rank], folder)
        if None not in codes:
            return
        connection.wait([process.sentinel for process, code in zip(ranks, codes) if code is None],
                        timeout=_beat_interval(rank_timeout))
        now = time.monotonic()
        for rank, process in enumerate(ranks):
            if beats[rank] != seen[rank]:
                seen[rank], alive_at[rank] = beats[rank], now
            elif (last := alive_at[rank]) is not None and process.exitcode is None and now - last > rank_timeout:
                raise DpoptError(f"rank {rank} stopped responding: no sign of life for {rank_timeout:g} s (stopped, "
                                 "or hung outside Python; --rank-timeout sets the limit); the other ranks were "
                                 "stopped; completed checkpoints are intact")


def _failure(rank: int, exitcode: int, folder: Path) -> Exception:
    """The error that rank ``rank``'s exit with ``exitcode`` means."""
    error, trace = folder / f"error-{rank}.txt", folder / f"traceback-{rank}.txt"
    if error.exists():
        return DpoptError(error.read_text())
    if trace.exists():
        return RuntimeError(f"rank {rank} failed:\n{trace.read_text()}")
    cause = f"exit code {exitcode}" if exitcode > 0 else f"signal {_signal_name(-exitcode)}"
    faults = folder / f"fault-{rank}.txt"  # absent if the rank died before it could open it
    stacks = faults.read_text().split("\nExtension modules:")[0].strip() if faults.exists() else ""
    where = f"; its threads' Python stacks when it died:\n{stacks}" if stacks else ""
    return DpoptError(f"rank {rank} died ({cause}); the other ranks were stopped; completed checkpoints are "
                      f"intact{where}")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal
        return str(signum)


def _stop(ranks: Sequence[BaseProcess]) -> None:
    """SIGTERM (and SIGCONT, for a stopped rank) to every live rank; SIGKILL to those alive after
    :data:`GRACE` seconds; wait for all."""
    live = [process for process in ranks if process.pid is not None and process.exitcode is None]
    for pid in [process.pid for process in live if process.pid is not None]:  # (every live process has one)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + GRACE
    while any(process.exitcode is None for process in live) and time.monotonic() < deadline:
        connection.wait([process.sentinel for process in live if process.exitcode is None],
                        timeout=deadline - time.monotonic())
    for process in live:
        if process.exitcode is None:
            process.kill()
        process.join()


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While the ranks run, the :data:`STOPPING` signals raise here (so that :func:`launch` stops
    the ranks and cleans up), except those this process ignores (e.g. SIGINT in a background job);
    only possible in the main thread, elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOPPING}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, _raise_stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _beat_interval(rank_timeout: float) -> float:
    return min(1.0, rank_timeout / 4)


def _worker(rank: int, fn: Callable[..., object], args: tuple[object, ...], nproc: int, folder: str, beats: Beats,
            rank_timeout: float, launcher: int) -> None:
    """Rank ``rank`` of :func:`launch`: joins the group, runs ``fn(*args)``, writes its outcome to
    ``folder`` and leaves with ``os._exit``, without the interpreter's teardown: gloo's threads
    have been seen to call std::terminate there (SIGABRT) after everything was done. A fatal
    signal (SIGSEGV, SIGABRT, ...) writes the Python stack of every thread to ``fault-<rank>.txt``."""
    _die_with(launcher)
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the launcher alone, which stops the ranks
    for signum in STOPPING:  # unwind (temporary files, atomic writes) and exit quietly
        signal.signal(signum, _raise_stop)
    faults = open(Path(folder, f"fault-{rank}.txt"), "w")  # open until the process ends
    faulthandler.enable(faults, all_threads=True)
    threading.Thread(target=_heartbeat, args=(beats, rank, _beat_interval(rank_timeout), launcher),
                     daemon=True).start()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK  # this process's own environment: gloo's sockets on loopback
    store = dist.FileStore(str(Path(folder, "rendezvous")), nproc)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nproc,
                            timeout=timedelta(seconds=2 * rank_timeout))
    try:
        Path(folder, f"result-{rank}.pkl").write_bytes(pickle.dumps(fn(*args)))
        code = 0
    except DpoptError as err:
        Path(folder, f"error-{rank}.txt").write_text(str(err))
        code = 1
    except Exception:
        Path(folder, f"traceback-{rank}.txt").write_text(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _die_with(launcher: int) -> None:
    """Linux: the kernel sends this process SIGKILL when the launcher exits (PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it exited before the line above
        os._exit(1)


def _heartbeat(beats: Beats, rank: int, interval: float, launcher: int) -> None:
    """Count up every ``interval`` seconds (the launcher's sign of life of this rank); exit at once
    if the launcher is gone (where the kernel does not see to it)."""
    while True:
        beats[rank] += 1
        if os.getppid() != launcher:
            os._exit(1)
        time.sleep(interval)
