"""The ghost engine's functional forward: each stage of the plan run with views of θ, its ghost
layers' outputs kept as the taps to differentiate against.

Layout (CPU): a Conv2d stage's input is passed channels-last in float32/bfloat16
(:func:`channels_last`), so oneDNN returns channels-last outputs and the activations and
max-pools after it stay in that layout (PyTorch's NCHW max-pool kernel is several times slower
on CPU: the MNIST CNN's first pool took 16 ms of a 38 ms plain step, one thread); the norms and
sums read channels-last ``a`` and ``g`` in place. Values agree with the NCHW computation up to
float rounding (oneDNN may sum in another order).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _validate
from .blocks import per_record, run_block
from .conv import channels_last, geometry
from .stages import Stage, hooked, rms_normalised

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


def _pair(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return (value, value) if isinstance(value, int) else tuple(value)


def run_plain(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)`` for a stage without trainable parameters.

    A plain ``nn.MaxPool2d`` (forward not overridden, no hooks, no indices returned) on a
    contiguous ``[B, C, H, W]`` CPU input with C ≥ :data:`CHANNELS_LAST_POOL` runs PyTorch's own
    max-pool kernel in its channels-last variant: several times faster on CPU than the NCHW one
    (16 ms against 3.6 ms for the MNIST CNN's first pool, batch 256, one thread), with the same
    values and the same argmax (the first maximum of each window, NaN wins), so the forward and
    every gradient are unchanged.
    """
    if (type(m) is nn.MaxPool2d and x.ndim == 4 and x.shape[1] >= CHANNELS_LAST_POOL and x.is_contiguous()
            and x.device.type == "cpu" and not m.return_indices and not hooked(m)):
        stride = m.stride if m.stride is not None else m.kernel_size
        return _ChannelsLastMaxPool.apply(x, _pair(m.kernel_size), _pair(stride), _pair(m.padding),
                                          _pair(m.dilation), m.ceil_mode)
    return m(x)


def forward(stages: tuple[Stage, ...], views: dict[str, Tensor], x: Tensor, taps: bool = True
            ) -> tuple[Tensor, list[tuple]]:
    """Run the stages on ``x`` with parameters ``views`` (θ name → tensor). Returns the output
    and, per stage with parameters, ``(stage, input, tap)``: the tap is the stage's output (a
    ghost layer) or what :func:`~.blocks.run_block` returns, to differentiate against
    (``taps=False``: only the output). A "plain" module that has hooks now is run per record (a
    hook might mix records). With taps, a ghost layer's output that a later stage overwrites in
    place (e.g. ``nn.ReLU(inplace=True)``) is refused: its output gradient would be that of the
    overwritten values."""
    out_taps: list[tuple] = []
    for stage in stages:
        m = stage.module
        if stage.kind == "plain" and not hooked(m):
            x = run_plain(m, x)
            continue
        if stage.kind in ("plain", "isolated"):
            x, _ = per_record(stage, {}, x)
            continue
        if stage.kind == "block":
            out, tap = run_block(stage, views, x, taps)
            out_taps.append((stage, x, tap))
            x = out
            continue
        if not stage.names and hooked(m):  # hooks added since the plan: they might mix records
            x, _ = per_record(stage, {}, x)
            continue
        params = {local: views[name] for local, name in stage.names}
        if stage.kind == "conv" and isinstance(m, nn.Conv2d):
            x = channels_last(x)
        out = _functional(stage, params, x)
        if stage.names:
            out_taps.append((stage, x, out))
        x = out
    if taps:
        check_not_overwritten(out_taps)
    return x, out_taps


def check_not_overwritten(out_taps: list[tuple]) -> None:
    """Refuse a ghost layer's kept output that was modified in place after the layer made it (a
    fresh output's version counter is 0): autograd would give the gradient with respect to the
    new values, not the layer's output gradient ``g``."""
    for stage, _, tap in out_taps:
        if stage.kind != "block" and tap._version:
            raise _validate.DpoptError(
                f"engine='ghost': the output of layer {stage.path!r} ({type(stage.module).__name__}) is overwritten in "
                "place by a later module (an in-place activation such as nn.ReLU(inplace=True)), so its output "
                "gradient is lost: use the out-of-place layer (dpopt.fix(model) returns a copy with in-place "
                "activations replaced) or engine='vmap'")


def _functional(stage: Stage, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """A ghost layer's output with its trainable parameters ``params`` (its own frozen ones else),
    computed here, without the module's call (and so without hooks)."""
    m: Any = stage.module  # the class stage.kind names; nn.Module types its attributes Tensor | Module
    least, most = {"linear": (2, None), "linear_t": (2, None), "conv": (len(getattr(m, "kernel_size", ())) + 2,) * 2,
                   "layernorm": (len(getattr(m, "normalized_shape", ())) + 1, None),
                   "rmsnorm": (2, None)}.get(stage.kind, (1, None))
    if x.ndim < least or (most is not None and x.ndim > most):
        raise _validate.DpoptError(
            f"engine='ghost' runs layer {stage.path!r} ({type(m).__name__}) on the whole batch, records along dim 0, "
            f"so its input must have {least}{'' if most == least else ' or more'} dims; it has shape "
            f"{tuple(x.shape)}, with which the layer would act across records")
    weight, bias = params.get("weight", m.weight), params.get("bias", getattr(m, "bias", None))
    if stage.kind == "linear":
        return _linear(x, weight, bias)
    if stage.kind == "linear_t":  # transformers' Conv1D: x W + b, W stored [in, out]
        return _linear(x, weight.T, bias)
    if stage.kind == "conv":
        conv = F.conv2d if isinstance(m, nn.Conv2d) else F.conv1d
        padding = geometry(m).padding[-len(m.kernel_size):]
        return conv(x, weight, bias, m.stride, padding, m.dilation, m.groups)
    if stage.kind == "embedding":
        return F.embedding(x, weight, m.padding_idx)
    if stage.kind == "layernorm":
        return F.layer_norm(x, m.normalized_shape, weight, bias, m.eps)
    if stage.kind == "rmsnorm":  # transformers' RMSNorm: w ⊙ x̂, as its forward computes it
        return weight * rms_normalised(x, m.variance_epsilon)
    return F.group_norm(x, m.num_groups, weight, bias, m.eps)


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
