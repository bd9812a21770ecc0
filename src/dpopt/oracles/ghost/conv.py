"""A convolution seen as the Linear rule on its patches: its Conv2d geometry, im2col, and the
channels-last layout in which CPU convolutions run faster."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: dtypes whose CPU convolutions (oneDNN) run faster in channels-last layout.
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16)


def channels_last(x: Tensor) -> Tensor:
    """A convolution's input in channels-last layout (CPU, oneDNN dtypes; else ``x``).

    oneDNN then returns the output channels-last too, so the activations and max-pools that
    follow run in that layout (PyTorch's NCHW max-pool kernel is several times slower on CPU)
    and the backward returns channels-last output gradients ``g``: viewed as ``[B, T, q]``
    positions without a copy by :meth:`~.layers.Layer.matrices` and :attr:`~.layers.Layer._direct`.
    With one channel the layouts share their memory: only the strides say channels-last.
    """
    if x.ndim != 4 or x.device.type != "cpu" or x.dtype not in CHANNELS_LAST_DTYPES:
        return x
    if x.shape[1] == 1 and x.is_contiguous():
        B, _, H, W = x.shape
        return x.reshape(B, H, W, 1).permute(0, 3, 1, 2)
    return x.contiguous(memory_format=torch.channels_last)


def hwc(x: Tensor) -> bool:
    """Whether ``x [B, C, H, W]`` is stored channels-last (and C > 1, where the layouts differ)."""
    return x.shape[1] > 1 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


@lru_cache(maxsize=32)
def _patch_index(shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int], in_hwc: bool, device: torch.device) -> Tensor:
    """Positions of the ``[L, C·kh·kw]`` patches in one flattened (padded) ``[C, H, W]`` input,
    stored ``C, H, W`` or (``in_hwc``) ``H, W, C``."""
    (C, H, W), (kh, kw), (sh, sw), (dh, dw) = shape, kernel, stride, dilation
    Ho, Wo = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    row, col, channel = (W * C, C, 1) if in_hwc else (W, 1, H * W)  # strides of h, w, c
    arange = lambda n, step: torch.arange(n, dtype=torch.int64) * step  # noqa: E731
    index = (arange(Ho, sh * row).view(-1, 1, 1, 1, 1) + arange(Wo, sw * col).view(1, -1, 1, 1, 1)
             + arange(C, channel).view(1, 1, -1, 1, 1) + arange(kh, dh * row).view(1, 1, 1, -1, 1)
             + arange(kw, dw * col).view(1, 1, 1, 1, -1))
    return index.reshape(-1).to(device)


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution as a Conv2d: a Conv1d of kernel k is one of kernel (1, k) on inputs ``[B, C, 1, L]``."""

    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    weight_shape: tuple[int, int, int, int]


def geometry(module: nn.Module) -> ConvGeometry:
    """The Conv2d geometry of a zero-padded ``nn.Conv2d`` or ``nn.Conv1d``."""
    conv: Any = module  # a Conv1d or Conv2d; nn.Module types its attributes Tensor | Module
    padding = (0,) * len(conv.kernel_size) if conv.padding == "valid" else tuple(conv.padding)
    if isinstance(conv, nn.Conv2d):  # its sizes are pairs (typed tuple[int, ...] by torch)
        (kh, kw), (sh, sw), (dh, dw), w = conv.kernel_size, conv.stride, conv.dilation, conv.weight.shape
        return ConvGeometry((kh, kw), (sh, sw), (padding[0], padding[1]), (dh, dw), conv.groups,
                            (w[0], w[1], w[2], w[3]))
    return ConvGeometry((1, conv.kernel_size[0]), (1, conv.stride[0]), (0, padding[0]), (1, conv.dilation[0]),
                        conv.groups, (*conv.weight.shape[:2], 1, conv.weight.shape[2]))


def unfold(x: Tensor, conv: ConvGeometry) -> Tensor:
    """im2col: ``[B, L, C·kh·kw]`` patches of ``x [B, C, H, W]`` (``F.unfold``'s order, transposed;
    x in NCHW or channels-last layout), gathered with one ``gather`` of precomputed positions
    (2–5× faster on CPU than ``F.unfold`` or a strided copy; ``gather`` runs on every thread,
    ``index_select`` along dim 1 on one: 1.0 ms against 1.5 ms for the MNIST CNN's first layer,
    batch 260, two threads)."""
    return patches(padded(x, conv), conv)


def padded(x: Tensor, conv: ConvGeometry) -> Tensor:
    """``x`` with the convolution's zero padding."""
    (ph, pw) = conv.padding
    return F.pad(x, (pw, pw, ph, ph)) if ph or pw else x


def patches(x: Tensor, conv: ConvGeometry) -> Tensor:
    """:func:`unfold` of an input ``x`` already padded."""
    B, C, H, W = x.shape
    in_hwc = hwc(x)  # channels-last: gather from its own memory order, no copy to NCHW first
    index = _patch_index((C, H, W), conv.kernel_size, conv.stride, conv.dilation, in_hwc, x.device)
    flat = x.permute(0, 2, 3, 1).reshape(B, H * W * C) if in_hwc else x.reshape(B, C * H * W)
    p = C * conv.kernel_size[0] * conv.kernel_size[1]
    return flat.gather(1, index.expand(B, -1)).view(B, index.numel() // p, p)
