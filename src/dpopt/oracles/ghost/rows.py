"""The per-record gradients of one batch as the ghost engine keeps them: per chunk of records, the
layers' records; their norms, weighted sums and differences at two points."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from ...clipping import exact, weights_in
from .in_place import InPlace
from .layers import Layer, Layout, difference, same_memory, share_input
from .rounding import U64, gamma, unit
from .stages import LINEAR_KINDS


def reuse_inputs(rows: GhostRows, earlier: GhostRows) -> None:
    """``rows`` are the records of ``earlier`` at another point: give their layers what
    ``earlier`` computed from the same input tensors. A Linear layer's input that has come back
    (a full-batch method's data, every round) is also transposed once for the book-keeping
    product (:attr:`Layer.input_t`), and the copy is handed on with it."""
    for layers, earlier_layers in zip(rows.chunks, earlier.chunks):
        for layer, earlier_layer in zip(layers, earlier_layers):
            if (isinstance(layer, Layer) and isinstance(earlier_layer, Layer) and layer.stage.kind in LINEAR_KINDS
                    and same_memory(layer.a, earlier_layer.a)):
                earlier_layer.input_t  # noqa: B018 - built on the first return of this input
            share_input(layer, earlier_layer)


def _weighted_sum(chunks: tuple[tuple, ...], sizes: tuple[int, ...], weights: Tensor, layout: Layout,
                  like: Tensor) -> Tensor:
    total = like.new_zeros(layout.dim)
    for layers, w in zip(chunks, weights_in(weights, like.dtype).to(like.device).split(sizes)):
        kept = w != 0  # records with w_i = 0 are left out, not multiplied by 0 (their rows may be NaN)
        if kept.any():
            for layer in layers:
                layer.add_weighted(w, None if kept.all() else kept, total, layout)
    return total


@dataclass(frozen=True)
class GhostRows:
    """Per-record gradients of one batch, kept as per-layer ``(a, g)`` of each chunk of records.

    ``norms()`` are ghost norms, in float64: upper bounds of the norms of what ``weighted_sum``
    adds for each record per unit weight (see :mod:`.rounding`), so that clipping with
    them never lets a record add more than C. ``weighted_sum(w)`` is the book-keeping sum
    Σ_i w_i ∇ℓ_i, in ``dtype`` (θ's). Both come back on ``device`` (θ's). ``self - other`` (same
    records, another θ) is the GhostRows of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``, layer by layer
    (:func:`difference`), with exact norms (stacked ghost norms, no cancellation) and sums; it
    is not subtracted again.
    """

    chunks: tuple[tuple, ...]
    sizes: tuple[int, ...]
    layout: Layout
    like: Tensor      # an empty tensor of the computing dtype and device
    dtype: torch.dtype
    device: torch.device

    @cached_property
    @exact  # the norms' products in the rows' dtype, not autocast's (see dpopt.clipping)
    def _norms(self) -> Tensor:
        sq = [sum((layer.sq_bounds() for layer in layers), self.like.new_zeros(size, dtype=torch.float64))
              for layers, size in zip(self.chunks, self.sizes)]
        if not sq:
            return self.like.new_zeros(0, dtype=torch.float64)
        # the float64 products and sums of the squared bounds, the square root and the clip weight
        # C / norm round too (a few roundings per layer, then one per layer summed); so does a sum
        # returned in a coarser dtype than it was computed in
        coarser = torch.finfo(self.dtype).eps > torch.finfo(self.like.dtype).eps
        enlarge = (1 + 2 * gamma(2 * max(map(len, self.chunks)) + 8, U64)) * (1 + coarser * unit(self.dtype))
        return torch.cat(sq).sqrt() * enlarge

    def norms(self) -> Tensor:
        return self._norms.to(self.device)

    @exact
    def weighted_sum(self, weights: Tensor) -> Tensor:
        return _weighted_sum(self.chunks, self.sizes, weights, self.layout, self.like).to(self.device, self.dtype)

    def __sub__(self, other: GhostRows) -> GhostRows:
        if not isinstance(other, GhostRows):
            return NotImplemented
        if self.sizes != other.sizes or [len(c) for c in self.chunks] != [len(c) for c in other.chunks]:
            raise ValueError("ghost rows can only be subtracted on the same records, chunked the same way")
        chunks = tuple(tuple(a - b if isinstance(a, InPlace) else difference(a, b) for a, b in zip(mine, theirs))
                       for mine, theirs in zip(self.chunks, other.chunks))
        return GhostRows(chunks, self.sizes, self.layout, self.like, self.dtype, self.device)
