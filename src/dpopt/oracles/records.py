"""Where an oracle's training records come from: tensors in memory, or a map-style Dataset read
lazily by index.

A :class:`Records` is ``n = len(records)`` records ``(x_i, y_i)`` that an oracle reads by index:
``gather(indices)`` stacks the records ``indices`` into a pair of tensors. :class:`Tensors` slices
two tensors ``X [n, ...]``, ``y [n, ...]``; :class:`Lazy` calls ``dataset[i]`` for each index
asked for (``__getitem__`` and ``__len__``: a ``torch.utils.data.Dataset``), so the data set need
not fit in memory: a step reads only its batch, a full pass reads it chunk by chunk.

Records collated by a DataLoader's own ``collate_fn`` (:class:`~dpopt.oracles.loaded.Loaded`,
whose ``pads`` is then true) may come padded to the longest record of each chunk, so a record's
padded length may depend on the records beside it. An oracle runs its module inside
:func:`chunks_of` its records, and a layer that would read such padding (``dpopt.nn``'s recurrent
layers without ``lengths=``) asks :func:`may_be_padded` and refuses to run.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from .. import _validate
from .digest import sha256_of


@runtime_checkable
class Records(Protocol):
    """Records read by index; ``digest()`` tells one data set from another (checkpoints)."""

    def __len__(self) -> int: ...

    def gather(self, indices: Tensor) -> tuple[Tensor, Tensor]: ...

    def chunks(self, size: int) -> Iterator[tuple[Tensor, Tensor]]: ...

    def digest(self) -> str: ...


class Tensors:
    """The records ``(X[i], y[i])`` of two tensors with the same first dimension n ≥ 1.

    ``gather`` writes ``X[indices]`` into a buffer of an earlier gather that no tensor refers to any
    more (:class:`Buffers`), where X is contiguous: the same numbers as a fresh ``X[indices]``, without
    the first writes to new memory (page faults), which cost more than the copy (augmentation
    multiplicity's views, 4,096 records of 5 × 3,969 float32 a step, one thread: about 0.55 s
    fresh against 0.17 s into reused buffers)."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        self.X, self.y = torch.as_tensor(X), torch.as_tensor(y)
        if self.X.ndim < 1 or self.y.ndim < 1 or len(self.X) != len(self.y) or len(self.X) == 0:
            raise _validate.DpoptError(f"X.shape={tuple(self.X.shape)} and y.shape={tuple(self.y.shape)} must hold "
                                       "the same number n >= 1 of records along their first dimension")
        self.buffers = Buffers()

    def __len__(self) -> int:
        return len(self.X)

    def gather(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        indices = indices.to(self.X.device)
        if not self.X.is_contiguous() or self.X.requires_grad:  # (out= takes no autograd; keep X's own layout)
            return self.X[indices], self.y[indices]
        rows = self.buffers.take(len(indices), self.X)
        return torch.index_select(self.X, 0, indices, out=rows), self.y[indices]

    def chunks(self, size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """All records in order, ``size`` at a time (slices, not copies)."""
        return zip(self.X.split(size), self.y.split(size))

    def digest(self) -> str:
        return sha256_of(self.X, self.y)


class Buffers:
    """Contiguous buffers for gathered records, each reused once nothing else refers to its memory.

    A gathered chunk lives as long as what was computed from it (the ghost engine keeps a first
    layer's input, the chunk itself, in the per-record results an oracle keeps and returns), so a
    buffer is handed out again only when no tensor, view, autograd graph or array shares its
    storage: its storage's use count is that of the buffer alone (:func:`unshared`). The buffers
    kept are at most as many as were in use at once; a free buffer too small for a request is
    dropped. Taking a buffer is under a lock, so two threads never get the same one."""

    def __init__(self) -> None:
        self.kept: list[Tensor] = []
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        """A copy (``copy.deepcopy``, pickle) starts with no buffers and its own lock."""
        return {}

    def __setstate__(self, state: dict[str, object]) -> None:
        Buffers.__init__(self)

    def take(self, n: int, like: Tensor) -> Tensor:
        """A contiguous ``[n, *like.shape[1:]]`` of ``like``'s dtype and device, in unshared memory."""
        shape = (n, *like.shape[1:])
        with self.lock:
            for buffer in self.kept:  # the first free one of exactly n records (each chunk but a batch's last)
                if len(buffer) == n and fits(buffer, like) and unshared(buffer):
                    return buffer[:n]  # (a view: the chunk counts as a use of the storage)
            free = [buffer for buffer in self.kept if unshared(buffer)]
            fitting = [buffer for buffer in free if len(buffer) >= n and fits(buffer, like)]
            if fitting:
                return min(fitting, key=len)[:n]
            self.kept = [buffer for buffer in self.kept if not any(buffer is other for other in free)]
            self.kept.append(like.new_empty(shape))
            return self.kept[-1][:n]


def fits(buffer: Tensor, like: Tensor) -> bool:
    """Whether ``buffer`` holds records of ``like``'s shape, dtype and device."""
    return buffer.shape[1:] == like.shape[1:] and buffer.dtype == like.dtype and buffer.device == like.device


def unshared(buffer: Tensor) -> bool:
    """Whether ``buffer`` is the only tensor on its storage (no view, autograd graph or array of it
    is alive): the storage's use count is 2, the buffer and the storage's own Python object."""
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) == 2


@runtime_checkable
class MapStyle(Protocol):
    """A map-style dataset: ``len(dataset)`` records, ``dataset[i]`` the i-th."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[object, object]: ...


class Lazy:
    """The records ``dataset[i] = (x_i, y_i)`` of a map-style dataset, read when asked for."""

    def __init__(self, dataset: object, name: str = "train_data") -> None:
        if isinstance(dataset, DataLoader):
            raise _validate.DpoptError(
                f"{name} is a DataLoader: pass its dataset ({name}.dataset) instead, or pass the DataLoader to "
                "dpopt.Private or dpopt.fit as their training data (they load dpopt's batches through it). dpopt draws "
                "the batches itself, by index, from a secret generator (Poisson sampling, which the privacy accounting "
                "assumes); a loader's own batches would not match the accounting")
        if not isinstance(dataset, MapStyle):
            raise _validate.DpoptError(f"{name} must be a map-style torch Dataset of (x, y) pairs (with __getitem__ "
                                       f"and __len__) or a tuple (X, y), not {type(dataset).__name__}")
        if len(dataset) == 0:
            raise _validate.DpoptError(f"{name} is empty")
        first = dataset[0]
        if not (isinstance(first, (tuple, list)) and len(first) == 2):
            raise _validate.DpoptError(f"{name} must be a map-style torch Dataset of (x, y) pairs or a tuple (X, y): "
                                       f"{name}[0] is a {type(first).__name__}, not an (x, y) pair")
        self.dataset, self.name = dataset, name

    def __len__(self) -> int:
        return len(self.dataset)

    def gather(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        pairs = [self.dataset[i] for i in indices.tolist()]
        if not pairs:
            x, y = self.dataset[0]
            return (torch.as_tensor(x).unsqueeze(0)[:0], torch.as_tensor(y).unsqueeze(0)[:0])
        return (torch.stack([torch.as_tensor(x) for x, _ in pairs]),
                torch.stack([torch.as_tensor(y) for _, y in pairs]))

    def chunks(self, size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """All records in order, ``size`` at a time."""
        for part in torch.arange(len(self)).split(size):
            yield self.gather(part)

    def digest(self) -> str:
        return chunked_digest(self)


_PADDED: ContextVar[bool] = ContextVar("dpopt_padded_chunks", default=False)


@contextlib.contextmanager
def chunks_of(records: Records) -> Iterator[None]:
    """A module runs, within the block, on chunks of ``records``: :func:`may_be_padded` says
    whether their ``collate_fn`` may have padded them (``records.pads``; false for tensors and
    for records stacked as they are)."""
    token = _PADDED.set(bool(getattr(records, "pads", False)))
    try:
        yield
    finally:
        _PADDED.reset(token)


def may_be_padded() -> bool:
    """Whether the module now running runs on chunks that a DataLoader's own ``collate_fn`` collated,
    which may pad each chunk to its longest record (see :func:`chunks_of`)."""
    return _PADDED.get()


def chunked_digest(records: Records) -> str:
    """sha256 over every record in order, read 1024 at a time (one pass over the data set)."""
    digest = hashlib.sha256()
    for x, y in records.chunks(1024):
        digest.update(sha256_of(x, y).encode())
    return digest.hexdigest()


def of(data: object, y: Tensor | None = None, name: str = "train_data") -> Records:
    """Records from tensors ``(data, y)``, a pair ``data = (X, y)``, a ``TensorDataset(X, y)``
    (sliced, not read record by record) or any map-style dataset of ``(x, y)`` pairs (lazy);
    ``Records`` already (e.g. :class:`~dpopt.oracles.loaded.Loaded`) as they are."""
    if isinstance(data, Records):
        return data
    if y is not None:
        return Tensors(torch.as_tensor(data), y)
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(part, Tensor) for part in data):
        return Tensors(*data)
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return Tensors(*data.tensors)
    return Lazy(data, name)
