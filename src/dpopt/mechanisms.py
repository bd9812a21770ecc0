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
import numpy as np
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


def tree_event(noise_multiplier: float, step_counts: list[int]) -> dpa.DpEvent:
    """The event of binary-tree aggregation over one pass: one tree per entry of ``step_counts``,
    every record contributing to at most one increment of one tree (dp_accounting's
    ``SingleEpochTreeAggregationDpEvent``, RDP under replace-special adjacency). Its ε is that of
    the deepest tree: trees on disjoint records compose in parallel."""
    return dpa.SingleEpochTreeAggregationDpEvent(noise_multiplier, list(step_counts))


@dataclass(frozen=True)
class TreeAggregator:
    """The binary-tree mechanism (Algorithm 1; Dwork et al. 2010, Chan et al. 2011): noisy prefix
    sums ``Σ_{j≤t} x_j + TREE(t)`` of a stream of at most ``length`` bounded increments.

    Node (ℓ, j) covers increments [j·2^ℓ, (j+1)·2^ℓ) and carries noise N(0, (z·Δ)² I),
    Δ = ``sensitivity``; the prefix of length t is covered by the nodes of the set bits of t
    (ℓ set in t ↦ node (ℓ, ⌊t/2^ℓ⌋ − 1)), so TREE(t) has variance (popcount t)·(zΔ)² per
    coordinate. A record in one increment enters ⌈log₂(length + 1)⌉ nodes, which is what
    :func:`tree_event` (``SingleEpochTreeAggregationDpEvent(z, length)``) accounts.

    Immutable: :meth:`add` returns the next aggregator. Only the ≤ ⌊log₂ t⌋ + 1 live nodes of
    the current prefix are held; a node's noise is regenerated from (``seed``, ℓ, j) when it
    first becomes live. Make one with :meth:`start`, which draws ``seed`` from the run's noise
    generator. With z = 0 the prefix sums are exact.
    """

    length: int
    noise_multiplier: float
    sensitivity: float
    seed: int
    count: int = 0
    total: Tensor | None = None
    live: tuple[tuple[int, int, Tensor], ...] = ()   # (level ℓ, index j, noise) per set bit of count

    @classmethod
    def start(cls, length: int, noise_multiplier: float, sensitivity: float, gen: torch.Generator) -> TreeAggregator:
        if length < 1:
            raise ValueError(f"length={length} must be >= 1")
        if noise_multiplier > 0 and not math.isfinite(sensitivity):
            raise ValueError(f"noise_multiplier={noise_multiplier} needs a finite sensitivity, got {sensitivity}")
        seed = int(torch.randint(2**62, (1,), generator=gen))
        return cls(length, noise_multiplier, sensitivity, seed)

    @property
    def event(self) -> dpa.DpEvent:
        return tree_event(self.noise_multiplier, [self.length])

    def _node_noise(self, level: int, index: int, like: Tensor) -> Tensor:
        node_seed = np.random.SeedSequence([self.seed, level, index]).generate_state(1, dtype=np.uint64)[0]
        node_gen = torch.Generator().manual_seed(int(node_seed))
        noise = torch.randn(like.shape, generator=node_gen, dtype=like.dtype)
        return noise.mul_(self.noise_multiplier * self.sensitivity)

    def add(self, x: Bounded) -> tuple[TreeAggregator, Tensor]:
        """Append the increment ``x``; returns the next aggregator and the noised prefix sum."""
        if self.count >= self.length:
            raise ValueError(f"the tree holds length={self.length} increments; it is full")
        if x.sensitivity > self.sensitivity:
            raise ValueError(f"an increment of sensitivity {x.sensitivity} exceeds the tree's {self.sensitivity}")
        count = self.count + 1
        total = x.value.clone() if self.total is None else self.total + x.value
        if self.noise_multiplier == 0:
            return TreeAggregator(self.length, 0.0, self.sensitivity, self.seed, count, total), total
        kept = {(level, index): noise for level, index, noise in self.live}
        live = []
        for level in range(count.bit_length()):
            if count >> level & 1:
                index = (count >> level) - 1
                noise = kept.get((level, index))
                live.append((level, index, self._node_noise(level, index, total) if noise is None else noise))
        noised = total + sum(noise for _, _, noise in live)
        return TreeAggregator(self.length, self.noise_multiplier, self.sensitivity, self.seed, count, total,
                              tuple(live)), noised
