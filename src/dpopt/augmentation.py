"""Augmentation multiplicity: several public views of each record, one clipped gradient per record.

De et al. 2022 ("Unlocking high-accuracy differentially private image classification through
scale", §3.2): each record x_i is seen through K views v_1(x_i), …, v_K(x_i) (fixed public maps:
here the image and copies of it shifted by a few pixels), and its loss is the mean over them,

    ℓ_i(θ) = (1/K) Σ_k ℓ(f_θ(v_k(x_i)), y_i),   so   ∇ℓ_i = (1/K) Σ_k ∇ℓ(f_θ(v_k(x_i)), y_i),

the mean of the views' gradients. The engine clips that mean once per record, like any record's
gradient: a record adds at most C to the sum whatever K is, so the release and its privacy event
are DP-SGD's for n records (the views are not records; counting them as records would need K·C).
Averaging before clipping keeps the information of K augmented copies without dividing the
signal by K, as clipping each view and averaging would.

:func:`shift` makes the views of images (a map of each image alone: like the scattering transform,
it costs no privacy, and the features of each view can be computed once and cached);
:func:`mean_over_views` turns a per-record loss into the mean over the views axis of a model's
outputs ``[B, K, …]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


#: The image and its four copies shifted by one pixel (down, up, right, left), as (rows, columns).
ONE_PIXEL_SHIFTS: tuple[tuple[int, int], ...] = ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1))


def shift(images: Tensor, rows: int, columns: int) -> Tensor:
    """``images [B, H, W]`` moved by ``rows`` down and ``columns`` right, the pixels moved in zero
    (MNIST's background), those moved out dropped."""
    out = torch.zeros_like(images)
    H, W = images.shape[-2:]
    out[..., max(rows, 0):H + min(rows, 0), max(columns, 0):W + min(columns, 0)] = \
        images[..., max(-rows, 0):H + min(-rows, 0), max(-columns, 0):W + min(-columns, 0)]
    return out


def mean_over_views(loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """The per-record loss ``(1/K) Σ_k loss(out[:, k], y)`` of outputs ``out [B, K, …]`` (a model
    applied to K views of each record) and labels ``y [B]``; outputs without a views axis (the test
    images, ``[B, C]`` for a classifier of C classes: as many dimensions as ``y`` has plus one) are
    passed to ``loss`` as they are."""

    def averaged(out: Tensor, y: Tensor) -> Tensor:
        if out.ndim <= y.ndim + 1:
            return loss(out, y)
        B, K = out.shape[:2]
        return loss(out.reshape(B * K, *out.shape[2:]), y.repeat_interleave(K, dim=0)).view(B, K).mean(1)

    averaged.__doc__ = f"The mean over views of {getattr(loss, '__name__', 'the loss')}."
    averaged.__name__ = f"mean_over_views({getattr(loss, '__name__', 'loss')})"
    return averaged
