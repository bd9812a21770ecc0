"""Mechanisms: a bounded value in, a noised value and its privacy event out.

A :class:`Bounded` is a value whose L2 sensitivity is known under the ledger's neighbouring
relation. Only :mod:`dpopt.clipping` makes one, so a mechanism can never be handed a value
whose sensitivity was merely asserted. Every mechanism returns ``(noised value, DpEvent)``;
the caller hands the event to the sampler (``sampler.wrap``) and the ledger. The noise source
(seeded torch generator, OS CSPRNG, or exact discrete Gaussian) is one option, ``noise``,
whose event :func:`noise_event` gives; algorithms plan with the same function.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import InitVar, dataclass
from fractions import Fraction

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


#: Where Gaussian noise comes from (the ``noise`` option of every algorithm):
#: "torch": ``torch.randn`` from the run's seeded generator (reproducible; checkpoints resume bit for bit);
#: "secure": continuous Gaussian from the OS CSPRNG (``os.urandom``), unpredictable from any seed;
#: "discrete": exact discrete Gaussian on an integer grid (Canonne–Kamath–Steinke 2020) from the OS
#: CSPRNG, immune to floating-point attacks on the noise; accounted as zCDP.
NOISES = ("torch", "secure", "discrete")


def noise_event(noise_multiplier: float, noise: str = "torch") -> dpa.DpEvent:
    """The privacy event of one release of :func:`gaussian` with multiplier z.

    Continuous noise (torch, secure): ``GaussianDpEvent(z)``. Discrete: ``ZCDpEvent(1/(2z²))``:
    the d-dimensional discrete Gaussian N_Z(0, σ²)^d added to an integer vector of L2
    sensitivity Δ is Δ²/(2σ²)-zCDP (Canonne, Kamath, Steinke 2020, Theorem 14), and
    :func:`gaussian` uses σ = z·Δ with Δ the sensitivity on the grid. dp_accounting composes it
    with RDP (α·ρ at every order, the continuous Gaussian's curve); it has no
    amplification-by-sampling bound for it, so discrete noise is only for unsampled releases.
    """
    if noise == "discrete" and noise_multiplier > 0:
        return dpa.ZCDpEvent(1 / (2 * noise_multiplier**2))
    return dpa.GaussianDpEvent(noise_multiplier)


def gaussian(x: Bounded, noise_multiplier: float, gen: torch.Generator,
             noise: str = "torch") -> tuple[Tensor, dpa.DpEvent]:
    """The Gaussian mechanism: ``x.value + N(0, (z·Δ)² I)`` with Δ = ``x.sensitivity``.

    Privacy event: :func:`noise_event` (``GaussianDpEvent(z)`` for continuous noise); z = noise
    std / L2 sensitivity. With z = 0 the value is released exactly and the event is non-private
    (the ledger's ε becomes ∞). ``noise`` picks the source (:data:`NOISES`); "torch" draws from
    ``gen`` only, never from the global RNG; "secure" and "discrete" from the OS CSPRNG.
    """
    event = noise_event(noise_multiplier, noise)
    if noise_multiplier == 0:
        return x.value, event
    if not math.isfinite(x.sensitivity):
        raise ValueError(
            f"noise_multiplier={noise_multiplier} needs a finite clip norm: the clipped value has "
            "unbounded sensitivity (clip=inf is allowed only with noise_multiplier=0)"
        )
    if noise == "discrete":
        return _discrete(x, noise_multiplier), event
    std = noise_multiplier * x.sensitivity
    return x.value.add(_NORMALS[noise](x.value, gen), alpha=std), event


def _torch_normals(like: Tensor, gen: torch.Generator) -> Tensor:
    return torch.randn(like.shape, generator=gen, dtype=like.dtype, device=like.device)


def secure_uniforms(count: int) -> np.ndarray:
    """``count`` i.i.d. uniforms on the open interval (0, 1) from the OS CSPRNG:
    u = (k + ½)·2⁻⁵³ with k the top 53 bits of 8 ``os.urandom`` bytes (never 0 or 1)."""
    bits = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0**-53


def secure_normals(count: int) -> np.ndarray:
    """``count`` i.i.d. N(0, 1) draws from the OS CSPRNG by the Box–Muller transform: for
    independent uniforms u₁, u₂ on (0, 1) (so ln u₁ is finite), √(−2 ln u₁)·(cos 2πu₂, sin 2πu₂)
    are two independent standard normals."""
    pairs = (count + 1) // 2
    uniform = secure_uniforms(2 * pairs)
    radius, angle = np.sqrt(-2.0 * np.log(uniform[:pairs])), 2.0 * np.pi * uniform[pairs:]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]


def uniforms(like: Tensor, gen: torch.Generator, noise: str = "torch") -> Tensor:
    """Uniforms on (0, 1) shaped like ``like``, from the same source as ``noise``'s Gaussians
    (for mechanisms other than the Gaussian, e.g. DP-AGD's Gumbel noise): ``gen`` for "torch"
    (clamped away from 0), the OS CSPRNG otherwise."""
    if noise == "torch":
        draws = torch.rand(like.shape, generator=gen, dtype=like.dtype, device=like.device)
        return draws.clamp(min=torch.finfo(like.dtype).tiny)
    return torch.from_numpy(secure_uniforms(like.numel())).reshape(like.shape).to(dtype=like.dtype,
                                                                                  device=like.device)


def _secure_normals(like: Tensor, gen: torch.Generator) -> Tensor:
    draws = torch.from_numpy(secure_normals(like.numel()))
    return draws.reshape(like.shape).to(dtype=like.dtype, device=like.device)


_NORMALS = {"torch": _torch_normals, "secure": _secure_normals}


def grid_step(sensitivity: float, dim: int) -> float:
    """The grid width γ of :func:`gaussian`'s discrete noise: the power of two at most
    Δ/(1024·√d), so rounding to the grid adds at most 1/1024 to the sensitivity (below) and
    γ·k is exact in floating point."""
    return 2.0 ** math.floor(math.log2(sensitivity / (1024 * math.sqrt(max(dim, 1)))))


def _discrete(x: Bounded, noise_multiplier: float) -> Tensor:
    """``γ·(round(v/γ) + Y)``, Y ~ N_Z(0, σ²)^d with σ = z·(Δ/γ + √d).

    Rounding to the nearest grid point moves each coordinate by at most γ/2, so on the grid the
    rounded sums of neighbouring data sets are at most Δ/γ + √d apart in L2: that is the
    sensitivity the noise is scaled to. The released value is an exact grid point.
    """
    dim = x.value.numel()
    step = grid_step(x.sensitivity, dim)
    sigma = noise_multiplier * (x.sensitivity / step + math.sqrt(dim))
    rng = random.SystemRandom()
    draws = [discrete_gaussian(sigma, rng) for _ in range(dim)]
    grid = torch.round(x.value.double() / step) + torch.tensor(draws, dtype=torch.float64).reshape(x.value.shape)
    return (grid * step).to(x.value.dtype)


def _bernoulli(p: Fraction, rng: random.Random) -> bool:
    """True with probability p ∈ [0, 1], exactly."""
    return rng.randrange(p.denominator) < p.numerator


def _bernoulli_exp(gamma: Fraction, rng: random.Random) -> bool:
    """True with probability exp(−γ), γ ≥ 0, exactly (CKS Algorithm 1): for γ ≤ 1, the
    parity of the first K with Bernoulli(γ/K) false; for γ > 1, ⌊γ⌋ Bernoulli(e⁻¹) and one
    Bernoulli(e^{−(γ−⌊γ⌋)}) must all succeed."""
    while gamma > 1:
        if not _bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def _discrete_laplace(scale: int, rng: random.Random) -> int:
    """P(Y = y) ∝ exp(−|y|/t) on the integers, t = ``scale`` ≥ 1 (CKS Algorithm 2)."""
    while True:
        u = rng.randrange(scale)
        if not _bernoulli_exp(Fraction(u, scale), rng):
            continue
        v = 0
        while _bernoulli_exp(Fraction(1), rng):
            v += 1
        value = u + scale * v
        negative = rng.randrange(2) == 1
        if negative and value == 0:
            continue
        return -value if negative else value


def discrete_gaussian(sigma: float, rng: random.Random) -> int:
    """One exact draw of N_Z(0, σ²): P(Y = y) ∝ exp(−y²/(2σ²)) on the integers (CKS Algorithm 3).

    Propose Y from the discrete Laplace with t = ⌊σ⌋ + 1 and accept with probability
    exp(−(|Y| − σ²/t)²/(2σ²)); σ² is taken as the exact rational value of the float σ², and all
    arithmetic is on integers and fractions (no floating point).
    """
    if not sigma > 0:
        raise ValueError(f"sigma={sigma} must be > 0")
    variance = Fraction(sigma) ** 2
    t = math.floor(sigma) + 1
    while True:
        y = _discrete_laplace(t, rng)
        if _bernoulli_exp((abs(y) - variance / t) ** 2 / (2 * variance), rng):
            return y


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
