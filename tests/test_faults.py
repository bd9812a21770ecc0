"""Faults: SIGKILL inside checkpoint writes, a full disk, a read-only output directory, a dead
data-parallel process. Nothing written is ever corrupt, a resumed run is the uninterrupted run
(same ledger, same θ), and failures are clear errors within a bounded time."""

from __future__ import annotations

import atexit
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dpopt
from dpopt import _validate, atomic, checkpoint, distributed, journal
from dpopt.accounting import Ledger, count_steps
from dpopt.distributed import launcher

STEPS, EVERY = 30, 3

#: The run every test interrupts, as source for a child process and for this one.
PROBLEM = """
import torch, dpopt
gen = torch.Generator().manual_seed(0)
X = torch.randn(200, 4, generator=gen, dtype=torch.float64)
oracle = dpopt.oracles.Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0))
algo = dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=20)
"""


#: DP-SGD's options whose state a checkpoint must carry: the group key and the correlated noise's
#: ring (banded noise), the current clip C_t (adaptive clipping).
OPTIONS = {"": "", "bands": ", bands=4", "clip_quantile": ", clip_quantile=0.5, count_noise=5.0"}


def with_option(option: str) -> str:
    """:data:`PROBLEM` with DP-SGD's ``option``."""
    return PROBLEM.replace("batch_size=20)", f"batch_size=20{OPTIONS[option]})")


def problem(option: str = "") -> tuple[dpopt.DPSGD, dpopt.oracles.Logistic]:
    scope: dict = {}
    exec(with_option(option), scope)  # the same definition the child processes run
    return scope["algo"], scope["oracle"]


def run(path: Path | None = None, option: str = "") -> dpopt.History:
    algo, oracle = problem(option)
    return dpopt.run(algo, oracle, steps=STEPS, seed=7, log_every=1, checkpoint_path=path, checkpoint_every=EVERY)


def assert_same_run(got: dpopt.History, want: dpopt.History) -> None:
    assert torch.equal(got.theta, want.theta)
    assert [r["epsilon"] for r in got.records] == [r["epsilon"] for r in want.records]
    assert got.records == want.records


# ------------------------------------------------------------- SIGKILL inside checkpoint writes

#: Kill points inside atomic.write_bytes: the k-th call of a file-system function. Each
#: checkpoint is two atomic writes, the checkpoint's and then its journal entry's (dpopt.journal),
#: each calling fdopen once and fsync twice (the temporary file, then the directory, after the
#: rename). fsync 1 dies before the first rename (a whole temporary file is left), 6 right after
#: the second checkpoint's rename, before the journal records it, 8 right after the journal does;
#: the fdopen kill leaves a torn temporary file of the third checkpoint. (The key exists before.)
KILLS = [("fsync", 1), ("fsync", 6), ("fsync", 8), ("fdopen", 5)]


@pytest.mark.parametrize(("function", "call", "option"), [*((f, c, "") for f, c in KILLS), ("fsync", 6, "bands"),
                                                    ("fsync", 6, "clip_quantile")])
def test_sigkill_inside_a_checkpoint_write_then_resume(tmp_path, function, call, option):
    """Also for banded noise and adaptive clipping, killed right after the second checkpoint: the
    resumed run is the uninterrupted one bit for bit (their key, noise ring and clip are in the state)."""
    path = tmp_path / "ckpt.pt"
    journal.key()  # made now, so that the child's file-system calls are those of its checkpoints
    algo, oracle = problem(option)  # (its classes imported: a checkpoint decodes only those already imported)
    child = with_option(option) + f"""
import os, signal
from dpopt import atomic
real, calls = getattr(os, {function!r}), []
def dying(*args, **kwargs):
    calls.append(1)
    if len(calls) == {call}:
        if {function!r} == "fdopen":  # die half-way through writing the temporary file's bytes
            handle = real(*args, **kwargs)
            handle.write(b"partial")
            handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(atomic.os, {function!r}, dying)
dpopt.run(algo, oracle, steps={STEPS}, seed=7, log_every=1, checkpoint_path={str(path)!r}, checkpoint_every={EVERY})
"""
    killed = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    if path.exists():  # what the reader sees is a whole checkpoint, never a torn one
        saved = checkpoint.load(path)
        assert 0 < saved.step < STEPS and saved.step % EVERY == 0
        assert Ledger.from_state(saved.ledger).steps == count_steps(algo.planned_event(oracle.n, saved.step))
    resumed = run(path, option)
    assert_same_run(resumed, run(option=option))
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------- full disk, read-only directory


def test_a_full_disk_is_a_clear_error_and_loses_nothing(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    real, calls = os.fsync, []
    journal.key()  # made now, so that every fsync below is one of a checkpoint's

    def full(fd: int) -> None:
        calls.append(1)
        if len(calls) == 9:  # the third checkpoint's temporary file (calls 1-4, 5-8: two checkpoints and journals)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(_validate.DpoptError, match=r"could not write .*ckpt.pt.*: No space left on device; "
                                                   r"nothing was replaced"):
        run(path)
    monkeypatch.setattr(atomic.os, "fsync", real)
    assert checkpoint.load(path).step == 2 * EVERY  # the last good checkpoint is intact
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert_same_run(run(path), run())  # space freed: the run resumes to the uninterrupted result


def test_a_read_only_output_directory_is_a_clear_error(tmp_path, monkeypatch):
    """As root, permissions do not stop writes; the directory refuses them as a read-only mount does."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    journal.key()  # made now: the state folder is writable, --out is not
    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(_validate.DpoptError, match=r"out='.*' must be a writable directory \(Read-only file system\)"):
        run(tmp_path / "ckpt.pt")
    assert list(tmp_path.iterdir()) == []  # nothing (the run's lock is in the state folder)


# ----------------------------------------------------------------- a dead data-parallel process


def _dying_rank(victim: int) -> None:
    """Train on 2 ranks; rank ``victim`` is SIGKILLed at step 5 (mid-run, between collectives)."""
    algo, oracle = problem()
    sharded = distributed.Sharded(oracle)
    calls = []
    per_record = sharded.per_record

    def dying(theta, indices):
        calls.append(1)
        if len(calls) == 5 and distributed.rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return per_record(theta, indices)

    sharded.per_record = dying
    dpopt.run(algo, sharded, steps=STEPS, seed=7)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_dead_process_stops_the_run_within_a_timeout(victim):
    start = time.monotonic()
    with pytest.raises(_validate.DpoptError, match=f"rank {victim} died .*signal SIGKILL"):
        distributed.launch(_dying_rank, 2, victim)
    assert time.monotonic() - start < 60


def _aborts_at_exit() -> int:
    """Returns, then aborts during interpreter teardown (as gloo's threads have been seen to)."""
    atexit.register(os.abort)
    return distributed.rank()


def test_a_rank_that_returned_is_not_lost_to_a_crash_in_interpreter_teardown():
    """Finding (CI): a rank that had finished died of SIGABRT ("terminate called without an active
    exception") and the whole launch failed. A rank leaves without the teardown once its outcome
    is written."""
    assert distributed.launch(_aborts_at_exit, 2) == [0, 1]


def _aborts_in(victim: int) -> None:
    if distributed.rank() == victim:
        os.abort()  # what std::terminate does


def test_a_rank_killed_by_a_signal_reports_where_its_python_code_was():
    with pytest.raises(_validate.DpoptError, match=r"(?s)rank 1 died \(signal SIGABRT\).*line \d+ in _aborts_in"):
        distributed.launch(_aborts_in, 2, 1)


class _Exiting:
    """A rank process seen by the launcher: running for ``running`` reads of its exit code, then
    exited with ``code``."""

    def __init__(self, code: int, running: int) -> None:
        self.code, self.running, self.sentinel = code, running, None

    @property
    def exitcode(self) -> int | None:
        self.running -= 1
        return None if self.running >= 0 else self.code


@pytest.mark.parametrize("running", range(6))
def test_a_rank_that_dies_while_the_others_finish_is_reported(monkeypatch, tmp_path, running):
    """Finding (CI, one core busy): rank 0 finished, rank 1 died of SIGABRT just after the
    launcher's failure check and before its loop's exit test, and launch read rank 1's missing
    result file (FileNotFoundError). Every read of the exit codes must see the death, whenever it
    happens (``running = 0``: both ranks had exited before the first look)."""
    monkeypatch.setattr(launcher, "connection", type("Waiting", (), {"wait": staticmethod(lambda *a, **k: [])}))
    ranks = [_Exiting(0, 0), _Exiting(-signal.SIGABRT, running)]
    with pytest.raises(_validate.DpoptError, match=r"rank 1 died \(signal SIGABRT\)"):
        launcher._supervise(ranks, [0, 0], 10.0, tmp_path)


def test_data_parallel_runs_refuse_per_process_noise(capsys):
    from dpopt.cli import main

    assert main(["run", "--algorithm", "dp-gd", "--epsilon", "1", "--nproc", "2", "--noise", "secure"]) == 2
    assert capsys.readouterr().err == ("dpopt: error: noise='secure' draws independently in every process; "
                                       "data-parallel runs (2 processes) need noise='torch' (one draw from the "
                                       "shared seed)\n")
