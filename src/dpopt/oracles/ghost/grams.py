"""The Gram matrices of the data's records at a Linear layer that takes the data itself, kept by
record and reused at every later step.

A Linear layer at T > 1 positions in the Gram form (:meth:`~.layers.Layer.gram_form`) bounds record i's
gradient norm by ``⟨A_i A_iᵀ, G_i G_iᵀ⟩`` (:func:`~.rounding.gram_sq_norms`). Where its input is the
chunk of records the oracle gathered, unchanged (augmentation multiplicity's fixed views of each
record, ``[B, T, p]``, into the first layer; or those records read in place, block by block:
:mod:`.in_place`), ``A_i A_iᵀ`` (T × T, float64, its diagonal the squared norms ``‖a_t‖²`` the
rounding bound takes) is a function of record i alone: formed the
first time the record is drawn (:func:`~.rounding.record_grams`, whose bits do not depend on the
record's place in the chunk) and looked up by record index afterwards, so a step forms only the
T × T Gram matrices of the output gradients (augmentation multiplicity's views, T = 5, p = 3,969:
no float64 copy of the 325 MB of a batch of 4,096 records). A record's norm bound is the same
float64 number, bit for bit, whether its matrices were kept or formed in this step: the clipping
weights and θ do not depend on the cache.

Kept only for records held in tensors (:class:`~dpopt.oracles.records.Tensors`; a Dataset may give
other numbers for a record each time it is read, e.g. a random augmentation), where T² ≤
:data:`MAX_ENTRIES` and the matrices (T²·8 bytes a record) take no more memory than the records
themselves, by the oracle that gathered them, on the device and in the dtype it computes in; all
are dropped when the records' tensor is changed in place (its version counter moves; the oracle's
records are not to be modified, see :class:`~dpopt.oracles.TorchModel`) or another layer shape
asks. Nothing kept is written out: a copy or pickle of the oracle starts with none.

At one position (T = 1: ScatterNet's features into a linear layer) the norm bound takes from the input
only its squared norm ``‖a_i‖²`` (:attr:`~.layers.Layer.input_sq_norms`, :func:`~.rounding.sq_rows`,
whose float32 runs are reduced in an order set by the row's length alone, not by where the row lies):
kept the same way, one float64 number a record, a pass over each chunk's records fewer a step
(ScatterNet's step of 4,096 records in chunks of 1,024: BENCHMARKS.md).
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from ..records import Tensors
from .layers import Layer, same_memory
from .rounding import record_grams, sq_rows
from .stages import LINEAR_KINDS

#: At most this many entries (T²) per record are kept: 2 kB a record, and a record's first formation
#: (2·T²·p products) within a few of the direct form's steps (T·p·q). Measured (views of 3,969 float32
#: features into 10 outputs, DP-SGD steps of 4,096 records in chunks of 512, one thread, every record
#: kept): 0.16 s a step at T = 5, 0.28 s at T = 9 and 0.46 s at T = 16 (about 0.03 s a view each),
#: against 0.63 s and 0.77 s at 9 and 16 in the direct form, the records gathered, that
#: :func:`~.layers.use_gram` alone chooses there.
MAX_ENTRIES = 256


class InputGrams:
    """The input Gram matrices of one oracle's records, by record index: of :class:`Tensors` records
    only (``data``, their tensor ``X``; None for records read another way, for which nothing is kept)."""

    def __init__(self, records: object) -> None:
        self._start(records.X if isinstance(records, Tensors) else None)

    def _start(self, data: Tensor | None) -> None:
        self.data, self.lock = data, threading.Lock()
        self.key: tuple[object, ...] | None = None  # what the kept matrices are of (:meth:`of_what`)
        self.grams: Tensor | None = None  # [n, T, T] float64
        self.known: Tensor | None = None  # [n] bool: whose grams are kept

    def __getstate__(self) -> dict[str, object]:
        """A copy (``copy.deepcopy``, pickle) keeps the records' tensor and none of the matrices."""
        return {"data": self.data}

    def __setstate__(self, state: dict[str, Tensor | None]) -> None:
        self._start(state["data"])

    def attach(self, chunk: tuple, x: Tensor, indices: Tensor) -> tuple:
        """The layers of one chunk (its records ``indices``, their input ``x`` as the oracle gave it
        to the module), each Linear layer whose input is ``x`` itself given its records'
        ``A_i A_iᵀ`` where its norms take the Gram form (``Layer.input_grams``), their ``‖a_i‖²`` at
        one position (``Layer.input_sq_norms``)."""
        for layer in chunk:
            if self.data is None or not isinstance(layer, Layer) or not same_memory(layer.a, x):
                continue
            if kept(layer):
                layer.__dict__["input_grams"] = self.of(indices, layer.matrices()[0])
            elif kept_norms(layer):
                layer.__dict__["input_sq_norms"] = self.of(indices, layer.matrices()[0]).view(-1)
        return chunk

    def of(self, indices: Tensor, A: Tensor) -> Tensor:
        """``A_i A_iᵀ`` ``[R, T, T]`` of the records ``indices`` whose inputs are ``A [R, T, p]``: the
        kept ones, and those of the records not seen before, formed now and kept; at T = 1, the bound
        ``[R, 1, 1]`` of ``‖a_i‖²`` that :func:`~.rounding.sq_rows` gives."""
        R, T, _ = A.shape
        key, indices = self.of_what(A), indices.to(A.device)
        with self.lock:
            if key != self.key:
                assert self.data is not None
                self.key = key
                self.grams = A.new_empty(len(self.data), T, T, dtype=torch.float64)
                self.known = torch.zeros(len(self.data), dtype=torch.bool, device=A.device)
            assert self.grams is not None and self.known is not None
            new = ~self.known[indices]
            if bool(new.any()):
                rows = new.nonzero().squeeze(1)
                self.grams[indices[rows]] = record_inputs(A if len(rows) == R else A[rows])
                self.known[indices[rows]] = True
            return self.grams[indices]

    def kept_of(self, indices: Tensor, like: Tensor) -> Tensor | None:
        """``A_i A_iᵀ`` ``[R, T, T]`` of the records ``indices`` for inputs like ``like [·, T, p]`` if all
        are kept (one look-up); else None, and :meth:`of` forms those not seen before."""
        key, indices = self.of_what(like), indices.to(like.device)
        with self.lock:
            if key != self.key or self.known is None or not bool(self.known[indices].all()):
                return None
            assert self.grams is not None
            return self.grams[indices]

    def of_what(self, A: Tensor) -> tuple[object, ...]:
        """What the kept matrices are of: the layer's shape, dtype and device, and the records'
        tensor, its memory and its version (moved by every in-place change): another key drops them."""
        assert self.data is not None
        return (*A.shape[1:], A.dtype, A.device, self.data.data_ptr(), self.data._version)


def kept(layer: Layer) -> bool:
    """Whether ``layer``'s input Gram matrices are kept by record: a Linear layer with a trainable
    weight whose shape :func:`kept_shape` accepts."""
    if not _trained_linear(layer):
        return False
    _, T, p, q = layer.shape()
    return kept_shape(T, p, q, layer.a.element_size())


def kept_norms(layer: Layer) -> bool:
    """Whether ``layer``'s squared input norms are kept by record: a Linear layer at one position
    with a trainable weight (its norm bound ``‖a_i‖²·‖g_i‖²``), whose float64 number a record takes
    no more memory than the record's input."""
    if not _trained_linear(layer):
        return False
    _, T, p, _ = layer.shape()
    return T == 1 and 8 <= p * layer.a.element_size()


def _trained_linear(layer: Layer) -> bool:
    """Whether ``layer`` is a Linear layer with a trainable weight (whose norm bound reads its input)."""
    return layer.stage.kind in LINEAR_KINDS and layer._trainable("weight") is not None


def record_inputs(A: Tensor) -> Tensor:
    """What is kept of the records ``A [R, T, p]``: :func:`~.rounding.record_grams`, or at T = 1 the
    squared norms of :func:`~.rounding.sq_rows` as ``[R, 1, 1]``; either the same bits wherever a
    record stands in ``A``."""
    R, T, _ = A.shape
    return record_grams(A) if T > 1 else sq_rows(A.reshape(R, -1)).view(R, 1, 1)


def kept_shape(T: int, p: int, q: int, itemsize: int) -> bool:
    """Whether a Linear layer's input Gram matrices are kept by record, and its norms then take the
    Gram form (:meth:`~.layers.Layer.gram_form`): at 1 < T positions, T² ≤ :data:`MAX_ENTRIES`, its
    matrices no larger than its input (8·T² ≤ T·p·itemsize bytes a record) nor than a record's
    weight gradient (2·T² < p·q, the memory bound of :func:`~.layers.use_gram`). Not
    :func:`~.layers.use_gram`'s cost comparison, which prices the input matrices formed at every
    step: kept, a step forms only the T × T matrices of the output gradients (2·T²·q products a
    record, against the direct form's T·p·q and its three passes over p·q numbers), and each record's
    input matrices are formed once, the first time it is drawn."""
    return 1 < T and T * T <= MAX_ENTRIES and 8 * T <= p * itemsize and 2 * T * T < p * q
