"""Mechanisms: a bounded value in, a noised value and its privacy event out.

A :class:`Bounded` is a value whose L2 sensitivity is known under the ledger's neighbouring
relation. Only :mod:`dpopt.clipping` makes one, so a mechanism can never be handed a value
whose sensitivity was merely asserted. Every mechanism returns the released value together with
the ``DpEvent`` of exactly that release (:func:`gaussian`, :func:`noisy_argmin`,
:meth:`TreeAggregator.add`); the caller hands the event to the sampler (``sampler.wrap``) and
the ledger, and never builds an event for the ledger itself. Where the randomness comes from is
a :class:`NoiseSource` object (:class:`SeededNoise`, :class:`SystemNoise`); what kind of noise a
release adds is a :data:`Noise` object (:class:`Continuous` or :class:`Discrete`).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import InitVar, dataclass, field, replace
from fractions import Fraction

import dp_accounting as dpa
import numpy as np
import torch
from torch import Tensor

from .base import NoiseSource

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


def _gumbel(uniform: Tensor, scale: float) -> Tensor:
    return -torch.log(-torch.log(uniform)).mul_(scale)


@dataclass
class SeededNoise:
    """Every draw from one ``torch.Generator`` seeded with ``seed`` (reproducible: a run with the
    same seed adds the same noise, so its guarantee rests on the seed staying secret), made on
    the device of the tensor it is shaped like (:meth:`on`). A seed from the operating system
    (:meth:`from_os`) is the default of every run."""

    seed: int
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def from_os(cls) -> SeededNoise:
        """Seeded with 63 bits from ``os.urandom``."""
        return cls(int.from_bytes(os.urandom(8), "little") >> 1)

    def on(self, device: torch.device) -> torch.Generator:
        """The generator of a draw on ``device``: ``generator`` on the CPU; elsewhere a generator of
        that device seeded with 63 bits drawn from ``generator`` (so the run's one saved state, the
        CPU generator's, still determines every draw, a resumed run continues exactly, and no two
        draws share a seed but with probability ~2⁻⁶³ per pair)."""
        if device.type == "cpu":
            return self.generator
        seed = int(torch.randint(2**63 - 1, (), generator=self.generator))
        return torch.Generator(device=device).manual_seed(seed)

    def gaussian(self, like: Tensor, std: float) -> Tensor:
        # the CPU case without the device look-up of :meth:`on`: every release's hot path
        gen = self.generator if like.is_cpu else self.on(like.device)
        draws = torch.randn(like.shape, generator=gen, dtype=like.dtype, device=like.device)
        return draws if std == 1.0 else draws.mul_(std)

    def gumbel(self, like: Tensor, scale: float) -> Tensor:
        draws = torch.rand(like.shape, generator=self.on(like.device), dtype=like.dtype, device=like.device)
        return _gumbel(draws.clamp_(min=torch.finfo(like.dtype).tiny), scale)


@dataclass
class SystemNoise:
    """Release noise from the operating system's CSPRNG (``os.urandom``): unpredictable from any
    seed, not reproducible. The other draws of the run come from ``generator``, seeded from the
    OS too."""

    generator: torch.Generator = field(default_factory=lambda: SeededNoise.from_os().generator, repr=False)

    def gaussian(self, like: Tensor, std: float) -> Tensor:
        draws = torch.from_numpy(secure_normals(like.numel())).reshape(like.shape)
        return draws.mul_(std).to(dtype=like.dtype, device=like.device)

    def gumbel(self, like: Tensor, scale: float) -> Tensor:
        draws = torch.from_numpy(secure_uniforms(like.numel())).reshape(like.shape)
        return _gumbel(draws, scale).to(dtype=like.dtype, device=like.device)


@dataclass(frozen=True)
class Continuous:
    """Continuous Gaussian noise: the release of multiplier z is ``GaussianDpEvent(z)`` and can
    be amplified by sampling."""

    amplifiable = True

    def event(self, noise_multiplier: float) -> dpa.DpEvent:
        return dpa.GaussianDpEvent(noise_multiplier)

    def add(self, x: Bounded, noise_multiplier: float, source: NoiseSource) -> Tensor:
        # x + std·N(0, I) in one fused operation (this is every Gaussian release's hot path)
        return x.value.add(source.gaussian(x.value, 1.0), alpha=noise_multiplier * x.sensitivity)


@dataclass(frozen=True)
class Discrete:
    """The exact discrete Gaussian on an integer grid (Canonne–Kamath–Steinke 2020), from the OS
    CSPRNG, immune to floating-point attacks on the noise. The d-dimensional discrete Gaussian
    N_Z(0, σ²)^d added to an integer vector of L2 sensitivity Δ is Δ²/(2σ²)-zCDP (CKS 2020,
    Theorem 14), and :meth:`add` uses σ = z·Δ with Δ the sensitivity on the grid: the release is
    ``ZCDpEvent(1/(2z²))``. dp_accounting composes it with RDP and has no amplification-by-
    sampling bound for it, so it is only for unsampled releases."""

    amplifiable = False

    def event(self, noise_multiplier: float) -> dpa.DpEvent:
        return dpa.ZCDpEvent(1 / (2 * noise_multiplier**2)) if noise_multiplier > 0 else dpa.GaussianDpEvent(0.0)

    def add(self, x: Bounded, noise_multiplier: float, source: NoiseSource) -> Tensor:
        return _discrete(x, noise_multiplier)


Noise = Continuous | Discrete
CONTINUOUS, DISCRETE = Continuous(), Discrete()


def gaussian(x: Bounded, noise_multiplier: float, source: NoiseSource,
             noise: Noise = CONTINUOUS) -> tuple[Tensor, dpa.DpEvent]:
    """The Gaussian mechanism: ``x.value + N(0, (z·Δ)² I)`` with Δ = ``x.sensitivity``, and the
    event of exactly this release (``noise.event(z)``: ``GaussianDpEvent(z)`` for continuous
    noise), z = noise std / L2 sensitivity. With z = 0 the value is released exactly and the
    event is non-private (the ledger's ε becomes ∞)."""
    event = noise.event(noise_multiplier)
    if noise_multiplier == 0:
        return x.value, event
    check_finite(x, noise_multiplier)
    return noise.add(x, noise_multiplier, source), event


def check_finite(x: Bounded, noise_multiplier: float) -> None:
    """Noise of multiplier z > 0 needs a finite sensitivity to be scaled to."""
    if not math.isfinite(x.sensitivity):
        raise ValueError(
            f"noise_multiplier={noise_multiplier} needs a finite clip norm: the clipped value has "
            "unbounded sensitivity (clip=inf is allowed only with noise_multiplier=0)"
        )


def noisy_argmin(scores: Bounded, rho: float, source: NoiseSource) -> tuple[int, dpa.DpEvent]:
    """Report-noisy-min as the exponential mechanism P(k) ∝ exp(−u_k/b), run as Gumbel-max, and
    its event ``ZCDpEvent(ρ)``.

    ``scores`` holds the candidates' scores u_k; its sensitivity Δ bounds how far one record
    moves every score. With b = Δ/√(2ρ) the mechanism is ε-bounded-range for ε = 2Δ/b = √(8ρ),
    hence ε²/8 = ρ-zCDP (Cesar & Rogers, ALT 2021), for any neighbouring relation. ρ = ∞ is the
    exact argmin (non-private)."""
    if math.isinf(rho):
        return int(torch.argmin(scores.value)), dpa.NonPrivateDpEvent()
    scale = scores.sensitivity / math.sqrt(2 * rho)
    return int(torch.argmax(-scores.value + source.gumbel(scores.value, scale))), dpa.ZCDpEvent(rho)


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
    ``SingleEpochTreeAggregationDpEvent``). Its ε is that of the deepest tree: trees on disjoint
    records compose in parallel (see :func:`dpopt.accounting.in_accountant_terms`)."""
    return dpa.SingleEpochTreeAggregationDpEvent(noise_multiplier, list(step_counts))


@dataclass(frozen=True)
class TreeAggregator:
    """The binary-tree mechanism (Dwork et al. 2010, Chan et al. 2011) over one pass of disjoint
    records: noisy prefix sums ``Σ_{j≤t} x_j + TREE(t)`` of a stream of bounded increments, the
    stream cut into trees of ``lengths`` increments (one tree per period, restarted from zero).

    Node (ℓ, j) of a tree covers its increments [j·2^ℓ, (j+1)·2^ℓ) and carries noise
    N(0, (z·Δ)² I), Δ = ``sensitivity``; the prefix of length t is covered by the nodes of the set
    bits of t (ℓ set in t ↦ node (ℓ, ⌊t/2^ℓ⌋ − 1)), so TREE(t) has variance (popcount t)·(zΔ)²
    per coordinate. A record in one increment enters ⌈log₂(L + 1)⌉ nodes of its tree.

    Privacy event: the noise of every node of every tree is fixed by z up front (Algorithm 1 of
    the single-pass oracle), so the first :meth:`add` returns the event of the whole pass,
    :func:`tree_event` (z, ``lengths``), and every later one ``NoOpDpEvent`` (nothing more is
    spent) — provided z, the sensitivity and the lengths are those of that event: a later
    :meth:`add` with other ones is refused. Immutable: :meth:`add` returns the next aggregator. Only the
    ≤ ⌊log₂ t⌋ + 1 live nodes of the current prefix are held; a node's noise is drawn from the run's noise source
    when it first becomes live. With z = 0 the prefix sums are exact.
    """

    lengths: tuple[int, ...]
    noise_multiplier: float
    sensitivity: float
    tree: int = 0      # index of the current tree
    count: int = 0     # increments added to the current tree
    total: Tensor | None = None
    live: tuple[tuple[int, int, Tensor], ...] = ()   # (level ℓ, index j, noise) per set bit of count
    committed: tuple[float, float, tuple[int, ...]] | None = None  # (z, Δ, lengths) of the recorded event

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths={self.lengths} must be a non-empty sequence of integers >= 1")
        if self.noise_multiplier > 0 and not math.isfinite(self.sensitivity):
            raise ValueError(f"noise_multiplier={self.noise_multiplier} needs a finite sensitivity, "
                             f"got {self.sensitivity}")

    def add(self, x: Bounded, source: NoiseSource) -> tuple[TreeAggregator, Tensor, dpa.DpEvent]:
        """Append the increment ``x``: the next aggregator, the noised prefix sum of the current
        tree, and the event of this release."""
        tree, count, total, live = self.tree, self.count, self.total, self.live
        if count == self.lengths[tree]:  # the current tree is full: the next one starts from zero
            tree, count, total, live = tree + 1, 0, None, ()
        if tree >= len(self.lengths):
            raise ValueError(f"the trees hold lengths={self.lengths} increments; they are full")
        if x.sensitivity > self.sensitivity:
            raise ValueError(f"an increment of sensitivity {x.sensitivity} exceeds the tree's {self.sensitivity}")
        settings = (self.noise_multiplier, self.sensitivity, self.lengths)
        if self.committed is not None and self.committed != settings:
            raise ValueError(f"the trees' event was recorded for (z, sensitivity, lengths)={self.committed}; "
                             f"an increment cannot be released with {settings}")
        event = tree_event(self.noise_multiplier, list(self.lengths)) if self.committed is None else dpa.NoOpDpEvent()
        count += 1
        total = x.value.clone() if total is None else total + x.value
        if self.noise_multiplier == 0:
            return replace(self, tree=tree, count=count, total=total, committed=settings), total, event
        kept = {(level, index): noise for level, index, noise in live}
        std = self.noise_multiplier * self.sensitivity
        nodes = []
        for level in range(count.bit_length()):
            if count >> level & 1:
                index = (count >> level) - 1
                noise = kept.get((level, index))
                nodes.append((level, index, source.gaussian(total, std) if noise is None else noise))
        noised = total + sum(noise for _, _, noise in nodes)
        return (replace(self, tree=tree, count=count, total=total, live=tuple(nodes), committed=settings), noised,
                event)


def source_named(name: str) -> NoiseSource | None:
    """The noise source a run's noise named ``name`` comes from: the OS CSPRNG for "secure"; None
    (the run's seeded generator) for "torch" and "discrete" (the discrete Gaussian draws from the OS
    CSPRNG itself)."""
    return SystemNoise() if name == "secure" else None
