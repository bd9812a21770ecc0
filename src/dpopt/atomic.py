"""Atomic file writes: a reader sees the old file or the new one, never half of one.

:func:`write_bytes` writes to a temporary file in the target's folder (``.<name>.<random>.tmp``,
mode 0600), flushes and fsyncs it, ``os.replace``-s it over the target (atomic on POSIX), then
fsyncs the folder so the rename survives a crash. :func:`create` makes a file once: of two
processes creating it at once, both keep the one linked first. :func:`remove_stale` deletes the
temporary files a killed writer left behind.

Checkpoints, results and figures, the journal and the checkpoint key are written through here;
nothing here needs torch, so the command line's accounting commands start without it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ._validate import DpoptError


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` (mode 0600); a clear error if the directory is not writable."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise DpoptError(f"out={str(path.parent)!r} must be a writable directory ({err.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise DpoptError(f"could not write {str(path)!r}: {err.strerror}; nothing was replaced") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text(path: Path, text: str) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode())


def create(path: Path, data: bytes) -> None:
    """Make ``path`` (mode 0600) holding ``data`` unless it exists: the bytes go to a temporary file
    in its folder, fsynced, which is then hard-linked as ``path``; if another process linked its
    own first, that file stays and this one is dropped. OSError (an unwritable folder) propagates."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def remove_stale(path: Path) -> None:
    """Delete temporary files a killed :func:`write_bytes` of ``path`` left behind (never ``path`` itself).

    Only while holding :func:`dpopt.lock.held` of ``path``: a live writer's temporary file
    looks the same."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
