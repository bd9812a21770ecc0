"""One layer's records of one chunk: what the ghost engine keeps of a layer after the backward
(its input ``a`` and output gradient ``g``, or the records' gradients as dense rows), with the
upper bounds of the records' norms (:mod:`.rounding`), the weighted sum of their gradients, and
the difference of a layer at two points."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Protocol, cast

import torch
import torch.nn.grad
from torch import Tensor, nn

from .conv import geometry, hwc, padded, patches, unfold
from .rounding import U64, gamma, gram_bounds, run_norms, sq_of_runs, sq_rows, unit
from .stages import LINEAR_KINDS, Stage


class Layout(Protocol):
    """Where each trainable parameter lives in the flat θ (see ``layout.Layout``)."""

    @property
    def dim(self) -> int: ...  # read-only: layout.Layout is a frozen dataclass

    def place(self, name: str) -> slice: ...


def use_gram(T: int, p: int, q: int, itemsize: int = 8) -> bool:
    """Bu et al.'s layer-wise choice: Gram matrices (B·T² memory) iff 2T² < p·q (the size of the
    layer's per-record gradient, built by the direct form). In a precision below float64
    (``itemsize`` < 8 bytes) the Gram matrices are formed from float64 copies of the positions'
    inputs and output gradients, a few records at a time (:func:`~.rounding.gram_sq_norms`): then
    the choice is by cost, per record. The direct form multiplies T·p·q times and passes three
    times over its p·q rows of ``itemsize`` bytes (writes them, takes their norms, sums them with
    ``w @ rows``); the Gram form multiplies 2·T²·(p + q) times in float64 (its sum, a backward
    product, multiplies T·p·q times like the rows, in one large product). A pass over a float32
    row entry costs about one product (measured: Gram / direct time of a layer's norms and sum, one
    thread, 128 float32 records, in brackets), so the Gram form is chosen iff
    8·T²·(p + q) < p·q·(4T + 3·itemsize): for augmentation multiplicity's views, T = 5, p = 3,969,
    q = 10 (its rows are 159 kB a record; 0.7× to 1.05×, and its DP-SGD step 0.98× to 1.35× the
    time, ``benchmarks/bench_views_step.py``), not for T = 16 on the same layer (3.0×); not for the MNIST
    CNN's convolutions (T = 25, p = 256, q = 32: 1.8×; T = 196), a GPT block's layers (T = 64,
    p = q = 128: 2.3×; p = 128, q = 512: 1.6×) or LoRA factors of rank 8 (T = 64, p = 768, q = 8:
    5.6×), which keep the direct form; and wherever the previous memory rule, 2·T·(p + q) < p·q in
    float32, chose the Gram form, which implies this one (T = 16, p = q = 256: 0.25×). A layer whose
    input Gram matrices the oracle keeps by record forms none of them in a step and takes the Gram
    form whatever this rule says (:meth:`Layer.gram_form`, :func:`~.grams.kept_shape`)."""
    if 2 * T * T >= p * q:
        return False
    return itemsize >= 8 or 8 * T * T * (p + q) < p * q * (4 * T + 3 * itemsize)


def use_gram_difference(T: int, p: int, q: int, conv: bool, itemsize: int = 8) -> bool:
    """The choice for the difference of two points (DP-SRM), 2T stacked positions: the Gram form
    iff :func:`use_gram` says so for 2T positions and, for a convolution, the records' layer
    gradients at both points (2·p·q per record) would take more memory than the im2col patches
    the stacked Gram form holds (both points' and their difference, 3·T·p), i.e. iff 2q > 3T.
    Otherwise the direct form: it needs no more memory, and its rows also give the norms at
    each point and the three book-keeping sums of a DP-SRM step without a backward product (the
    MNIST CNN's second convolution, T = 25, q = 32: its share of a DP-SRM step about halves).

    A Linear layer at one position (T = 1) is held to the same comparison: its rows at both
    points (2·p·q) against the stacked form's inputs and output gradients (both points' and
    their difference, 3·(p + q)), so the direct form iff 2pq ≤ 3(p + q), e.g. a layer with one
    output. Its rows are outer products, one broadcast product per point; the stacked form costs
    six batched dot products and two backward products (DIFF2's MLP, second layer 10 → 1, full
    batch of 16,512: 0.3 ms of a round against 1 ms)."""
    if T == 1 and not conv:
        return use_gram(2, p, q, itemsize) and 2 * p * q > 3 * (p + q)
    return use_gram(2 * T, p, q, itemsize) and not (conv and 2 * q <= 3 * T)


#: Bytes of im2col patches, or of rows, built at once in the direct form (:attr:`Layer._direct`).
CHUNK_BYTES = 2**22


@dataclass(frozen=True)
class Layer:
    """A Linear (also transformers' ``Conv1D``, kind ``"linear_t"``) or Conv2d stage of one chunk: its
    input ``a`` and output gradient ``g``. The rows and products are formed as for ``nn.Linear``'s
    ``[q, p]`` weight; a ``"linear_t"`` weight, stored ``[p, q]``, takes them transposed."""

    stage: Stage
    a: Tensor
    g: Tensor

    def _trainable(self, local: str) -> str | None:
        return dict(self.stage.names).get(local)

    def shape(self) -> tuple[int, int, int, int]:
        """``(groups, T, p, q)`` of the Linear rule (per group for a convolution)."""
        if self.stage.kind in LINEAR_KINDS:
            return 1, self.a[0].numel() // self.a.shape[-1], self.a.shape[-1], self.g.shape[-1]
        m = geometry(self.stage.module)
        q, per_group, kh, kw = m.weight_shape
        return m.groups, self.g.shape[2] * self.g.shape[3], per_group * kh * kw, q // m.groups

    def matrices(self) -> tuple[Tensor, Tensor]:
        """``A [B·groups, T, p]`` and ``G [B·groups, T, q]`` of the Linear rule."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if self.stage.kind in LINEAR_KINDS:
            return self.a.reshape(B, T, p), self.g.reshape(B, T, q)
        A = unfold(self.a, geometry(self.stage.module)).view(B, T, groups, p).transpose(1, 2).reshape(B * groups, T, p)
        return A, self._positions(self.g)

    def _positions(self, g: Tensor) -> Tensor:
        """A convolution's output gradient ``g [B, groups·q, Ho, Wo]`` as ``G [B·groups, T, q]``
        (a view when g is channels-last and there is one group)."""
        B, (groups, T, _, q) = g.shape[0], self.shape()
        if hwc(g):
            return g.permute(0, 2, 3, 1).reshape(B, T, groups, q).transpose(1, 2).reshape(B * groups, T, q)
        return g.reshape(B, groups, q, T).transpose(2, 3).reshape(B * groups, T, q)

    @cached_property
    def _direct(self) -> tuple[Tensor, Tensor | None]:
        """The records' weight gradients ``[B, q·p]`` (direct form) and, where they were taken while
        the rows were built, their run norms (:func:`run_norms`): built once, the direct form's
        norms, the difference of two points and the book-keeping sum all use them.

        Per (record, conv group) ``G [q, T] @ A [T, p]`` (A the im2col patches for a convolution),
        for :data:`CHUNK_BYTES` of patches or rows at a time, whose run norms are taken while they
        are in cache (not in a second pass over the whole ``[B, q·p]``). For a convolution the
        patches are T·p numbers per record (12,544 for the MNIST CNN's first layer, 12× its input):
        gathered for the whole batch they would be a new allocation of several MB each step, whose
        first writes (page faults) cost more than the gather; a chunk's worth is reused from the heap.
        A Linear layer at one position has rows ``g aᵀ``, outer products (each entry one rounded
        product, as in the matrix product): one broadcast product for the whole batch (a batched
        product of 1-deep matrices is 14× slower on CPU), and no run norms: its norms are
        ``‖a‖‖g‖`` (:meth:`_weight_sq_bounds`), and a difference takes the norms of its own rows."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if self.stage.kind in LINEAR_KINDS and T == 1:
            return (self.g.reshape(B, q, 1) * self.a.reshape(B, 1, p)).view(B, q * p), None
        rows, runs = self.a.new_empty(B, groups * q * p), []
        conv = geometry(self.stage.module) if self.stage.kind == "conv" else None
        a = self.a.reshape(B, T, p) if conv is None else padded(self.a, conv)
        g = self.g.reshape(B, T, q) if conv is None else self.g
        step = max(1, CHUNK_BYTES // (groups * p * max(T, q) * self.a.element_size()))
        for start in range(0, B, step):
            block = rows[start:start + step]
            n = len(block)
            if conv is None:
                A, G = a[start:start + n], g[start:start + n].mT
            else:
                A, G = patches(a[start:start + n], conv), g[start:start + n]
                if groups > 1:
                    A = A.view(n, T, groups, p).transpose(1, 2).reshape(n * groups, T, p)
                G = self._positions(G).mT if hwc(G) else G.reshape(n * groups, q, T)  # [n·groups, q, T], a view
            torch.bmm(G, A, out=block.view(n * groups, q, p))
            runs.append(run_norms(block))
        return rows, torch.cat(runs)

    @property
    def rows(self) -> Tensor:
        """The records' weight gradients ``[B, q·p]`` (direct form), built once (:attr:`_direct`)."""
        return self._direct[0]

    def row_dict(self) -> dict[str, Tensor]:
        """θ name → the records' gradient rows of each trainable parameter (direct form)."""
        rows = {}
        if weight := self._trainable("weight"):
            rows[weight] = self.weight_rows()
        if bias := self._trainable("bias"):
            rows[bias] = self.bias_g
        return rows

    def weight_rows(self) -> Tensor:
        """The records' weight gradients ``[B, numel]`` in the weight's own layout (θ's): :attr:`rows`,
        transposed for a ``"linear_t"`` weight."""
        if self.stage.kind != "linear_t":
            return self.rows
        _, _, p, q = self.shape()
        return self.rows.view(-1, q, p).transpose(1, 2).reshape(-1, p * q)

    @cached_property
    def bias_g(self) -> Tensor:
        """The bias gradient rows ``[B, q]``."""
        return self.bias_rows(self.g)

    def bias_rows(self, g: Tensor) -> Tensor:
        """``Σ_t g_t`` per record: the bias gradient rows ``[B, q]``."""
        return g.reshape(g.shape[0], -1, g.shape[-1]).sum(1) if self.stage.kind in LINEAR_KINDS else g.sum((2, 3))

    @cached_property
    def input_sq_norms(self) -> Tensor:
        """``‖a_i‖²`` of each record's input (a Linear layer at one position)."""
        return sq_rows(self.a.reshape(self.a.shape[0], -1))

    @cached_property
    def input_t(self) -> Tensor:
        """A Linear layer's input as a contiguous ``[p, B·T]``: the layout in which MKL computes
        the book-keeping product fastest, ``aᵀ (w·g)`` (BlogFeedback's first layer, 48k × 280 →
        10 in float64, one thread: 11 ms against 17–19 ms for ``(w·g)ᵀ a``). The copy costs a
        pass over ``a``, so it is made only for an input that comes back (:func:`~.rows.reuse_inputs`)."""
        return self.a.reshape(-1, self.a.shape[-1]).T.contiguous()

    #: What is computed from the input alone, shared by the layers that saw the same input; and
    #: ``input_grams``, the Gram form's ``A_i A_iᵀ`` (float64), present where the oracle gave them
    #: (the data's, kept by record: :class:`~.grams.InputGrams`), else formed with the norms.
    INPUT_CACHE = ("input_sq_norms", "input_t", "input_grams")

    def gram_form(self) -> bool:
        """Whether the weight's norms take the Gram form: at one position (``‖a‖²‖g‖²``), where the
        oracle gave the records' kept input Gram matrices (``input_grams``: :func:`~.grams.kept_shape`),
        else as :func:`use_gram` chooses."""
        _, T, p, q = self.shape()
        return T == 1 or "input_grams" in self.__dict__ or use_gram(T, p, q, self.a.element_size())

    def direct_difference(self) -> bool:
        """Whether the difference with another point takes the direct form (rows at both points)."""
        groups, T, p, q = self.shape()
        return bool(self._trainable("weight")) and not use_gram_difference(T, p, q, self.stage.kind == "conv",
                                                                           self.a.element_size())

    def _weight_sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' weight-gradient contributions
        to :meth:`add_weighted` per unit weight, whichever way the sum is formed: ``w·rows`` (one
        rounding per entry, rows exact or, for T > 1, off by γ_T·Σ_t ‖a_t‖‖g_t‖) or the backward
        product ``fl(Σ_t fl(w·g_t) a_tᵀ)`` (off by γ_{T+1}·Σ_t ‖a_t‖‖g_t‖ per unit weight)."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        one = (1 + unit(self.a.dtype)) ** 4  # fl(fl(w·g)·a), or fl(w·rows) with rows = fl(g·a) at T = 1, squared
        if self.stage.kind in LINEAR_KINDS and T == 1:  # ‖g aᵀ‖² = ‖a‖²‖g‖², whether or not the rows were built
            return one * self.input_sq_norms * sq_rows(self.g.reshape(B, -1))
        if "_direct" in self.__dict__ or not self.gram_form():  # direct form
            runs = self._direct[1]
            assert runs is not None  # None only for a Linear layer at one position, returned above
            return one * sq_of_runs(runs, groups * p * q, self.a.dtype)
        if T == 1:  # a convolution at one position: ‖g aᵀ‖² = ‖a‖²‖g‖² per group, on the patch
            A, G = self.matrices()
            sq = sq_rows(A.reshape(B * groups, p)) * sq_rows(G.reshape(B * groups, q))
            return one * sq.view(B, groups).sum(1)
        return gram_bounds([self.matrices()], B, groups, T, self.a.dtype, self.__dict__.get("input_grams")).square()

    def _bias_sq_bounds(self) -> Tensor:
        """Upper bounds of the squared norms of the bias contributions ``fl(w·Σ_t g_t)`` per unit weight."""
        return (1 + unit(self.g.dtype)) ** 4 * sq_rows(self.bias_g)

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' contributions to
        :meth:`add_weighted` per unit weight."""
        sq = self.a.new_zeros(self.a.shape[0], dtype=torch.float64)
        if self._trainable("weight"):
            sq = sq + self._weight_sq_bounds()
        if self._trainable("bias"):
            sq = sq + self._bias_sq_bounds()
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        """``total += Σ_i w_i ∇ℓ_i`` over the records ``kept`` (None: all). Where the records'
        weight gradients were built (the direct form) the sum is ``w @ rows``, else the
        weight-gradient product of a backward pass on ``(a, w·g)``."""
        v = w if kept is None else w[kept]
        if weight := self._trainable("weight"):
            if "_direct" in self.__dict__:  # the rows, built by the norms
                grad = v @ (self.rows if kept is None else self.rows[kept])
            else:
                a, g = (self.a, self.g) if kept is None else (self.a[kept], self.g[kept])
                gw = g * v.view(-1, *[1] * (g.ndim - 1))
                if self.stage.kind in LINEAR_KINDS and kept is None and "input_t" in self.__dict__:
                    grad = (self.input_t @ gw.reshape(-1, gw.shape[-1])).T
                elif self.stage.kind in LINEAR_KINDS:
                    grad = gw.reshape(-1, gw.shape[-1]).T @ a.reshape(-1, a.shape[-1])
                else:
                    m = geometry(self.stage.module)
                    grad = torch.nn.grad.conv2d_weight(a, m.weight_shape, gw, m.stride, m.padding, m.dilation,
                                                       m.groups)
            if self.stage.kind == "linear_t":  # [q, p] → the stored [p, q]
                grad = grad.reshape(self.g.shape[-1], -1).T
            total[layout.place(weight)] += grad.reshape(-1)
        if bias := self._trainable("bias"):
            total[layout.place(bias)] += v @ (self.bias_g if kept is None else self.bias_g[kept])


@dataclass(frozen=True)
class Block:
    """A stage whose records' gradients are held densely, ``grads`` (θ name → ``[B, *shape]``): a
    stage without a ghost rule, or a layer's difference of rows at two points."""

    stage: Stage
    grads: dict[str, Tensor]

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of ``fl(w·row)`` per unit weight."""
        return functools.reduce(operator.add, (sq_rows(g.flatten(1)) * (1 + unit(g.dtype)) ** 4
                                               for g in self.grads.values()))  # (a block has a parameter)

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        for name, g in self.grads.items():
            g, v = (g, w) if kept is None else (g[kept], w[kept])
            total[layout.place(name)] += v @ g.flatten(1)


@dataclass(frozen=True)
class Embedding:
    """An Embedding layer of one chunk: the records' indices ``idx [B, T]`` and output gradients
    ``g [B, T, D]`` (zero at the padding index). Record i's gradient is ``Σ_t e_{idx_t} g_tᵀ``, whose
    nonzero rows are ``Σ_{t: idx_t = v} g_t`` for the distinct indices v of the record (their norms
    in float64: :meth:`sq_bounds`), and the sum scatters ``w_i g_t`` into row idx_t of the table."""

    stage: Stage
    idx: Tensor
    g: Tensor

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' contributions per unit weight.

        Record i's gradient has one row per distinct index v among its positions, ``S_v = Σ_{t:
        idx_t = v} g_t``: these rows are summed in float64 (B·T·D work, where the Gram form costs
        B·T²·D), each within γ_T·Σ_{t: idx_t = v} ‖g_t‖ of S_v (at most T terms), so the record's
        norm is within γ_T·Σ_t ‖g_t‖ of that of the computed rows, whose squared norms are bounded
        by :func:`sq_rows` and added per record (at most T terms: ``1 + 2γ_T``). That bound times
        ``(1 + u)²`` (``fl(w·g_t)``), plus the rounding of each table row's sum over the record's
        positions, γ_{T+3}·Σ_t ‖g_t‖; squared."""
        if "weight" not in dict(self.stage.names):
            return self.g.new_zeros(len(self.g), dtype=torch.float64)
        (B, T, D), u = self.g.shape, unit(self.g.dtype)
        V = cast(nn.Embedding, self.stage.module).num_embeddings  # (the module of an "embedding" stage)
        G = self.g.double().reshape(B * T, D)
        records = torch.arange(B, device=self.idx.device).repeat_interleave(T)
        keys, segment = torch.unique(records * V + self.idx.reshape(-1), return_inverse=True)
        rows = G.new_zeros(len(keys), D).index_put_((segment,), G, accumulate=True)
        sq = G.new_zeros(B).index_add_(0, keys // V, sq_rows(rows)) * (1 + 2 * gamma(T, U64))
        size = torch.linalg.vector_norm(G, dim=1).view(B, T).sum(1) * (1 + 2 * gamma(D + T + 4, U64))
        return ((1 + u) ** 2 * (sq.sqrt() + gamma(T, U64) * size) + gamma(T + 3, u) * size).square()

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        if (name := dict(self.stage.names).get("weight")) is None:
            return
        idx, g, v = (self.idx, self.g, w) if kept is None else (self.idx[kept], self.g[kept], w[kept])
        table = total[layout.place(name)].view(-1, g.shape[-1])
        table.index_add_(0, idx.reshape(-1), (g * v.view(-1, 1, 1)).reshape(-1, g.shape[-1]))


@dataclass(frozen=True)
class Stacked:
    """A Linear or Conv2d layer's difference at two points with different inputs, in the Gram
    form: ``parts = ((a, g − g′), (a − a′, g′))``, the second without the bias (whose difference
    is ``Σ_t g_t − g′_t``). Its norm is the Gram norm of both parts and its sum their backward
    products, so both are of the same rounded differences."""

    parts: tuple[Layer, Layer]

    def sq_bounds(self) -> Tensor:
        first = self.parts[0]
        B, (groups, T, _, _) = first.a.shape[0], first.shape()
        sq = gram_bounds([part.matrices() for part in self.parts], B, groups, T, first.a.dtype).square()
        if first._trainable("bias"):
            sq = sq + first._bias_sq_bounds()
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        for part in self.parts:
            part.add_weighted(w, kept, total, layout)


def difference(left: Layer | Block | Embedding, right: Layer | Block | Embedding
                ) -> Layer | Block | Embedding | Stacked:
    """The layer of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``, whose norms and sums are of the same difference.

    Where both points saw the same input (a first layer, whose input is the data) it is one
    layer, exactly: ``Σ_t g_t a_tᵀ − g′_t a_tᵀ = Σ_t (g_t − g′_t) a_tᵀ`` (norms and sums then
    cost what one point's do, with no cancellation). Otherwise, a block's difference of its
    per-record gradients; in the direct form, the difference of the rows built at each point
    (kept there for that point's norms and sums); else the stacked Gram form (:class:`Stacked`)."""
    if isinstance(left, Block):
        assert isinstance(right, Block)
        return Block(left.stage, {name: g - right.grads[name] for name, g in left.grads.items()})
    if isinstance(left, Embedding):  # indices are integers: never a function of θ
        assert isinstance(right, Embedding)
        if not torch.equal(left.idx, right.idx):
            raise ValueError(f"layer {left.stage.path!r} was given other indices at the two points")
        return Embedding(left.stage, left.idx, left.g - right.g)
    assert isinstance(right, Layer)
    if same_memory(left.a, right.a):
        share_input(left, right)
        layer = Layer(left.stage, left.a, left.g - right.g)
        left.input_sq_norms  # noqa: B018 - computed at most once per batch, kept on ``left`` for the next point
        share_input(layer, left)
        return layer
    if not (weight := left._trainable("weight")):
        return Layer(left.stage, left.a, left.g - right.g)  # the bias alone: Σ_t g_t − g′_t
    if left.direct_difference():
        grads = {weight: left.weight_rows() - right.weight_rows()}
        if bias := left._trainable("bias"):
            grads[bias] = left.bias_rows(left.g - right.g)
        return Block(left.stage, grads)
    weight_only = replace(left.stage, names=(("weight", weight),))
    return Stacked((Layer(left.stage, left.a, left.g - right.g), Layer(weight_only, left.a - right.a, right.g)))


def share_input(layer: Layer | Block, earlier: Layer | Block) -> None:
    """Give ``layer`` what ``earlier`` computed from its input (``Layer.INPUT_CACHE``), if both
    saw the same input tensor (the data: computed once per batch, not once per point)."""
    if isinstance(layer, Layer) and isinstance(earlier, Layer) and same_memory(layer.a, earlier.a):
        for name in Layer.INPUT_CACHE:
            if name in earlier.__dict__:
                layer.__dict__[name] = earlier.__dict__[name]


def same_memory(x: Tensor, y: Tensor) -> bool:
    """Whether two live tensors are views of the same elements (hence equal)."""
    return (x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
            and x.dtype == y.dtype and x.device == y.device)
