"""A process inside a run's process group: who it is, collectives that fail with a clear error,
and the checkpoint path each rank resumes from.

Without a group (one process) a process is rank 0 of 1 and every rank-0-only action is its own.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch.distributed as dist

from .._validate import DpoptError


def world_size() -> int:
    """Processes in the default group (1 when there is none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 when there is none)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def collective(call: Callable[..., object], *args: object, group: dist.ProcessGroup | None = None,
               **kwargs: object) -> None:
    """``call(*args, group=group, **kwargs)``, a collective; a failure (a process died, or none
    answered within the process group's timeout) is a :class:`~dpopt._validate.DpoptError` saying so."""
    try:
        call(*args, group=group, **kwargs)
    except RuntimeError as err:
        raise DpoptError(f"rank {dist.get_rank(group)}: {call.__name__} failed, a process of the run died or "
                         f"stopped answering ({str(err).splitlines()[0]})") from err


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
