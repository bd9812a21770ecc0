"""Mechanisms: a bounded value in, a noised value and its privacy event out.

A :class:`Bounded` is a value whose L2 sensitivity is known under the ledger's neighbouring
relation. Only :mod:`dpopt.clipping` makes one, so a mechanism can never be handed a value
whose sensitivity was merely asserted. Every mechanism returns ``(noised value, DpEvent)``;
the caller hands the event to the sampler (``sampler.wrap``) and the ledger.
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass

import dp_accounting as dpa
import torch
from torch import Tensor

_CLIPPING_TOKEN = object()


@dataclass(frozen=True)
class Bounded:
    """A clipped **sum** with known L2 sensitivity (made only by :mod:`dpopt.clipping`).

    ``value`` is a sum, not a mean: dividing by a batch size happens after noise, and only by
    a public constant.
    """

    value: Tensor
    sensitivity: float
    token: InitVar[object] = None

    def __post_init__(self, token: object) -> None:
        # an InitVar is not copied by dataclasses.replace, so a sensitivity cannot be re-stated
        if token is not _CLIPPING_TOKEN:
            raise TypeError("Bounded values are made only by dpopt.clipping")
        if not self.sensitivity >= 0:
            raise ValueError(f"sensitivity={self.sensitivity} must be >= 0")


def gaussian(x: Bounded, noise_multiplier: float, gen: torch.Generator) -> tuple[Tensor, dpa.DpEvent]:
    """The Gaussian mechanism: ``x.value + N(0, (z·Δ)² I)`` with Δ = ``x.sensitivity``.

    Privacy event: ``GaussianDpEvent(z)``; z = noise std / L2 sensitivity. With z = 0 the value
    is released exactly and the event is non-private (the ledger's ε becomes ∞).
    Noise comes from ``gen`` only, never from the global RNG.
    """
    event = dpa.GaussianDpEvent(noise_multiplier)
    if noise_multiplier == 0:
        return x.value, event
    if not math.isfinite(x.sensitivity):
        raise ValueError(
            f"noise_multiplier={noise_multiplier} needs a finite clip norm: the clipped value has "
            "unbounded sensitivity (clip=inf is allowed only with noise_multiplier=0)"
        )
    std = noise_multiplier * x.sensitivity
    noise = torch.randn(x.value.shape, generator=gen, dtype=x.value.dtype, device=x.value.device)
    return x.value.add(noise, alpha=std), event
