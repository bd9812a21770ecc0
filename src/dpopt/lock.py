"""One run at a time per checkpoint: the advisory lock of a run's output.

:func:`held` holds an exclusive ``flock`` (via ``filelock``) on the checkpoint's lock file for
as long as its context lasts, and writes the holder (pid, host, start time) into that file. A
second run on the same checkpoint is refused with a line naming the holder. The kernel drops
the lock of a process that ends, however it ends, so the lock of a killed run is stale by
construction and the next run takes it over (and replaces the holder line). The lock file is
left in place (removing it would let two runs lock two different files of the same name), so it
is kept in the state folder (:func:`lock_file`: ``locks/`` there, one per checkpoint path), not
beside the checkpoint: a finished run leaves nothing in ``--out`` but its own files. Runs are
excluded per machine (per state folder), as the journal's records are: two machines writing one
shared ``--out`` are not.

One layer takes it: the training loop (:func:`dpopt.train.train`), for a run with a checkpoint,
from before the checkpoint is read until its last one is written, and releases it however the
run ends. ``dpopt run`` takes no lock of its own: it checks its request, the data and the plan
before training, so a run refused before then leaves nothing in ``--out``; it refuses an
``--out`` that holds a finished run, and writes its results (atomically) after the run. Within
one process the lock is reentrant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import filelock

from . import journal
from ._validate import DpoptError


@contextlib.contextmanager
def held(checkpoint: Path) -> Iterator[None]:
    """Hold the lock of ``checkpoint`` (creating its directory), or raise a one-line
    :class:`~dpopt._validate.DpoptError` naming the run that holds it."""
    checkpoint = Path(checkpoint)
    try:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DpoptError(f"out={str(checkpoint.parent)!r} must be a writable directory ({err.strerror})") from None
    path = lock_file(checkpoint)
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        lock = filelock.FileLock(path, is_singleton=True, on_acquired=_write_holder)
        lock.acquire(blocking=False)
    except filelock.Timeout:
        raise DpoptError(f"{str(checkpoint)!r} is held by another run ({_holder(path)}): wait for it to end, or use "
                         "another --out") from None
    except OSError as err:
        raise DpoptError(f"the lock file {str(path)!r} in the state folder could not be taken "
                         f"({err.strerror})") from None
    try:
        yield
    finally:
        lock.release()


def lock_file(checkpoint: Path) -> Path:
    """The lock file of ``checkpoint`` (whose folder exists): ``locks/<digest>.lock`` in the state
    folder (:func:`dpopt.journal.folder`), the digest that of the checkpoint's resolved path."""
    where = Path(checkpoint).parent.resolve() / Path(checkpoint).name
    return journal.folder() / "locks" / f"{hashlib.sha256(str(where).encode()).hexdigest()[:32]}.lock"


def _write_holder(fd: int) -> None:
    """Replace the lock file's content by this process's holder line (called once the lock is ours)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, line.encode(), 0)


def _holder(path: Path) -> str:
    """The holder line of the lock file ``path``, in words."""
    try:
        holder = json.loads(path.read_text())
        return f"pid {int(holder['pid'])} on host {holder['host']}, started {holder['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
