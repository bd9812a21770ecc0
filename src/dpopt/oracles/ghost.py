"""The "ghost" engine: per-record gradient norms and clipped sums without a ``[B, d]`` matrix.

For a layer ``s_t = W a_t + b`` applied at positions t = 1..T of one record (T = 1 for an MLP,
the sequence length for a Linear on ``[B, T, p]``, the number of output pixels for a
convolution seen on its unfolded patches), the record's gradient is ``∇_W ℓ_i = Σ_t g_t a_tᵀ``
and ``∇_b ℓ_i = Σ_t g_t`` with ``g_t = ∂ℓ_i/∂s_t``. Both are known from the layer's input
``a`` and output gradient ``g`` of one ordinary forward/backward, so (Li et al. 2022, "Large
language models can be strong differentially private learners", arXiv:2110.05679; Bu et al.
2022, "Scalable and efficient training of large convolutional neural networks with
differential privacy", arXiv:2205.10683, §4, the "mixed ghost norm"):

* ``‖∇_W ℓ_i‖² = ⟨a aᵀ, g gᵀ⟩`` (two T×T Gram matrices) when 2T² < p·q, else
  ``‖Σ_t g_t a_tᵀ‖²`` with the ``[q, p]`` layer gradient of that record built directly (one
  batched matmul ``g_i [q, T] @ unfold(a_i) [T, p]``); for T = 1 it is ``‖a‖²‖g‖²`` (on the
  patch, per group, for a convolution). Conv2d is the Linear rule on ``unfold(a)`` (im2col,
  one ``index_select``), per group.
* the clipped sum ``Σ_i w_i ∇ℓ_i`` is book-keeping (Bu et al. 2023, "Differentially private
  optimization on large model at small cost", arXiv:2210.00038): the weight-gradient products
  of a backward pass, ``Σ_i w_i g_iᵀ a_i`` per layer (``conv2d_weight`` for convolutions),
  from the stored ``a`` and ``g``; for a layer whose records' gradients were built for the
  norms (direct form) it is ``w @ rows`` of those rows ("BK-MixOpt" in Bu et al. 2023), so those
  layers cost one per-record product for norms and sum together. A Linear layer whose input
  comes back call after call (a full-batch method's data) keeps it transposed for that product
  (:attr:`_Layer.input_t`). It equals the reweighted backward of
  ``Σ_i w_i ℓ_i`` (the
  second pass of ghost clipping) without running it: no second backprop through the network,
  no retained graph, and records with ``w_i = 0`` are left out exactly (a record whose
  gradient is NaN cannot poison the sum), with the same forward as the norms (dropout masks
  agree).
* the difference of two such batches at θ and θ′ (DP-SRM) has, per layer,
  ``Σ_t g_t a_tᵀ − g′_t a′_tᵀ = Σ_t (g_t − g′_t) a_tᵀ + g′_t (a_t − a′_t)ᵀ``: the Linear rule on
  the 2T stacked positions ``[a; a − a′]`` and ``[g − g′; g′]`` (Gram form, chosen by 2·(2T)² <
  p·q, and for a convolution only if its rows at both points, 2·p·q, outweigh the patches the
  stacked form holds, 3·T·p: :func:`use_gram_difference`), or the two records' layer gradients
  built and subtracted (direct form; rows built once per point and shared with the norms and
  the book-keeping sums at that point). Either way the
  norm avoids the cancellation of ``‖A‖² + ‖A′‖² − 2⟨A, A′⟩``, which loses every digit when
  θ′ ≈ θ (every stacked term is already of the size of the difference); the weighted sum is the
  book-keeping sum at θ minus the one at θ′. A layer that saw the same input at both points (a
  first layer, whose input is the data, when the oracle reuses the records' chunk) has
  a′ = a: its difference is the one layer ``(a, g − g′)``, which costs what one point does.

Where the Gram form itself cancels (the terms ``g_t a_tᵀ`` of one record nearly sum to zero:
its worst-case rounding error 2ε·(Σ_t ‖a_t‖‖g_t‖)² could exceed 2e−4 of the result), those
records are recomputed with the direct form, so a norm is not underestimated by rounding.

How layers are found (DESIGN rule 7: no hooks, no monkey-patching). :func:`plan` walks the
module: an ``nn.Sequential`` (whose forward is not overridden) is opened and its children are
run by this module's own functional forward, one stage after another; each child is

* ``linear`` / ``conv``: ``nn.Linear``, ``nn.Conv2d`` (zero padding, forward not overridden,
  ``weight``/``bias`` not parametrized) with trainable parameters: computed here with
  ``F.linear`` / ``F.conv2d`` on views of θ; their outputs are kept and ``torch.autograd.grad``
  w.r.t. those outputs gives every ``g`` in one backward (which skips the weight-gradient
  products: only ``∂ℓ/∂s`` is asked for);
* ``block``: any other module with trainable parameters (GroupNorm, LayerNorm, Embedding, a
  custom layer, a container with its own forward, the whole model if it is not a Sequential):
  run under ``vmap`` with its parameters expanded to one copy per record, so the same backward
  returns that block's per-record gradients ``[B, *shape]`` (dense, but only for that block:
  cheap for normalisation layers, costly for a large Embedding; it must be vmap-compatible,
  as for ``engine="vmap"``). Conv2d with non-zero padding modes or ``padding="same"`` is a block;
* ``plain``: no trainable parameters (activations, pooling, flatten, dropout): called as is,
  except ``nn.MaxPool2d`` on a ≥ 16-channel NCHW input, run with PyTorch's own kernel in
  channels-last layout (the same values, argmax and gradients, see :func:`_plain`).

Layout (CPU): a convolution's input is passed channels-last in float32/bfloat16
(:func:`_channels_last`), so oneDNN returns channels-last outputs and the activations and
max-pools after it stay in that layout (PyTorch's NCHW max-pool kernel is several times slower
on CPU: the MNIST CNN's first pool took 16 ms of a 38 ms plain step, one thread); the norms and
sums read channels-last ``a`` and ``g`` in place. Values agree with the NCHW computation up to
float rounding (oneDNN may sum in another order).

Why not hooks, nor ``autograd.grad`` on every submodule of any model: without hooks the only
outputs we can hold are those of calls we make ourselves, i.e. of a forward we write. For an
``nn.Sequential`` that forward is known (children in order, one tensor passed along, records
along dim 0), so it is rewritten here; a custom ``forward`` is opaque (tracing it with
``torch.fx`` would be the next step).

Limits: layers are seen only inside (nested) ``nn.Sequential`` containers; write models as
Sequentials to get ghost norms (anything else is correct but runs as one dense ``block``).
Module hooks registered by the user are not run for ``linear``/``conv`` stages (a max-pool
with hooks is called as is). A parameter
used by two stages (tied weights) is refused (use ``engine="vmap"``). Records must not interact
in the forward pass: BatchNorm is refused by the oracle; a custom layer that mixes records is
not detected. Squared norms are formed without rescaling, so a record whose gradient norm
exceeds ~1e19 (float32) overflows to ∞ and is dropped by clipping like a NaN record, where the
dense engine would clip it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from .. import _validate
from ..clipping import weights_in

class Layout(Protocol):
    """Where each trainable parameter lives in the flat θ (see ``torch_model.Layout``)."""

    dim: int

    def place(self, name: str) -> slice: ...


@dataclass(frozen=True)
class Stage:
    """One step of the functional forward: ``kind`` is "plain", "linear", "conv" or "block";
    ``names`` pairs each trainable parameter's name in ``module`` with its name in θ."""

    kind: str
    module: nn.Module
    path: str
    names: tuple[tuple[str, str], ...]
    aliases: tuple[tuple[str, ...], ...] = ()   # per parameter: every local name that holds it


def parameter_names(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each distinct parameter's first name → the names of every module attribute holding it.

    ``functional_call`` must be given every such name with ``tie_weights=False``: with the
    default tying, a module reachable by two paths is swapped twice and restored in the wrong
    order, which leaves the passed tensor inside the module (PyTorch 2.13)."""
    names: dict[str, list[str]] = {}
    first: dict[int, str] = {}
    owners: set[tuple[int, str]] = set()
    for name, param in module.named_parameters(remove_duplicate=False):
        prefix, _, attr = name.rpartition(".")
        owner = (id(module.get_submodule(prefix)), attr)
        if owner not in owners:
            owners.add(owner)
            names.setdefault(first.setdefault(id(param), name), []).append(name)
    return {name: tuple(aliases) for name, aliases in names.items()}


def _opens(module: nn.Module) -> bool:
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def _is_conv(module: nn.Module) -> bool:
    return (isinstance(module, nn.Conv2d) and type(module).forward is nn.Conv2d.forward
            and module.padding_mode == "zeros"
            and (not isinstance(module.padding, str) or module.padding == "valid"))


def _padding(module: nn.Conv2d) -> tuple[int, int]:
    return (0, 0) if module.padding == "valid" else module.padding


def plan(module: nn.Module, theta_names: dict[int, str]) -> tuple[Stage, ...]:
    """The stages of ``module``'s forward; ``theta_names`` maps ``id(parameter)`` to its θ name."""
    stages: list[Stage] = []

    def walk(m: nn.Module, path: str) -> None:
        if _opens(m):
            for name, child in m._modules.items():
                walk(child, f"{path}.{name}" if path else name)
            return
        params = dict(m.named_parameters())
        local = {name: aliases for name, aliases in parameter_names(m).items() if id(params[name]) in theta_names}
        names = tuple((name, theta_names[id(params[name])]) for name in local)
        kind = ("plain" if not names else "block" if not set(local) <= {"weight", "bias"}  # e.g. parametrized
                else "linear" if _is_linear(m) else "conv" if _is_conv(m) else "block")
        stages.append(Stage(kind, m, path or "<model>", names, tuple(local.values())))

    walk(module, "")
    shared = sorted(name for name, count in Counter(t for s in stages for _, t in s.names).items() if count > 1)
    if shared:
        raise _validate.DpoptError(
            f"engine='ghost' needs each parameter in one layer, but {', '.join(shared)} is used by several "
            "(tied weights or a module used twice): its per-record gradient is a sum over layers whose ghost "
            "norms do not add up; use engine='vmap'")
    return tuple(stages)


def describe(stages: tuple[Stage, ...]) -> list[tuple[str, str]]:
    """``(path, rule)`` of each stage with trainable parameters: "ghost" or "vmap" (a block)."""
    return [(s.path, "vmap" if s.kind == "block" else "ghost") for s in stages if s.kind != "plain"]


def _one_record(module: nn.Module, params: dict[str, Tensor], x: Tensor) -> Tensor:
    return functional_call(module, params, (x.unsqueeze(0),), tie_weights=False).squeeze(0)


#: Max-pooling of NCHW inputs with at least this many channels runs in channels-last layout.
CHANNELS_LAST_POOL = 16


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``F.max_pool2d`` of a contiguous NCHW ``x`` computed in channels-last layout; the output
    and the input gradient come back contiguous NCHW (so the layers' output gradients ``g`` stay
    NCHW for the norms and the convolutions' backward)."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel, stride, padding, dilation, ceil_mode: bool) -> Tensor:  # noqa: ANN001
        out, indices = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last), kernel, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(indices)
        ctx.args, ctx.shape = (kernel, stride, padding, dilation, ceil_mode), x.shape
        return out.contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):  # noqa: ANN205
        (indices,) = ctx.saved_tensors
        # the kernel reads only the input's shape and layout (it zero-fills and scatters)
        like = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device, memory_format=torch.channels_last)
        grad_input = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(memory_format=torch.channels_last), like, *ctx.args, indices)
        return grad_input.contiguous(), None, None, None, None, None


#: dtypes whose CPU convolutions (oneDNN) run faster in channels-last layout.
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16)


def _channels_last(x: Tensor) -> Tensor:
    """A convolution's input in channels-last layout (CPU, oneDNN dtypes; else ``x``).

    oneDNN then returns the output channels-last too, so the activations and max-pools that
    follow run in that layout (PyTorch's NCHW max-pool kernel is several times slower on CPU)
    and the backward returns channels-last output gradients ``g``: viewed as ``[B, T, q]``
    positions without a copy by :meth:`_Layer.matrices` and :meth:`_Layer.per_record`.
    With one channel the layouts share their memory: only the strides say channels-last.
    """
    if x.ndim != 4 or x.device.type != "cpu" or x.dtype not in CHANNELS_LAST_DTYPES:
        return x
    if x.shape[1] == 1 and x.is_contiguous():
        B, _, H, W = x.shape
        return x.reshape(B, H, W, 1).permute(0, 3, 1, 2)
    return x.contiguous(memory_format=torch.channels_last)


def _hwc(x: Tensor) -> bool:
    """Whether ``x [B, C, H, W]`` is stored channels-last (and C > 1, where the layouts differ)."""
    return x.shape[1] > 1 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _plain(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)`` for a stage without trainable parameters.

    A plain ``nn.MaxPool2d`` (forward not overridden, no hooks, no indices returned) on a
    contiguous ``[B, C, H, W]`` CPU input with C ≥ :data:`CHANNELS_LAST_POOL` runs PyTorch's own
    max-pool kernel in its channels-last variant: several times faster on CPU than the NCHW one
    (16 ms against 3.6 ms for the MNIST CNN's first pool, batch 256, one thread), with the same
    values and the same argmax (the first maximum of each window, NaN wins), so the forward and
    every gradient are unchanged.
    """
    if (type(m) is nn.MaxPool2d and x.ndim == 4 and x.shape[1] >= CHANNELS_LAST_POOL and x.is_contiguous()
            and x.device.type == "cpu" and not m.return_indices
            and not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)):
        stride = m.stride if m.stride is not None else m.kernel_size
        return _ChannelsLastMaxPool.apply(x, _pair(m.kernel_size), _pair(stride), _pair(m.padding),
                                          _pair(m.dilation), m.ceil_mode)
    return m(x)


def forward(stages: tuple[Stage, ...], views: dict[str, Tensor], x: Tensor) -> tuple[Tensor, list[tuple]]:
    """Run the stages on ``x`` with parameters ``views`` (θ name → tensor). Returns the output
    and, per stage with parameters, ``(stage, input, tap)``: the tap is the stage's output
    (linear/conv) or its per-record expanded parameters (block), to differentiate against."""
    taps = []
    for stage in stages:
        m = stage.module
        if stage.kind == "plain":
            x = _plain(m, x)
            continue
        params = {local: views[name] for local, name in stage.names}
        if stage.kind == "block":
            expanded = {local: p.expand(len(x), *p.shape) for local, p in params.items()}
            every = {alias: expanded[local] for (local, _), aliases in zip(stage.names, stage.aliases)
                     for alias in aliases}
            out = vmap(lambda ps, xi: _one_record(m, ps, xi), randomness="different")(every, x)
            taps.append((stage, x, expanded))
        else:
            weight, bias = params.get("weight", m.weight), params.get("bias", m.bias)
            if stage.kind == "linear":
                out = _linear(x, weight, bias)
            else:
                x = _channels_last(x)
                out = F.conv2d(x, weight, bias, m.stride, _padding(m), m.dilation, m.groups)
            taps.append((stage, x, out))
        x = out
    return x, taps


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``; for a 2-D input with more records than the weight has
    entries, with the weight copied to a contiguous ``[p, q]`` first: MKL's kernel for
    ``x @ Wᵀ`` on the transposed weight is slow when x is tall and q small (BlogFeedback's first
    layer, 48k × 280 → 10 in float64, one thread: 24 ms against 19–21 ms), and the copy is
    negligible there. Smaller batches keep ``F.linear`` (the copy costs more than it saves)."""
    if x.ndim != 2 or x.shape[0] < weight.numel():
        return F.linear(x, weight, bias)
    w_t = weight.T.contiguous()
    return x @ w_t if bias is None else torch.addmm(bias, x, w_t)


def capture(taps: list[tuple], total_loss: Tensor) -> tuple[_Layer | _Block, ...]:
    """One backward of ``total_loss`` (= Σ_i ℓ_i) to every tap: the per-layer records."""
    targets = [t for stage, _, tap in taps for t in (tap.values() if stage.kind == "block" else [tap])]
    grads = iter(torch.autograd.grad(total_loss, targets, allow_unused=True) if targets else ())
    layers: list[_Layer | _Block] = []
    for stage, x, tap in taps:
        if stage.kind == "block":
            names = dict(stage.names)
            layers.append(_Block(stage, {names[local]: _given(next(grads), t) for local, t in tap.items()}))
        else:
            layers.append(_Layer(stage, x.detach(), _given(next(grads), tap)))
    return tuple(layers)


def _given(grad: Tensor | None, like: Tensor) -> Tensor:
    """A gradient from ``autograd.grad(allow_unused=True)``: None (no path to the loss) is zero."""
    return torch.zeros(like.shape, dtype=like.dtype, device=like.device) if grad is None else grad.detach()


def _sq_rows(rows: Tensor) -> Tensor:
    """``‖row‖²`` of each row of ``[R, n]`` (one fused reduction: 2.5× faster on CPU than
    ``square().sum(1)``, which writes the squares out first)."""
    return torch.linalg.vector_norm(rows, dim=1).square()


def use_gram(T: int, p: int, q: int) -> bool:
    """Bu et al.'s layer-wise choice: Gram matrices (B·T² memory) iff 2T² < p·q (the size of the
    layer's per-record gradient, built by the direct form)."""
    return 2 * T * T < p * q


def use_gram_difference(T: int, p: int, q: int, conv: bool) -> bool:
    """The choice for the difference of two points (DP-SRM), 2T stacked positions: the Gram form
    iff :func:`use_gram` says so for 2T positions and, for a convolution, the records' layer
    gradients at both points (2·p·q per record) would take more memory than the im2col patches
    the stacked Gram form holds (both points' and their difference, 3·T·p), i.e. iff 2q > 3T.
    Otherwise the direct form: it needs no more memory, and its rows also give the norms at
    each point and the three book-keeping sums of a DP-SRM step without a backward product (the
    MNIST CNN's second convolution, T = 25, q = 32: its share of a DP-SRM step about halves)."""
    return use_gram(2 * T, p, q) and not (conv and 2 * q <= 3 * T)


def gram_sq_norms(pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """``‖Σ_k Σ_t G^k_t A^k_tᵀ‖²`` per row from Gram matrices, for pairs ``A^k [R, T, p]``,
    ``G^k [R, T, q]``: ``Σ_{k,l} ⟨A^k A^lᵀ, G^k G^lᵀ⟩``. Also returns ``(Σ_k Σ_t ‖A^k_t‖‖G^k_t‖)²``,
    which bounds every term (the rounding error is ~ε times it)."""
    sq = bound = pairs[0][0].new_zeros(pairs[0][0].shape[0])
    for k, (A, G) in enumerate(pairs):
        for A2, G2 in pairs[k:]:
            AA, GG = _gram(A, A2), _gram(G, G2)
            term = (AA * GG).sum((1, 2))
            if A2 is A:  # ‖A_t‖², ‖G_t‖² are the diagonals of the Gram matrices (no second pass over A)
                sq = sq + term
                bound = bound + (AA.diagonal(dim1=1, dim2=2) * GG.diagonal(dim1=1, dim2=2)).sqrt().sum(1)
            else:
                sq = sq + 2 * term
    return sq, bound.square()


def _gram(X: Tensor, Y: Tensor) -> Tensor:
    """``X Yᵀ`` per row, ``[R, T, T]``; a product of scalars when T = 1 and the rows have one
    entry (a one-output layer's g: a batched 1×1 matmul costs 4× more on CPU)."""
    return X * Y if X.shape[1:] == (1, 1) else X @ Y.mT


@lru_cache(maxsize=32)
def _patch_index(shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int], hwc: bool, device: torch.device) -> Tensor:
    """Positions of the ``[L, C·kh·kw]`` patches in one flattened (padded) ``[C, H, W]`` input,
    stored ``C, H, W`` or (``hwc``) ``H, W, C``."""
    (C, H, W), (kh, kw), (sh, sw), (dh, dw) = shape, kernel, stride, dilation
    Ho, Wo = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    row, col, channel = (W * C, C, 1) if hwc else (W, 1, H * W)  # strides of h, w, c
    arange = lambda n, step: torch.arange(n, dtype=torch.int64) * step  # noqa: E731
    index = (arange(Ho, sh * row).view(-1, 1, 1, 1, 1) + arange(Wo, sw * col).view(1, -1, 1, 1, 1)
             + arange(C, channel).view(1, 1, -1, 1, 1) + arange(kh, dh * row).view(1, 1, 1, -1, 1)
             + arange(kw, dw * col).view(1, 1, 1, 1, -1))
    return index.reshape(-1).to(device, torch.int32 if C * H * W < 2**31 else torch.int64)


def unfold(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """im2col: ``[B, L, C·kh·kw]`` patches of ``x [B, C, H, W]`` (``F.unfold``'s order, transposed;
    x in NCHW or channels-last layout), gathered with one ``index_select`` of precomputed
    positions (2–5× faster on CPU than ``F.unfold`` or a strided copy)."""
    (ph, pw) = _padding(conv)
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    B, C, H, W = x.shape
    hwc = _hwc(x)  # channels-last: gather from its own memory order, no copy to NCHW first
    index = _patch_index((C, H, W), conv.kernel_size, conv.stride, conv.dilation, hwc, x.device)
    flat = x.permute(0, 2, 3, 1).reshape(B, H * W * C) if hwc else x.reshape(B, C * H * W)
    p = C * conv.kernel_size[0] * conv.kernel_size[1]
    return flat.index_select(1, index).view(B, index.numel() // p, p)


@dataclass(frozen=True)
class _Layer:
    """A Linear or Conv2d stage of one chunk: its input ``a`` and output gradient ``g``."""

    stage: Stage
    a: Tensor
    g: Tensor

    def _trainable(self, local: str) -> str | None:
        return dict(self.stage.names).get(local)

    def shape(self) -> tuple[int, int, int, int]:
        """``(groups, T, p, q)`` of the Linear rule (per group for a convolution)."""
        m = self.stage.module
        if self.stage.kind == "linear":
            return 1, self.a[0].numel() // self.a.shape[-1], self.a.shape[-1], self.g.shape[-1]
        groups = m.groups
        return groups, self.g.shape[2] * self.g.shape[3], m.weight[0].numel(), m.out_channels // groups

    def matrices(self) -> tuple[Tensor, Tensor]:
        """``A [B·groups, T, p]`` and ``G [B·groups, T, q]`` of the Linear rule."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if self.stage.kind == "linear":
            return self.a.reshape(B, T, p), self.g.reshape(B, T, q)
        A = unfold(self.a, self.stage.module).view(B, T, groups, p).transpose(1, 2).reshape(B * groups, T, p)
        return A, self._positions(self.g)

    def _positions(self, g: Tensor) -> Tensor:
        """A convolution's output gradient ``g [B, groups·q, Ho, Wo]`` as ``G [B·groups, T, q]``
        (a view when g is channels-last and there is one group)."""
        B, (groups, T, _, q) = g.shape[0], self.shape()
        if _hwc(g):
            return g.permute(0, 2, 3, 1).reshape(B, T, groups, q).transpose(1, 2).reshape(B * groups, T, q)
        return g.reshape(B, groups, q, T).transpose(2, 3).reshape(B * groups, T, q)

    def per_record(self, kept: Tensor | None = None) -> Tensor:
        """The records' weight gradients ``[B, q·p]`` (direct form), optionally of ``kept`` only."""
        a, g = (self.a, self.g) if kept is None else (self.a[kept], self.g[kept])
        m, B = self.stage.module, a.shape[0]
        if self.stage.kind == "linear":
            G, A = g.reshape(B, -1, g.shape[-1]), a.reshape(B, -1, a.shape[-1])
            return torch.einsum("btq,btp->bqp", G, A).reshape(B, -1)
        # per (record, conv group): G [q, T] @ A [T, p], A the im2col patches (one batched matmul)
        groups, T, p, q = self.shape()
        A = unfold(a, m)
        if groups > 1:
            A = A.view(B, T, groups, p).transpose(1, 2).reshape(B * groups, T, p)
        G = self._positions(g).mT if _hwc(g) else g.reshape(B * groups, q, T)  # [B·groups, q, T], a view
        return torch.bmm(G, A).reshape(B, -1)

    @cached_property
    def rows(self) -> Tensor:
        """:meth:`per_record` of every record, built once: the direct form's norms, the difference
        of two points and the book-keeping sum all use it."""
        return self.per_record()

    @cached_property
    def bias_g(self) -> Tensor:
        """The bias gradient rows ``[B, q]``."""
        return self.bias_rows(self.g)

    def bias_rows(self, g: Tensor) -> Tensor:
        """``Σ_t g_t`` per record: the bias gradient rows ``[B, q]``."""
        return g.reshape(g.shape[0], -1, g.shape[-1]).sum(1) if self.stage.kind == "linear" else g.sum((2, 3))

    @cached_property
    def input_sq_norms(self) -> Tensor:
        """``‖a_i‖²`` of each record's input (a Linear layer at one position)."""
        return _sq_rows(self.a.reshape(self.a.shape[0], -1))

    @cached_property
    def input_t(self) -> Tensor:
        """A Linear layer's input as a contiguous ``[p, B·T]``: the layout in which MKL computes
        the book-keeping product fastest, ``aᵀ (w·g)`` (BlogFeedback's first layer, 48k × 280 →
        10 in float64, one thread: 11 ms against 17–19 ms for ``(w·g)ᵀ a``). The copy costs a
        pass over ``a``, so it is made only for an input that comes back (:func:`reuse_inputs`)."""
        return self.a.reshape(-1, self.a.shape[-1]).T.contiguous()

    #: What is computed from the input alone, shared by the layers that saw the same input.
    INPUT_CACHE = ("input_sq_norms", "input_t")

    def direct_difference(self) -> bool:
        """Whether the difference with another point takes the direct form (rows at both points)."""
        groups, T, p, q = self.shape()
        return bool(self._trainable("weight")) and not use_gram_difference(T, p, q, self.stage.kind == "conv")

    def _weight_sq_norms(self, other: _Layer | None) -> Tensor:
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if other is None and "rows" in self.__dict__:  # built already (for a difference): exact and cheap
            return _sq_rows(self.rows)
        if T == 1 and other is None:  # one position: ‖g aᵀ‖² = ‖a‖²‖g‖² (per conv group, on the patch)
            if self.stage.kind == "linear":
                return self.input_sq_norms * _sq_rows(self.g.reshape(B, -1))
            A, G = self.matrices()
            return (A.square().sum((1, 2)) * G.square().sum((1, 2))).view(B, groups).sum(1)
        gram = use_gram(T, p, q) if other is None else use_gram_difference(T, p, q, self.stage.kind == "conv")
        if not gram:
            rows = self.rows if other is None else self.rows - other.rows
            return _sq_rows(rows)
        A, G = self.matrices()
        if other is None:
            pairs = [(A, G)]
        else:  # Σ_t g_t a_tᵀ − g′_t a′_tᵀ = Σ_t (g_t − g′_t) a_tᵀ + g′_t (a_t − a′_t)ᵀ
            A2, G2 = other.matrices()
            pairs = [(A, G - G2), (A - A2, G2)]
        sq, bound = (part.view(B, groups).sum(1) for part in gram_sq_norms(pairs))
        cancelled = sq < 1e4 * torch.finfo(sq.dtype).eps * bound
        if cancelled.any():  # the Gram form lost the digits of these records: build their gradients
            rows = self.per_record(cancelled) - (0 if other is None else other.per_record(cancelled))
            sq[cancelled] = _sq_rows(rows)
        return sq

    def sq_norms(self) -> Tensor:
        sq = self.a.new_zeros(self.a.shape[0])
        if self._trainable("weight"):
            sq = sq + self._weight_sq_norms(None)
        if self._trainable("bias"):
            sq = sq + _sq_rows(self.bias_g)
        return sq

    def diff_sq_norms(self, other: _Layer) -> Tensor:
        sq = self.a.new_zeros(self.a.shape[0])
        if self._trainable("weight"):
            sq = sq + self._weight_sq_norms(other)
        if self._trainable("bias"):
            sq = sq + _sq_rows(self.bias_rows(self.g - other.g))  # differences first: no cancellation
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        """``total += Σ_i w_i ∇ℓ_i`` over the records ``kept`` (None: all). Where the records'
        weight gradients were built (the direct form) the sum is ``w @ rows``, else the
        weight-gradient product of a backward pass on ``(a, w·g)``."""
        m = self.stage.module
        v = w if kept is None else w[kept]
        if weight := self._trainable("weight"):
            rows = self.__dict__.get("rows")  # built by the norms (cached_property)
            if rows is not None:
                grad = v @ (rows if kept is None else rows[kept])
            else:
                a, g = (self.a, self.g) if kept is None else (self.a[kept], self.g[kept])
                gw = g * v.view(-1, *[1] * (g.ndim - 1))
                if self.stage.kind == "linear" and kept is None and "input_t" in self.__dict__:
                    grad = (self.input_t @ gw.reshape(-1, gw.shape[-1])).T
                elif self.stage.kind == "linear":
                    grad = gw.reshape(-1, gw.shape[-1]).T @ a.reshape(-1, a.shape[-1])
                else:
                    grad = torch.nn.grad.conv2d_weight(a, m.weight.shape, gw, m.stride, _padding(m), m.dilation,
                                                       m.groups)
            total[layout.place(weight)] += grad.reshape(-1)
        if bias := self._trainable("bias"):
            total[layout.place(bias)] += v @ (self.bias_g if kept is None else self.bias_g[kept])


@dataclass(frozen=True)
class _Block:
    """A stage without a ghost rule: its per-record gradients ``grads`` (θ name → ``[B, *shape]``)."""

    stage: Stage
    grads: dict[str, Tensor]

    def sq_norms(self) -> Tensor:
        return sum(_sq_rows(g.flatten(1)) for g in self.grads.values())

    def diff_sq_norms(self, other: _Block) -> Tensor:
        return sum(_sq_rows((g - other.grads[name]).flatten(1)) for name, g in self.grads.items())

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        for name, g in self.grads.items():
            g, v = (g, w) if kept is None else (g[kept], w[kept])
            total[layout.place(name)] += v @ g.flatten(1)


@dataclass(frozen=True)
class _Pair:
    """One layer's per-record gradients at two points, ``left − right``, whose inputs differ."""

    left: _Layer | _Block
    right: _Layer | _Block

    def sq_norms(self) -> Tensor:
        return self.left.diff_sq_norms(self.right)

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        self.left.add_weighted(w, kept, total, layout)
        self.right.add_weighted(-w, kept, total, layout)


def _difference(left: _Layer | _Block, right: _Layer | _Block) -> _Layer | _Pair:
    """The layer of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``. Where both points saw the same input (a first layer,
    whose input is the data) it is one layer, exactly:
    ``Σ_t g_t a_tᵀ − g′_t a_tᵀ = Σ_t (g_t − g′_t) a_tᵀ``
    (norms and sums then cost what one point's do, with no cancellation); otherwise the pair."""
    if isinstance(left, _Layer) and isinstance(right, _Layer) and _same_memory(left.a, right.a):
        _share_input(left, right)
        difference = _Layer(left.stage, left.a, left.g - right.g)
        left.input_sq_norms  # noqa: B018 - computed at most once per batch, kept on ``left`` for the next point
        _share_input(difference, left)
        return difference
    return _Pair(left, right)


def _share_input(layer: _Layer | _Block, earlier: _Layer | _Block) -> None:
    """Give ``layer`` what ``earlier`` computed from its input (``_Layer.INPUT_CACHE``), if both
    saw the same input tensor (the data: computed once per batch, not once per point)."""
    if isinstance(layer, _Layer) and isinstance(earlier, _Layer) and _same_memory(layer.a, earlier.a):
        for name in _Layer.INPUT_CACHE:
            if name in earlier.__dict__:
                layer.__dict__[name] = earlier.__dict__[name]


def reuse_inputs(rows: GhostRows, earlier: GhostRows) -> None:
    """``rows`` are the records of ``earlier`` at another point: give their layers what
    ``earlier`` computed from the same input tensors. A Linear layer's input that has come back
    (a full-batch method's data, every round) is also transposed once for the book-keeping
    product (:attr:`_Layer.input_t`), and the copy is handed on with it."""
    for layers, earlier_layers in zip(rows.chunks, earlier.chunks):
        for layer, earlier_layer in zip(layers, earlier_layers):
            if (isinstance(layer, _Layer) and isinstance(earlier_layer, _Layer) and layer.stage.kind == "linear"
                    and _same_memory(layer.a, earlier_layer.a)):
                earlier_layer.input_t  # noqa: B018 - built on the first return of this input
            _share_input(layer, earlier_layer)


def _same_memory(x: Tensor, y: Tensor) -> bool:
    """Whether two live tensors are views of the same elements (hence equal)."""
    return (x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
            and x.dtype == y.dtype and x.device == y.device)


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

    ``norms()`` are ghost norms; ``weighted_sum(w)`` is the book-keeping sum Σ_i w_i ∇ℓ_i. Both
    come back in ``dtype`` on ``device`` (θ's). ``self - other`` (same records, another θ) is
    the GhostRows of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``, layer by layer (:func:`_difference`), with exact
    norms (stacked ghost norms, no cancellation) and sums; it is not subtracted again.
    """

    chunks: tuple[tuple, ...]
    sizes: tuple[int, ...]
    layout: Layout
    like: Tensor      # an empty tensor of the computing dtype and device
    dtype: torch.dtype
    device: torch.device

    @cached_property
    def _norms(self) -> Tensor:
        sq = [sum((layer.sq_norms() for layer in layers), self.like.new_zeros(size))
              for layers, size in zip(self.chunks, self.sizes)]
        return torch.cat(sq).sqrt() if sq else self.like.new_zeros(0)

    def norms(self) -> Tensor:
        return self._norms.to(self.device, self.dtype)

    def weighted_sum(self, weights: Tensor) -> Tensor:
        return _weighted_sum(self.chunks, self.sizes, weights, self.layout, self.like).to(self.device, self.dtype)

    def __sub__(self, other: GhostRows) -> GhostRows:
        if not isinstance(other, GhostRows):
            return NotImplemented
        if self.sizes != other.sizes or [len(c) for c in self.chunks] != [len(c) for c in other.chunks]:
            raise ValueError("ghost rows can only be subtracted on the same records, chunked the same way")
        difference = tuple(tuple(_difference(a, b) for a, b in zip(mine, theirs))
                           for mine, theirs in zip(self.chunks, other.chunks))
        for layers in difference:
            for layer in layers:
                if isinstance(layer, _Pair) and isinstance(layer.left, _Layer) and layer.left.direct_difference():
                    layer.left.rows, layer.right.rows  # noqa: B018 - built now, so the norms at each point use them too
        return GhostRows(difference, self.sizes, self.layout, self.like, self.dtype, self.device)

