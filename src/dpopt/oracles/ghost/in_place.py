"""A first Linear layer whose input is the records themselves, read in place from the records'
tensor (augmentation multiplicity's views, ``[n, T, p]``, into the first layer).

Gathered whole, a chunk of such records is written once (the gather), read by the forward and
read again by the book-keeping sum, each time from memory: a step of 4,096 records of 5 × 3,969
float32 numbers moves 325 MB three times. Here the chunk is never gathered: the forward reads its
records a block at a time (:func:`read_blocks`) into one reused buffer and computes the block's
outputs ``W a_t + b`` while the block is in cache, and forms there the input Gram matrices of the
records not seen before (:class:`~.grams.InputGrams`, the same bits as from a gathered chunk:
:func:`~.rounding.record_grams`); the layer (:class:`InPlace`) keeps the records' indices, not
their input, and its sum reads the blocks again. Its norms take the Gram form, which reads no
input: the layer's input Gram matrices must be kept (:func:`~.grams.kept_shape`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from ... import _validate
from ..records import Records, Tensors
from .functional import check_not_overwritten, forward
from .grams import InputGrams, kept_shape
from .layers import Layout
from .rounding import gram_bounds, sq_rows, unit
from .stages import Stage

#: Bytes of records read into one buffer at a time (:func:`read_blocks`): 2 MiB, 26 records of
#: augmentation multiplicity's views (5 × 3,969 float32 numbers, 79 kB a record). Measured there, DP-SGD
#: steps of 4,096 records in chunks of 128, one thread, the machine's other core busy (medians of 10
#: to 12 steps, interleaved): blocks of 16 to 33 records within noise of each other (0.27–0.32 s a
#: step in the last runs), 48 to 64 records no faster and often slower (0.29–0.45 s), a whole chunk
#: of 128 slower (0.43 s).
BLOCK_BYTES = 2**21


def block_records(X: Tensor) -> int:
    """Records of ``X`` in a block of :func:`read_blocks`: :data:`BLOCK_BYTES` of them, at least one."""
    return max(1, BLOCK_BYTES // max(1, X[0].numel() * X.element_size()))


def read_blocks(records: Tensors, rows: Tensor) -> Iterator[tuple[int, Tensor]]:
    """``(start, X[rows[start:start + m]])`` for consecutive blocks of the records ``rows`` of
    ``records.X`` (contiguous), :func:`block_records` at a time, each read into the same buffer of
    the records' own (:class:`~dpopt.oracles.records.Buffers`): a block is used while it is in
    cache, and the buffer is free again once the iteration ends."""
    X, step = records.X, block_records(records.X)
    if not len(rows):
        return
    buffer = records.buffers.take(min(step, len(rows)), X)
    for start in range(0, len(rows), step):
        part = rows[start:start + step]
        yield start, torch.index_select(X, 0, part, out=buffer[:len(part)])


def reads_in_place(stages: tuple[Stage, ...], records: Records, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the first stage reads the records in place: a Linear layer with a trainable weight
    that takes the records themselves (tensors ``X [n, T…, p]``, contiguous, in the module's dtype
    and on its device, without autograd), at T > 1 positions, whose input Gram matrices are kept
    (:func:`~.grams.kept_shape`); not under autocast (whose products are in another dtype)."""
    if not stages or stages[0].kind != "linear" or "weight" not in dict(stages[0].names):
        return False
    if not isinstance(records, Tensors) or torch.is_autocast_enabled(device.type):
        return False
    module: Any = stages[0].module  # an nn.Linear (the stage's kind)
    X, weight = records.X, module.weight
    if (X.ndim < 3 or X.dtype != dtype or X.device != device or not X.is_contiguous() or X.requires_grad
            or weight.ndim != 2 or weight.shape[1] != X.shape[-1]):
        return False
    p = X.shape[-1]
    return kept_shape(X[0].numel() // p, p, weight.shape[0], X.element_size())


def unread(records: Records, parts: Iterable[Tensor],
           moved: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """The chunks ``parts`` of records whose inputs the first layer reads in place (where
    :func:`reads_in_place`): ``moved(indices, y[indices])`` of each, the labels gathered, the inputs not."""
    assert isinstance(records, Tensors)
    return [moved(part, records.y[part.to(records.y.device)]) for part in parts]


def forward_in_place(stages: tuple[Stage, ...], views: dict[str, Tensor], records: Records, indices: Tensor,
                     grams: InputGrams) -> tuple[Tensor, list[tuple]]:
    """:func:`~.functional.forward` of the records ``indices`` of ``records`` (where
    :func:`reads_in_place`), the first stage's input read in place: its output ``[B, T…, q]``,
    formed block by block (:func:`block_output`), is the tap to differentiate against, and its
    input the :class:`ReadInPlace` records."""
    assert isinstance(records, Tensors)
    stage, X = stages[0], records.X
    module: Any = stage.module  # an nn.Linear (the stage's kind)
    names = dict(stage.names)
    weight = views[names["weight"]].detach()
    bias = views[names["bias"]].detach() if "bias" in names else module.bias
    idx, p = indices.to(X.device), X.shape[-1]
    input_grams = grams.kept_of(idx, X[:1].view(1, -1, p))
    outs, formed = [], []
    with torch.no_grad():
        for start, A in read_blocks(records, idx):
            outs.append(block_output(A.view(-1, p), weight, bias))
            if input_grams is None:  # some records not seen before: their matrices formed from the block
                formed.append(grams.of(idx[start:start + len(A)], A.view(len(A), -1, p)))
    # the tap, a copy of the leaf: a later stage that writes into it in place moves its version and is
    # refused with the gathered chunk's message (check_not_overwritten), not by autograd's leaf check
    out = torch.cat(outs).view(len(idx), *X.shape[1:-1], weight.shape[0]).requires_grad_().clone()
    read = ReadInPlace(records, idx, X._version, torch.cat(formed) if input_grams is None else input_grams)
    x, taps = forward(stages[1:], views, out)
    taps = [(stage, read, out), *taps]
    check_not_overwritten(taps[:1])
    return x, taps


def block_output(A: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``A Wᵀ + b`` ``[m, q]`` of a block's positions ``A [m, p]``, computed as ``(W Aᵀ + b)ᵀ``: MKL's
    product in that layout is faster for a block in cache (augmentation multiplicity's views, blocks of
    32 records, one thread: 92–99 ms a step of 4,096 records for the reads and products, against
    168–175 ms as ``F.linear`` computes it). Each entry is a dot product of p terms either way, but
    summed in another order than ``F.linear``'s (the vmap engine's): the last bits of the outputs,
    hence of the output gradients, norms and sums, differ from those of the chunk gathered."""
    return (weight @ A.T if bias is None else torch.addmm(bias[:, None], weight, A.T)).T


@dataclass(frozen=True)
class ReadInPlace:
    """The input of a chunk's first Linear layer where it is the records themselves, left in their
    tensor: the records ``indices`` of ``records.X [n, T…, p]`` (in the layer's dtype, on its
    device), ``version`` the tensor's version counter when they were read, and ``input_grams``
    their Gram matrices ``A_i A_iᵀ`` ``[B, T, T]`` (float64, kept by record: :class:`~.grams.InputGrams`)."""

    records: Tensors
    indices: Tensor
    version: int
    input_grams: Tensor

    def layer(self, stage: Stage, g: Tensor) -> InPlace:
        """The layer of these records with output gradient ``g``."""
        return InPlace(self.records, self.indices, self.version, self.input_grams, stage, g)

    def check_unchanged(self) -> None:
        """Refuse to read records changed in place since their norms were taken: the sum would add
        another input than the one the norms bound."""
        if self.records.X._version != self.version:
            raise _validate.DpoptError("the records' tensor X was modified in place after the per-record gradients "
                                       "were taken: their weighted sum would not be the one their norms bound")


@dataclass(frozen=True)
class InPlace(ReadInPlace):
    """A Linear stage of one chunk whose input is read in place (:class:`ReadInPlace`), at T > 1
    positions in the Gram form, and its output gradient ``g [B, T…, q]``: the records' gradients
    ``Σ_t g_t a_tᵀ`` (weight) and ``Σ_t g_t`` (bias) without the chunk's input ever gathered whole.

    The norms are :class:`~.layers.Layer`'s in the Gram form, the same float64 numbers bit for bit
    given the same ``g`` and input Gram matrices. The sum adds ``Σ_i w_i Σ_t g_{it} a_{it}ᵀ`` block
    by block (:func:`add_blocks`), where :class:`~.layers.Layer` makes one product per chunk and adds
    it to the total. Each record's own terms are the same rounded products ``fl(w_i·g_{it})·a_{it}``,
    added over its T positions in the layer's precision, so the bound of :func:`~.rounding.gram_bounds`
    (the Gram norm times ``(1 + u)²``, plus γ_{T+3}·Σ_t ‖a_t‖‖g_t‖) covers the record's contribution
    as it covers the chunk's backward product: only the order in which the records' contributions
    are added to each other changes, and no per-record bound depends on it.
    The difference with the same records at another point (DP-SRM) is the layer of ``g − g′``."""

    stage: Stage
    g: Tensor

    def _trainable(self, local: str) -> str | None:
        return dict(self.stage.names).get(local)

    def shape(self) -> tuple[int, int, int, int]:
        """``(groups, T, p, q)`` of the Linear rule, as :meth:`~.layers.Layer.shape` (one group)."""
        q = self.g.shape[-1]
        return 1, self.g[0].numel() // q, self.records.X.shape[-1], q

    @cached_property
    def bias_g(self) -> Tensor:
        """The bias gradient rows ``Σ_t g_t``, ``[B, q]``."""
        return self.g.reshape(self.g.shape[0], -1, self.g.shape[-1]).sum(1)

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' contributions to
        :meth:`add_weighted` per unit weight: :class:`~.layers.Layer`'s in the Gram form, the input
        Gram matrices given (the input itself, of which only the shape is used there, is not read)."""
        B, (_, T, p, q) = self.g.shape[0], self.shape()
        sq = self.g.new_zeros(B, dtype=torch.float64)
        if self._trainable("weight"):
            G = self.g.reshape(B, T, q)
            not_read = G.new_zeros(()).expand(B, T, p)
            sq = sq + gram_bounds([(not_read, G)], B, 1, T, self.g.dtype, self.input_grams).square()
        if self._trainable("bias"):
            sq = sq + (1 + unit(self.g.dtype)) ** 4 * sq_rows(self.bias_g)
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        """``total += Σ_i w_i ∇ℓ_i`` over the records ``kept`` (None: all; the others are not read)."""
        self.check_unchanged()
        v = w if kept is None else w[kept]
        if weight := self._trainable("weight"):
            _, T, p, q = self.shape()
            g = self.g if kept is None else self.g[kept]
            gw = (g * v.view(-1, *[1] * (g.ndim - 1))).reshape(-1, T, q)
            add_blocks(total[layout.place(weight)].view(q, p), gw, self.records,
                       self.indices if kept is None else self.indices[kept])
        if bias := self._trainable("bias"):
            total[layout.place(bias)] += v @ (self.bias_g if kept is None else self.bias_g[kept])

    def __sub__(self, other: InPlace) -> InPlace:
        """The layer of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)`` on the same records: ``Σ_t (g_t − g′_t) a_tᵀ``, exactly."""
        if not (isinstance(other, InPlace) and self.records is other.records and self.version == other.version
                and torch.equal(self.indices, other.indices)):
            raise ValueError(f"layer {self.stage.path!r} read other records at the two points")
        return self.layer(self.stage, self.g - other.g)


def add_blocks(grad: Tensor, gw: Tensor, records: Tensors, rows: Tensor) -> None:
    """``grad [q, p] += Σ_i Σ_t gw_{it} a_{it}ᵀ`` for the records ``rows`` of ``records`` and their
    weighted output gradients ``gw [R, T, q]``: per block (:func:`read_blocks`), ``(w·G)ᵀ A`` added
    into ``grad`` while the block is in cache."""
    q, p = grad.shape
    for start, A in read_blocks(records, rows):
        grad.addmm_(gw[start:start + len(A)].reshape(-1, q).T, A.view(-1, p))
