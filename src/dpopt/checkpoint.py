"""Atomic files: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the same directory, flush and fsync it, ``os.replace`` it over
the target (atomic on POSIX), then fsync the directory so the rename survives a crash.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from . import _validate


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``; a clear error if the directory is not writable."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise _validate.DpoptError(f"out={str(path.parent)!r} must be a writable directory ({err.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _validate.DpoptError(f"could not write {str(path)!r}: {err.strerror}; nothing was replaced") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def save(path: Path, obj: Any) -> None:
    """Atomically ``torch.save`` ``obj`` to ``path``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes(path, buffer.getvalue())


def load(path: Path) -> Any:
    """Load a checkpoint written by :func:`save` (trusted input: it is unpickled)."""
    return torch.load(path, weights_only=False)


def remove_stale(path: Path) -> None:
    """Delete temporary files a killed writer of ``path`` left behind (never ``path`` itself)."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
