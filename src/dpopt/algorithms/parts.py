"""DP-SGD's parts: a batch selection, a clipping rule and a noise, composed by
:class:`~dpopt.algorithms.dp_sgd.ComposedSGD` (and picked by :class:`~dpopt.algorithms.dp_sgd.DPSGD`).

Step t of the composition, on the batch B_t of the **selection**:

    C_t = the clipping rule's clip,   s_t = Σ_{i∈B_t} clip(∇f_i(θ_t), C_t)   (sensitivity Δ_t = f·C_t)
    r_t = s_t + the **noise** at the rule's gradient multiplier z_g (independent N(0, (z_g·Δ_t)² I), or
          banded correlated noise), then the rule's own releases (adaptive clipping's noised count)
    θ_{t+1} = θ_t − η·r_t / b

Privacy event of the step: ``sampler.wrap(rule(noise.event(z_g)))``: the noise's Gaussian event,
composed by the clipping rule with the events of its own releases, amplified by the selection's
sampler. The run's planned event is the same release event composed over the selection's rounds
(T for independent batches, ⌈T/b⌉ for cyclic Poisson over b groups).

Each part is a small frozen dataclass; ``check(parts, noise_multiplier)`` refuses what it cannot be
combined with (one line naming the setting and why). A new variant of DP-SGD is a new part of one
of the three protocols below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import dp_accounting as dpa
import torch
from dp_accounting import NeighboringRelation

from .. import _validate, clipping, mechanisms, sampling
from ..base import NoiseSource, PerRecord, Sampler
from ..correlation.events import banded_rounds
from ..correlation.noise import BandedNoise
from ..mechanisms import Bounded
from . import banded, quantile
from ._common import check_noise


class Selection(Protocol):
    """Which records a step sees: its sampler (``key``: the secret drawn by :meth:`start`, None when
    planning), the batch sampling it is (for the other parts' checks) and how many of the T steps
    a record can take part in (``rounds``)."""

    @property
    def relation(self) -> NeighboringRelation: ...

    @property
    def sampling(self) -> sampling.BatchSampling: ...

    @property
    def setting(self) -> str: ...

    def check(self, parts: Parts, noise_multiplier: float) -> None: ...

    def start(self, gen: torch.Generator) -> int | None: ...

    def sampler(self, n: int, t: int, key: int | None = None) -> Sampler: ...

    def rounds(self, steps: int) -> int: ...


class ClippingRule(Protocol):
    """The clip C_t of each step (its state: ``start``, ``current``), the multiplier of the gradient's
    noise when the step's multiplier z is shared with releases of its own (``multiplier``), those
    releases and the next state (``after``), and their planned event (``release_event``). ``changes``
    names what moves the sensitivity from step to step (None: the same Δ at every step and no
    release besides the sum)."""

    @property
    def changes(self) -> str | None: ...

    @property
    def setting(self) -> str: ...

    def check(self, parts: Parts, noise_multiplier: float) -> None: ...

    def start(self) -> float | None: ...

    def current(self, clip: float | None) -> float: ...

    def multiplier(self, noise_multiplier: float, relation: NeighboringRelation) -> float: ...

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]: ...

    def release_event(self, gradient_event: dpa.DpEvent, noise: NoisePart, noise_multiplier: float,
                      relation: NeighboringRelation) -> dpa.DpEvent: ...


class NoisePart(Protocol):
    """How the clipped sum is noised: its kind (:data:`dpopt.mechanisms.Noise`), its state (the banded
    ring; None for independent noise), the release and the std of its noise per unit of z·Δ."""

    @property
    def kind(self) -> mechanisms.Noise: ...

    def check(self, parts: Parts, noise_multiplier: float) -> None: ...

    def start(self, like: torch.Tensor, steps: int) -> BandedNoise | None: ...

    def release(self, x: Bounded, noise_multiplier: float, ring: banded.Banded | None, source: NoiseSource,
                t: int) -> tuple[torch.Tensor, banded.Banded | None, dpa.DpEvent, float]: ...


@dataclass(frozen=True)
class Parts:
    """A DP-SGD of a ``selection``, a ``clipping`` rule and a ``noise``."""

    selection: Selection
    clipping: ClippingRule
    noise: NoisePart

    def check(self, noise_multiplier: float) -> None:
        """Each part's refusals of the others, the noise's first (then the rule's, the selection's)."""
        for part in (self.noise, self.clipping, self.selection):
            part.check(self, noise_multiplier)

    def planned_event(self, noise_multiplier: float, n: int, steps: int) -> dpa.DpEvent:
        """``SelfComposed(sampler.wrap(rule(noise.event(z_g))), rounds(T))``, from the hyper-parameters."""
        sampler = self.selection.sampler(n, 0)
        z_g = self.clipping.multiplier(noise_multiplier, sampler.relation)
        release = self.clipping.release_event(self.noise.kind.event(z_g), self.noise, noise_multiplier,
                                              sampler.relation)
        return dpa.SelfComposedDpEvent(sampler.wrap(release), self.selection.rounds(steps))


# ---------------------------------------------------------------------------------- selections


@dataclass(frozen=True)
class Sampled:
    """Independent batches every step, ``sampling.of(n, batch_size)`` (Poisson, fixed size or full)."""

    sampling: sampling.BatchSampling
    batch_size: int

    @property
    def relation(self) -> NeighboringRelation:
        return self.sampling.relation

    @property
    def setting(self) -> str:
        return f"sampling={self.sampling!r}"

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        sampling.check("sampling", self.sampling)
        _validate.positive_int("batch_size", self.batch_size)

    def start(self, gen: torch.Generator) -> int | None:
        return None

    def sampler(self, n: int, t: int, key: int | None = None) -> Sampler:
        return self.sampling.of(n, self.batch_size)

    def rounds(self, steps: int) -> int:
        return steps


@dataclass(frozen=True)
class CyclicGroups:
    """Cyclic Poisson (:class:`~dpopt.sampling.CyclicPoisson`): the records in ``bands`` groups of a
    secret key, group t mod b Poisson-sampled at step t at rate b·B/n; a record takes part in at most
    ⌈T/b⌉ steps. Its key is kept with the banded noise's ring (:class:`Correlated`)."""

    bands: int
    batch_size: int

    relation = sampling.CyclicPoisson.relation
    sampling = sampling.Poisson

    @property
    def setting(self) -> str:
        return f"bands={self.bands} (cyclic Poisson groups)"

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        _validate.positive_int("bands", self.bands)
        _validate.positive_int("batch_size", self.batch_size)
        if not isinstance(parts.noise, Correlated):
            raise _validate.DpoptError(f"{self.setting} is refused with noise={parts.noise!r}: the group key is kept "
                                       "with the correlated noise's ring (noise=Correlated)")

    def start(self, gen: torch.Generator) -> int | None:
        return sampling.CyclicPoisson.secret_key(gen)

    def sampler(self, n: int, t: int, key: int | None = None) -> Sampler:
        return sampling.CyclicPoisson(n, self.batch_size, self.bands, t, key)

    def rounds(self, steps: int) -> int:
        return banded_rounds(steps, self.bands)


# ---------------------------------------------------------------------------------- clipping rules


@dataclass(frozen=True)
class FixedClip:
    """The same clip C at every step: Δ = f·C, the gradient noised at the step's z, nothing else released."""

    clip: float

    changes = None

    @property
    def setting(self) -> str:
        return f"clip={self.clip!r}"

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        _validate.positive("clip", self.clip, allow_inf=True)

    def start(self) -> float | None:
        return None

    def current(self, clip: float | None) -> float:
        return self.clip

    def multiplier(self, noise_multiplier: float, relation: NeighboringRelation) -> float:
        return noise_multiplier

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]:
        return None, gradient_event

    def release_event(self, gradient_event: dpa.DpEvent, noise: NoisePart, noise_multiplier: float,
                      relation: NeighboringRelation) -> dpa.DpEvent:
        return gradient_event


@dataclass(frozen=True)
class QuantileClip:
    """Quantile adaptive clipping (:mod:`~dpopt.algorithms.quantile`): C_0 = ``clip``, C_{t+1} from the
    noised count of records within C_t toward the ``quantile`` γ at rate ``lr``; the count noised at
    std ``count_noise`` (σ_b). The step's z is the pair's: the gradient is noised at z_grad =
    (z⁻² − z_count⁻²)^(−1/2); the release event is ``Composed([event(z_grad), event(z_count)])``."""

    clip: float
    quantile: float
    lr: float
    count_noise: float

    changes = "adaptive clipping"

    @property
    def setting(self) -> str:
        return f"clip_quantile={self.quantile!r}"

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        _validate.open_unit("clip_quantile", self.quantile)
        _validate.positive("clip_lr", self.lr)
        _validate.positive("count_noise", self.count_noise)
        if not math.isfinite(self.clip):
            raise _validate.DpoptError(f"clip={self.clip!r} must be finite with clip_quantile: it is the first step's "
                                       "clip, which adaptive clipping scales from")
        if parts.selection.sampling is sampling.FullBatch:
            raise _validate.DpoptError(f"{parts.selection.setting} is refused with {self.setting}: the count and the "
                                       "gradient sum are accounted as one Gaussian on the step's sampled batch "
                                       "(sampling=Poisson or FixedSize)")
        quantile.check(noise_multiplier, self.count_noise, parts.selection.relation)

    def start(self) -> float | None:
        return self.clip

    def current(self, clip: float | None) -> float:
        return self.clip if clip is None else clip

    def multiplier(self, noise_multiplier: float, relation: NeighboringRelation) -> float:
        return quantile.gradient_multiplier(noise_multiplier, self.count_noise, relation)

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]:
        """The count's release (after the gradient's: the noise draws keep that order) and C_{t+1}."""
        count = clipping.count_within(rows, clip, relation)
        z_count = quantile.count_multiplier(self.count_noise, relation)
        noised_count, count_event = mechanisms.gaussian(count, z_count, source, noise.kind)
        next_clip = quantile.next_clip(clip, float(noised_count), expected_size, self.quantile, self.lr)
        return next_clip, dpa.ComposedDpEvent([gradient_event, count_event])

    def release_event(self, gradient_event: dpa.DpEvent, noise: NoisePart, noise_multiplier: float,
                      relation: NeighboringRelation) -> dpa.DpEvent:
        z_count = quantile.count_multiplier(self.count_noise, relation)
        return dpa.ComposedDpEvent([gradient_event, noise.kind.event(z_count)])


# ---------------------------------------------------------------------------------- noises


@dataclass(frozen=True)
class Independent:
    """Independent Gaussian noise of ``kind`` (continuous, or the discrete Gaussian without sampling)
    at every release: ``mechanisms.gaussian``."""

    kind: mechanisms.Noise = mechanisms.CONTINUOUS

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        check_noise(self.kind, parts.selection.sampling)

    def start(self, like: torch.Tensor, steps: int) -> BandedNoise | None:
        return None

    def release(self, x: Bounded, noise_multiplier: float, ring: banded.Banded | None, source: NoiseSource,
                t: int) -> tuple[torch.Tensor, banded.Banded | None, dpa.DpEvent, float]:
        noised, event = mechanisms.gaussian(x, noise_multiplier, source, self.kind)
        return noised, ring, event, 1.0


@dataclass(frozen=True)
class Correlated:
    """Banded matrix factorisation noise (:mod:`~dpopt.algorithms.banded`): z·Δ·(C⁻¹Z)_t for the
    ``bands``-banded strategy optimised for the run's T, over :class:`CyclicGroups` of the same
    bands. Its argument needs one z and one Δ at every step and continuous noise."""

    bands: int
    kind: mechanisms.Noise = mechanisms.CONTINUOUS

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        _validate.positive_int("bands", self.bands)
        check_noise(self.kind, parts.selection.sampling)
        why = None
        selection, rule = parts.selection, parts.clipping
        if not (isinstance(selection, CyclicGroups) and selection.bands == self.bands):
            why = f"{selection.setting}: its batches are cyclic Poisson (sampling=Poisson)"
        elif self.kind is not mechanisms.CONTINUOUS:
            why = f"noise={self.kind!r}: it correlates continuous Gaussian noise (noise=CONTINUOUS)"
        elif rule.changes is not None:
            why = (f"{rule.setting}: correlated noise needs the same sensitivity at every step, "
                   f"and {rule.changes} changes it")
        if why is not None:
            raise _validate.DpoptError(f"bands={self.bands} (banded matrix factorisation) is refused with {why}")

    def start(self, like: torch.Tensor, steps: int) -> BandedNoise | None:
        return banded.ring(like, self.bands, steps)

    def release(self, x: Bounded, noise_multiplier: float, ring: banded.Banded | None, source: NoiseSource,
                t: int) -> tuple[torch.Tensor, banded.Banded | None, dpa.DpEvent, float]:
        assert ring is not None  # (started with the selection's key)
        noised, ring, event = banded.release(x, noise_multiplier, ring, source, t)
        return noised, ring, event, banded.noise_scale(ring, t)
