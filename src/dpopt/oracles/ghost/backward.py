"""One backward of the batch's loss to every tap of the functional forward, and the layers'
records made from what it returns."""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _validate
from .in_place import InPlace, ReadInPlace
from .layers import Block, Embedding, Layer
from .stages import LINEAR_KINDS, Stage, rms_normalised


def capture(taps: list[tuple], total_loss: Tensor) -> tuple[Layer | Block | Embedding | InPlace, ...]:
    """One backward of ``total_loss`` (= Σ_i ℓ_i) to every tap: the per-layer records."""
    targets = [t for stage, _, tap in taps
               for t in ((*tap[1].values(), *tap[4]) if stage.kind == "block" else (tap,))]
    grads = iter(torch.autograd.grad(total_loss, targets, allow_unused=True) if targets else ())
    layers: list[Layer | Block | Embedding | InPlace] = []
    for stage, x, tap in taps:
        if isinstance(x, ReadInPlace):  # a first layer whose input, the records, was read in place
            layers.append(x.layer(stage, _given(next(grads), tap)))
            continue
        if stage.kind != "block":
            layers.append(layer_from(stage, *_alike(stage, x.detach(), _given(next(grads), tap))))
            continue
        stage, expanded, calls, inputs, targets = tap  # the stage run (see blocks.run_block)
        if expanded:
            names = dict(stage.names)
            layers.append(Block(stage, {names[local]: _given(next(grads), t) for local, t in expanded.items()}))
        uses: dict[int, list[tuple[Tensor, Tensor]]] = {}
        for (k, shape, _), a, target in zip(calls, inputs, targets):  # g as [B, *output per record]
            g = _given(next(grads), target).reshape(len(a), *shape)
            uses.setdefault(k, []).append(_one_sample(stage.inner[k], a.detach(), g))
        layers += [_calls(stage.inner[k], pairs) for k, pairs in uses.items()]
    return tuple(layers)


def _calls(stage: Stage, pairs: list[tuple[Tensor, Tensor]]) -> Layer | Block | Embedding:
    """One layer from its calls ``(a, g)`` in one forward: a record's gradient is the sum over the
    calls. For a Linear or an Embedding the calls are more positions of one layer (stacked); for
    the others the records' rows of each call are built and added up."""
    if len(pairs) == 1:
        return layer_from(stage, *pairs[0])
    B = len(pairs[0][1])
    if stage.kind in LINEAR_KINDS:
        return Layer(stage, *(torch.cat([t.reshape(B, -1, t.shape[-1]) for t in part], 1) for part in zip(*pairs)))
    layers = [layer_from(stage, a, g) for a, g in pairs]
    # (layer_from gives every call of one stage the class its kind names: the filters drop nothing)
    if stage.kind == "embedding":
        calls = [e for e in layers if isinstance(e, Embedding)]
        return Embedding(stage, torch.cat([e.idx for e in calls], 1), torch.cat([e.g for e in calls], 1))
    rows = [layer.grads if isinstance(layer, Block) else layer.row_dict()
            for layer in layers if not isinstance(layer, Embedding)]
    return Block(stage, {name: functools.reduce(operator.add, (r[name] for r in rows)) for name in rows[0]})


def layer_from(stage: Stage, a: Tensor, g: Tensor) -> Layer | Block | Embedding:
    """The records of a ghost layer from its input ``a`` and output gradient ``g`` (``[B, *per
    record]``; a call inside a block sees each record as a batch of one)."""
    m: Any = stage.module  # the class stage.kind names; nn.Module types its attributes Tensor | Module
    B = len(g)
    if stage.kind in LINEAR_KINDS:
        return Layer(stage, a, g)
    if stage.kind == "embedding":
        idx, g = a.reshape(B, -1), g.reshape(B, -1, g.shape[-1])
        if m.padding_idx is not None:  # the table's padding row gets no gradient
            g = g.masked_fill((idx == m.padding_idx).unsqueeze(2), 0)
        return Embedding(stage, idx, g)
    if stage.kind == "conv":
        return Layer(stage, a, g) if isinstance(m, nn.Conv2d) else Layer(stage, a.unsqueeze(2), g.unsqueeze(2))
    return Block(stage, _norm_rows(stage, a, g))


def _one_sample(stage: Stage, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """A call's input and output gradient from a block, ``[B, *per record]``, as :func:`layer_from`
    takes them: a convolution's or GroupNorm's batched input (each record a batch of one) without
    that dimension of one."""
    m: Any = stage.module  # the class stage.kind names; nn.Module types its attributes Tensor | Module
    if stage.kind == "groupnorm" or (stage.kind == "conv" and a.ndim == len(m.kernel_size) + 3):
        if a.shape[1] != 1:
            raise _validate.DpoptError(f"engine='ghost' takes each record to layer {stage.path!r} as one sample; "
                                       f"it was given {a.shape[1]} per record: use engine='vmap'")
        return _alike(stage, a.squeeze(1), g.squeeze(1))
    return _alike(stage, a, g)


def _norm_rows(stage: Stage, a: Tensor, g: Tensor) -> dict[str, Tensor]:
    """Per-record gradients of a LayerNorm, GroupNorm or RMSNorm's affine parameters: ``y = x̂ ⊙ γ + β``
    (x̂ normalised per record: over the last dims, or per group of channels), so ``∇γ = Σ g ⊙ x̂``
    and ``∇β = Σ g`` over the positions (LayerNorm) or the spatial dims (GroupNorm). x̂ is
    recomputed from the input: ``[B, size of γ]`` rows, a block."""
    m: Any = stage.module  # the class stage.kind names; nn.Module types its attributes Tensor | Module
    B, names = len(g), dict(stage.names)
    if stage.kind == "rmsnorm":  # y = w ⊙ x̂ (no bias): ∇w = Σ_t g_t ⊙ x̂_t
        A, G = a.reshape(B, -1, a.shape[-1]), g.reshape(B, -1, g.shape[-1])
        return {names["weight"]: (G * rms_normalised(A, m.variance_epsilon)).sum(1)}
    if stage.kind == "layernorm":
        shape = tuple(m.normalized_shape)
        A, G = a.reshape(B, -1, *shape), g.reshape(B, -1, *shape)
        xhat, over = F.layer_norm(A, shape, eps=m.eps), 1
    else:
        A, G = a.reshape(B, m.num_channels, -1), g.reshape(B, m.num_channels, -1)
        xhat, over = F.group_norm(A, m.num_groups, eps=m.eps), 2
    rows = {}
    if "weight" in names:
        rows[names["weight"]] = (G * xhat).sum(over).reshape(B, -1)
    if "bias" in names:
        rows[names["bias"]] = G.sum(over).reshape(B, -1)
    return rows


def _alike(stage: Stage, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """A layer's input and output gradient in one floating dtype, the widest of theirs and its
    parameters' (exact casts). Under ``torch.autocast`` a Linear's input may be float32 or bf16
    and its output gradient bf16 while its weight is float32: the records' rows, norms and sums
    are then formed in float32, the rounding bounds (:mod:`.rounding`, from ``a``'s dtype) are
    those of the precision they are computed in, and the sums come out in θ's dtype. An integer
    input (an Embedding's indices) is left as it is. Without autocast, nothing is cast."""
    dtypes = {g.dtype, *(p.dtype for p in stage.module.parameters(recurse=False) if p.is_floating_point())}
    if a.is_floating_point():
        dtypes.add(a.dtype)
    if len(dtypes) == 1:
        return a, g
    dtype = functools.reduce(torch.promote_types, dtypes)
    return (a.to(dtype) if a.is_floating_point() else a), g.to(dtype)


def _given(grad: Tensor | None, like: Tensor) -> Tensor:
    """A gradient from ``autograd.grad(allow_unused=True)``: None (no path to the loss) is zero."""
    return torch.zeros(like.shape, dtype=like.dtype, device=like.device) if grad is None else grad.detach()
