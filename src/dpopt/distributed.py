"""Data-parallel training over ``torch.distributed``: the same algorithms, the same run.

Every rank builds the same full oracle, wraps it in :class:`Sharded` and calls the unchanged
:func:`dpopt.run` with the same seed. What each rank does at step t:

1. Sampling. The sampling generator is seeded identically on every rank, so every rank draws
   the **same** batch B_t (a Poisson batch stays one Poisson sample of the whole data set, of
   the rate the ledger accounts for; nothing is sampled per rank).
2. Clipped sums. Rank r takes its share B_t^r = B_t[r::K] (K ranks; the shares partition
   B_t, some may be empty), computes its records' per-record vectors and their norms, clips
   them with the usual weights w_i = min(1, C/‖v_i‖), and sums them; the K local sums are
   all-reduced (SUM), so every rank holds

       Σ_r Σ_{i∈B_t^r} w_i v_i  =  Σ_{i∈B_t} w_i v_i,

   the clipped sum of the whole batch (a record's weight depends on its own vector only, so
   clipping per share is clipping per record). Multi-term sums (DP-SRM's clipped gradient and
   clipped gradient difference) are all-reduced term by term; oracle gradient sums
   (AClip's batch sum) are all-reduced the same way.
3. Noise. :func:`dpopt.mechanisms.gaussian` adds N(0, (zΔ)² I) drawn from the noise
   generator, which is also seeded identically everywhere: all ranks add the **same single
   draw** to the same all-reduced sum. The released value is exactly the single-process one
   (up to the summation order of floating-point additions), noise enters once, not K times.

Privacy argument: every release is the single-process mechanism's release, computed in
pieces: the same sampled batch (same sampling rate, same neighbouring relation), the same
clipped sum with the same sensitivity (Δ = Σ_k |s_k| C_k, or twice that under replace-one;
:func:`dpopt.clipping.clip_sum` still makes the only :class:`~dpopt.mechanisms.Bounded`, from
the local norms and the all-reduced sum) and one Gaussian draw of the same scale. So every
rank's ledger records the same events and reports the same ε(δ) as one process would; the
privacy of a run does not depend on the number of processes. (The shared noise seed is as
secret as in one process: it lives only inside the training processes.)

Not sharded (computed redundantly, identically, on every rank, by the full oracle): ``loss``,
``gradient``, ``error``, ``per_record_loss`` (DP-AGD's candidate scores), ``regulariser`` and
every other attribute. Every rank holds the whole data set.

Launching: ``dpopt run --nproc K`` (:func:`launch`: K processes on this machine, meeting
through a file in a private folder, gloo on the loopback interface; they die with the launcher,
and a rank that stops answering is reported within ``--rank-timeout``), or
``torchrun --nproc-per-node K -m dpopt.cli run ...`` (each process joins torchrun's group via
:func:`init_from_env`). Either way rank 0 alone writes results and checkpoints and prints; the
other ranks train silently.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import connection
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from ._validate import DpoptError, positive, positive_int
from .clipping import PerRecord

HOST = "127.0.0.1"


def world_size() -> int:
    """Processes in the default group (1 when there is none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 when there is none)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def shared_secret_seed() -> int:
    """A seed drawn from the operating system by rank 0 and sent to every rank: data-parallel ranks
    must add one shared noise draw and sample one shared batch, and the seed must stay secret
    (it never leaves the run's processes)."""
    seed = torch.tensor([int.from_bytes(os.urandom(8), "little") >> 1], dtype=torch.int64)
    dist.broadcast(seed, src=0)
    return int(seed)


class Sharded:
    """``oracle`` for one rank of a data-parallel run (every rank wraps the same full oracle).

    ``per_record(θ, B)`` and ``gradient_sum(θ, B)`` work on this rank's share ``B[rank::world]``
    and all-reduce the sums; everything else is delegated to ``oracle`` (see the module
    docstring). ``group``: the process group (default: the default group).
    """

    shares_noise = True  #: every rank must add the same noise draw (:func:`dpopt.train.run` checks)

    def __init__(self, oracle: Any, group: dist.ProcessGroup | None = None) -> None:
        self.oracle, self.group = oracle, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.n, self.dim = oracle.n, oracle.dim

    def share(self, indices: Tensor) -> Tensor:
        """This rank's part of a batch: every ``world``-th record from position ``rank``."""
        return indices[self.rank::self.world]

    def all_reduce(self, local: Tensor) -> Tensor:
        """Σ over ranks of ``local`` (in place; every rank must call this in the same order)."""
        collective(dist.all_reduce, local, op=dist.ReduceOp.SUM, group=self.group)
        return local

    def per_record(self, theta: Tensor, indices: Tensor) -> ShardedRows:
        share = self.share(indices)
        return ShardedRows(self.oracle.per_record(theta, share), len(indices), len(share), self)

    def gradient_sum(self, theta: Tensor, indices: Tensor | None) -> Tensor:
        everyone = torch.arange(self.n) if indices is None else indices
        return self.all_reduce(self.oracle.gradient_sum(theta, self.share(everyone)).clone())

    # delegated: the full oracle on every rank
    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        return self.oracle.loss(theta, indices)

    def gradient(self, theta: Tensor) -> Tensor:
        return self.oracle.gradient(theta)

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        return self.oracle.per_record_loss(thetas, indices)

    def regulariser(self, theta: Tensor) -> Tensor:
        return self.oracle.regulariser(theta)

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        return self.oracle.error(theta, X, y)

    def __getattr__(self, name: str) -> Any:  # flat_params, load, reg, engine, ...
        if name == "oracle":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.oracle, name)


def collective(call: Callable[..., Any], *args: Any, group: dist.ProcessGroup | None = None, **kwargs: Any) -> None:
    """``call(*args, group=group, **kwargs)``, a collective; a failure (a process died, or none
    answered within the process group's timeout) is a :class:`~dpopt._validate.DpoptError` saying so."""
    try:
        call(*args, group=group, **kwargs)
    except RuntimeError as err:
        raise DpoptError(f"rank {dist.get_rank(group)}: {call.__name__} failed, a process of the run died or "
                         f"stopped answering ({str(err).splitlines()[0]})") from err


@dataclass(frozen=True)
class ShardedRows:
    """A :class:`~dpopt.clipping.PerRecord` of one rank: ``local`` holds this rank's share of a
    batch of ``size`` records (``local_size`` of them).

    ``norms()`` are the local records' norms (``[local_size]``); ``weighted_sum(w)`` is the
    local weighted sum all-reduced over the ranks, i.e. the sum over the whole batch. ``w`` is
    per local record (what :func:`~dpopt.clipping.clip_sum` passes, computed from ``norms()``)
    or per batch record (``[size]``, e.g. STORM's ones), then this rank's share of it is used.
    ``a - b`` (DP-SRM: the same records at two points) subtracts the local rows.
    """

    local: PerRecord
    size: int
    local_size: int
    oracle: Sharded

    def norms(self) -> Tensor:
        return self.local.norms()

    def weighted_sum(self, weights: Tensor) -> Tensor:
        if len(weights) == self.size and self.size != self.local_size:
            weights = self.oracle.share(weights)
        elif len(weights) != self.local_size:
            raise ValueError(f"weights of length {len(weights)}: expected {self.local_size} (this rank's records) "
                             f"or {self.size} (the batch)")
        return self.oracle.all_reduce(self.local.weighted_sum(weights).contiguous())

    def __sub__(self, other: ShardedRows) -> ShardedRows:
        if not isinstance(other, ShardedRows):
            return NotImplemented
        if (other.size, other.local_size) != (self.size, self.local_size):
            raise ValueError("sharded rows can only be subtracted on the same records")
        return ShardedRows(self.local - other.local, self.size, self.local_size, self.oracle)


class Local:
    """Federated clients and their server in one process (the default backend of DIFF2).

    The interface every backend offers a federated algorithm: ``hosted(P)``, the clients this
    process computes for; ``rows(local)``, per-record vectors whose weighted sum reaches the
    server only (:func:`~dpopt.clipping.clip_sum` makes the Bounded sum there); ``is_server``,
    whether this process adds the noise; ``broadcast(x, event)``, the server's x and the event
    of the release it made, on every process (each process's ledger holds the server's events).
    """

    is_local = True
    is_server = True

    def hosted(self, clients: int) -> range:
        return range(clients)

    def rows(self, local: PerRecord) -> PerRecord:
        return local

    def broadcast(self, x: Tensor, event: dpa.GaussianDpEvent) -> tuple[Tensor, dpa.GaussianDpEvent]:
        return x, event


class TorchDistributed:
    """Federated clients on ``torch.distributed``: rank 0 is the server, ranks 1 … K − 1 host
    the clients (client p on rank 1 + p mod (K − 1), so several per rank when P > K − 1).

    A round: each client rank sums its clients' clipped vectors (records of clients it hosts
    only) and **gathers** the sum to rank 0 (point-to-point to the root: no rank receives
    another rank's message; never an all-reduce); rank 0 adds the sums in rank order, adds the
    noise once, updates x and broadcasts it. Nothing but x reaches a client. A gather or
    broadcast that fails (a process died, or none answered within the process group's
    timeout) raises a :class:`~dpopt._validate.DpoptError` saying so.
    """

    is_local = False

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    @property
    def is_server(self) -> bool:
        return dist.get_rank(self.group) == 0

    def hosted(self, clients: int) -> range:
        world, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        if world < 2:
            raise DpoptError(f"nproc={world} must be >= 2 for the torch backend (rank 0 is the server)")
        return range(0) if me == 0 else range(me - 1, clients, world - 1)

    def rows(self, local: PerRecord) -> PerRecord:
        return ToServer(local, self)

    def to_server(self, local: Tensor) -> Tensor:
        """Σ over client ranks of ``local`` on the server (rank order); zeros on a client."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.group))] if self.is_server else None
        collective(dist.gather, local, parts, dst=dist.get_global_rank(self.group, 0) if self.group else 0,
                   group=self.group)
        if parts is None:
            return torch.zeros_like(local)
        total = parts[1].clone()
        for part in parts[2:]:
            total += part
        return total

    def broadcast(self, x: Tensor, event: dpa.GaussianDpEvent) -> tuple[Tensor, dpa.GaussianDpEvent]:
        """The server's x and its release's ``GaussianDpEvent`` on every rank, in one message (x
        in float64 with the noise multiplier appended; a client's own ``event`` is ignored)."""
        packed = torch.cat([x.double().reshape(-1), x.new_tensor([event.noise_multiplier], dtype=torch.float64)])
        collective(dist.broadcast, packed, src=dist.get_global_rank(self.group, 0) if self.group else 0,
                   group=self.group)
        return packed[:-1].to(x.dtype).reshape(x.shape), dpa.GaussianDpEvent(float(packed[-1]))



@dataclass(frozen=True)
class ToServer:
    """A :class:`~dpopt.clipping.PerRecord` of a client rank whose weighted sum goes to the server."""

    local: PerRecord
    backend: TorchDistributed

    def norms(self) -> Tensor:
        return self.local.norms()

    def weighted_sum(self, weights: Tensor) -> Tensor:
        return self.backend.to_server(self.local.weighted_sum(weights))


def backend(name: str) -> Local | TorchDistributed:
    """The backend named ``name``: "local" or "torch"."""
    if name not in ("local", "torch"):
        raise DpoptError(f"backend={name!r} must be one of: local, torch")
    return Local() if name == "local" else TorchDistributed()


#: Seconds a launched rank may show no sign of life before the launcher stops the run.
RANK_TIMEOUT = 60.0
#: Seconds the ranks get to exit after SIGTERM before they are killed.
GRACE = 2.0
#: Signals that stop a launch: the launcher stops its ranks, removes its folder, then raises.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The loopback interface, for gloo's sockets (``GLOO_SOCKET_IFNAME``).
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
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


def launch(fn: Callable[..., Any], nproc: int, *args: Any, rank_timeout: float = RANK_TIMEOUT) -> list[Any]:
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


def _supervise(ranks: list[Any], beats: Any, rank_timeout: float, folder: Path) -> None:
    """Wait until every rank has exited 0; raise the first failure (see :func:`launch`). Each
    round decides from one reading of the exit codes, so a rank that dies between two readings
    is still seen as failed (not as finished)."""
    seen, alive_at = list(beats), [None] * len(ranks)  # last heartbeat count, and when it changed
    while True:
        codes = [process.exitcode for process in ranks]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:  # a rank killed by a signal first: the others' errors are usually its consequence
            rank = min(failed, key=lambda rank: (codes[rank] > 0, rank))
            raise _failure(rank, codes[rank], folder)
        if None not in codes:
            return
        connection.wait([process.sentinel for process, code in zip(ranks, codes) if code is None],
                        timeout=_beat_interval(rank_timeout))
        now = time.monotonic()
        for rank, process in enumerate(ranks):
            if beats[rank] != seen[rank]:
                seen[rank], alive_at[rank] = beats[rank], now
            elif alive_at[rank] is not None and process.exitcode is None and now - alive_at[rank] > rank_timeout:
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


def _stop(ranks: list[Any]) -> None:
    """SIGTERM (and SIGCONT, for a stopped rank) to every live rank; SIGKILL to those alive after
    :data:`GRACE` seconds; wait for all."""
    live = [process for process in ranks if process.pid is not None and process.exitcode is None]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
            os.kill(process.pid, signal.SIGCONT)
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


def _raise_stop(signum: int, frame: Any) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _beat_interval(rank_timeout: float) -> float:
    return min(1.0, rank_timeout / 4)


def _worker(rank: int, fn: Callable[..., Any], args: tuple, nproc: int, folder: str, beats: Any,
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


def _heartbeat(beats: Any, rank: int, interval: float, launcher: int) -> None:
    """Count up every ``interval`` seconds (the launcher's sign of life of this rank); exit at once
    if the launcher is gone (where the kernel does not see to it)."""
    while True:
        beats[rank] += 1
        if os.getppid() != launcher:
            os._exit(1)
        time.sleep(interval)



@contextlib.contextmanager
def resumable(path: Path) -> Iterator[Path]:
    """The checkpoint path this rank passes to :func:`dpopt.run`.

    Rank 0 (and a single process): ``path`` itself, the only one written. Other ranks: a private
    copy of ``path`` (if it exists) in a temporary directory removed afterwards, so every rank
    resumes from the same checkpoint while only rank 0 writes ``path``. All ranks have copied it
    before any rank trains (a barrier), so rank 0 never replaces it under a reader.
    """
    if world_size() == 1:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=f"dpopt-rank{rank()}-") as tmp:
        own = path if rank() == 0 else Path(tmp, path.name)
        if own != path and path.exists():
            shutil.copyfile(path, own)
        collective(dist.barrier)
        yield own
