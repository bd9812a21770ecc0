"""DP-SGD (Abadi et al. 2016), its special cases DP-GD and RRPSGD, and its two options beyond
independent noise at a fixed clip: banded matrix factorisation and quantile adaptive clipping.

Step t, on a batch B_t from the sampler:

    g̃_t = ( Σ_{i∈B_t} clip(∇f_i(θ_t), C) + N(0, (z·Δ)² I) ) / b,     θ_{t+1} = θ_t − η g̃_t

with b the sampler's public expected batch size and Δ the clipped sum's sensitivity (C under
add/remove-one, 2C under replace-one). Privacy event per step: ``sampler.wrap(Gaussian(z))``.

* DP-GD: ``sampling=FullBatch`` (replace-one, no amplification).
* RRPSGD (Zhang et al. 2017, "random round private SGD"): DP-SGD whose output is θ^R for R
  uniform on {0, …, T−1}; R is drawn before training, so it costs no privacy, and all T
  steps are accounted (their noise was calibrated for T).
* ``bands`` = b > 1 (banded matrix factorisation, :mod:`~dpopt.algorithms.banded`): the noise is
  z·Δ·(C⁻¹Z)_t for a b-banded strategy C and the batches are cyclic Poisson (group t mod b at
  rate b·B/n); the run's event is ⌈T/b⌉ rounds of PoissonSampled(b·B/n, Gaussian(z)). b = 1 is
  DP-SGD exactly (the same draws, θ and ledger).
* ``clip_quantile`` = γ (adaptive clipping, :mod:`~dpopt.algorithms.quantile`): the clip C_t
  follows the γ-quantile of the gradient norms through a noised count; z is the pair's
  multiplier, the gradient noised at z_grad = (z⁻² − z_count⁻²)^(−1/2).
With z = 0 and C = ∞ this is plain minibatch SGD.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
from . import banded, quantile
from ._common import (
    OUTPUT_RULES,
    Output,
    batch_sampling,
    check_noise,
    noise_kind,
    output_init,
    output_track,
    output_value,
)

if TYPE_CHECKING:
    from .params import DPSGDParams, Params


class DPSGDState(NamedTuple):
    theta: Tensor
    out: Output
    release: Tensor  # the last step's noised clipped sum (zero before the first step)
    divisor: float   # its public divisor b: g̃_{t−1} = release / divisor
    release_std: float = 0.0  # the standard deviation per coordinate of the noise in ``release``
    banded: banded.Banded | None = None  # bands > 1: the group key and the noise ring
    clip: float | None = None  # clip_quantile: C_t, the clip of the next step (a released value)


@dataclass(frozen=True)
class DPSGD:
    """Keyword-only hyper-parameters: step size ``lr`` (η), clip norm ``clip`` (C; with
    ``clip_quantile``, the first step's), ``noise_multiplier`` (z), ``batch_size`` (b, expected size
    under Poisson), ``sampling`` (:class:`~dpopt.sampling.Poisson`, :class:`~dpopt.sampling.FixedSize`
    or :class:`~dpopt.sampling.FullBatch`, the class), ``output_rule`` ("last" or "uniform"),
    ``noise`` (the kind of noise, :data:`dpopt.mechanisms.Noise`), ``bands`` (b ≥ 1: banded matrix
    factorisation with cyclic Poisson batches for b > 1; continuous noise, ``sampling=Poisson``) and
    adaptive clipping: ``clip_quantile`` (γ in (0, 1), None: off), ``clip_lr`` (η_C) and
    ``count_noise`` (σ_b, the count's noise std; None: ``batch_size``/20). See the module docstring."""

    lr: float
    clip: float
    noise_multiplier: float
    batch_size: int = 1
    sampling: sampling.BatchSampling = sampling.Poisson
    output_rule: str = "last"
    noise: mechanisms.Noise = mechanisms.CONTINUOUS
    bands: int = 1
    clip_quantile: float | None = None
    clip_lr: float = 0.2
    count_noise: float | None = None

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.positive_int("batch_size", self.batch_size)
        sampling.check("sampling", self.sampling)
        _validate.one_of("output_rule", self.output_rule, OUTPUT_RULES)
        check_noise(self.noise, self.sampling)
        _validate.positive_int("bands", self.bands)
        if self.bands > 1:
            self._check_banded()
        if self.clip_quantile is not None:
            self._check_adaptive(self.clip_quantile)

    def _check_banded(self) -> None:
        why = None
        if self.sampling is not sampling.Poisson:
            why = f"sampling={self.sampling!r}: its batches are cyclic Poisson (sampling=Poisson)"
        elif self.noise is not mechanisms.CONTINUOUS:
            why = f"noise={self.noise!r}: it correlates continuous Gaussian noise (noise=CONTINUOUS)"
        elif self.clip_quantile is not None:
            why = (f"clip_quantile={self.clip_quantile!r}: correlated noise needs the same sensitivity at every step, "
                   "and adaptive clipping changes it")
        if why is not None:
            raise _validate.DpoptError(f"bands={self.bands} (banded matrix factorisation) is refused with {why}")

    def _check_adaptive(self, clip_quantile: float) -> None:
        _validate.open_unit("clip_quantile", clip_quantile)
        _validate.positive("clip_lr", self.clip_lr)
        _validate.positive("count_noise", self.count_std)
        if not math.isfinite(self.clip):
            raise _validate.DpoptError(f"clip={self.clip!r} must be finite with clip_quantile: it is the first step's "
                                       "clip, which adaptive clipping scales from")
        if self.sampling is sampling.FullBatch:
            raise _validate.DpoptError(f"sampling={self.sampling!r} is refused with clip_quantile="
                                       f"{self.clip_quantile!r}: the count and the gradient sum are accounted as one "
                                       "Gaussian on the step's sampled batch (sampling=Poisson or FixedSize)")
        quantile.check(self.noise_multiplier, self.count_std, self.sampling.relation)

    @property
    def count_std(self) -> float:
        """σ_b: ``count_noise``, or the expected batch size / 20."""
        return self.batch_size / quantile.COUNT_NOISE_DIVISOR if self.count_noise is None else self.count_noise

    def relation(self) -> dpa.NeighboringRelation:
        return self.sampling.relation

    def sampler(self, t: int, n: int) -> Sampler:
        """Step t's sampler for planning; with bands > 1 it cannot draw (:meth:`batch_sampler` can)."""
        return banded.sampler(self.sampling, n, self.batch_size, self.bands, t)

    def batch_sampler(self, state: DPSGDState, t: int, n: int) -> Sampler:
        """Step t's sampler: with bands > 1, cyclic Poisson over the groups of the state's key."""
        return banded.sampler(self.sampling, n, self.batch_size, self.bands, t, state.banded)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSGDState:
        out = output_init(self.output_rule, theta0, steps, gen)
        ring = banded.start(theta0, self.bands, steps, gen) if self.bands > 1 else None
        clip = self.clip if self.clip_quantile is not None else None
        return DPSGDState(theta0.clone(), out, torch.zeros_like(theta0), 1.0, 0.0, ring, clip)

    def step(self, state: DPSGDState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSGDState, dpa.DpEvent]:
        rows = oracle.per_record(state.theta, batch.indices)
        relation = batch.sampler.relation
        clip = self.clip if state.clip is None else state.clip
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, clip)], relation)
        b = batch.sampler.expected_size  # a public constant: θ − η·(release / b) in one operation
        ring, next_clip = state.banded, state.clip
        if ring is not None:
            noised, ring, event = banded.release(clipped, self.noise_multiplier, ring, source, batch.t)
            std = _std(self.noise_multiplier, clipped) * banded.noise_scale(ring, batch.t)
        elif next_clip is not None:
            assert self.clip_quantile is not None  # (the state carries a clip only with it)
            z_grad = quantile.gradient_multiplier(self.noise_multiplier, self.count_std, relation)
            noised, gradient_event = mechanisms.gaussian(clipped, z_grad, source, self.noise)
            count = clipping.count_within(rows, clip, relation)
            z_count = quantile.count_multiplier(self.count_std, relation)
            noised_count, count_event = mechanisms.gaussian(count, z_count, source, self.noise)
            next_clip = quantile.next_clip(clip, float(noised_count), b, self.clip_quantile, self.clip_lr)
            event, std = dpa.ComposedDpEvent([gradient_event, count_event]), _std(z_grad, clipped)
        else:
            noised, event = mechanisms.gaussian(clipped, self.noise_multiplier, source, self.noise)
            std = _std(self.noise_multiplier, clipped)
        out = output_track(state.out, batch.t, state.theta)
        return (DPSGDState(state.theta.add(noised, alpha=-self.lr / b), out, noised, b, std, ring, next_clip),
                batch.sampler.wrap(event))

    def direction(self, state: DPSGDState) -> Tensor:
        """g̃_t = (noised clipped sum)/b of the last step (divided here, when asked: the step
        itself folds 1/b into its update)."""
        return state.release / state.divisor

    def release_variance(self, state: DPSGDState) -> float:
        """Φ_t = (noise std of the last release / b)² per coordinate of g̃_t: (z·Δ/b)²; with bands, z·Δ
        times the std of (C⁻¹Z)_t (row t of C⁻¹); with adaptive clipping, z_grad·Δ_t (the clip of that
        release). For the discrete Gaussian, (z·Δ/b)² approximates its variance. Public: the
        hyper-parameters, the step and released values."""
        return (state.release_std / state.divisor) ** 2

    def moved(self, state: DPSGDState, theta: Tensor) -> DPSGDState:
        """θ_{t+1} := ``theta`` (the output rule tracks it from the next step on)."""
        return state._replace(theta=theta)

    def output(self, state: DPSGDState) -> Tensor:
        return output_value(state.out, state.theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        """Written from the hyper-parameters: ⌈T/b⌉ rounds of the banded event for bands > 1, else T
        times ``wrap(Gaussian(z))``, or with ``clip_quantile`` T times ``wrap(Composed([Gaussian(z_grad),
        Gaussian(z_count)]))``."""
        if self.bands > 1:
            return banded.planned_event(self.noise_multiplier, n, self.batch_size, self.bands, steps)
        sampler = self.sampler(0, n)
        release = (self.noise.event(self.noise_multiplier) if self.clip_quantile is None
                   else quantile.step_event(self.noise_multiplier, self.count_std, sampler.relation))
        return dpa.SelfComposedDpEvent(sampler.wrap(release), steps)


def _std(noise_multiplier: float, clipped: mechanisms.Bounded) -> float:
    """z·Δ, the noise std of a release (0 without noise, also for an unbounded Δ)."""
    return noise_multiplier * clipped.sensitivity if noise_multiplier > 0 else 0.0


def dp_gd(*, lr: float, clip: float, noise_multiplier: float, output_rule: str = "last",
          noise: mechanisms.Noise = mechanisms.CONTINUOUS) -> DPSGD:
    """DP-GD: DP-SGD on the full batch every step (replace-one adjacency)."""
    return DPSGD(lr=lr, clip=clip, noise_multiplier=noise_multiplier, sampling=sampling.FullBatch,
                 output_rule=output_rule, noise=noise)


def rrpsgd(*, lr: float, clip: float, noise_multiplier: float, batch_size: int,
           sampling: sampling.BatchSampling = sampling.Poisson,
           noise: mechanisms.Noise = mechanisms.CONTINUOUS) -> DPSGD:
    """RRPSGD (Zhang, Zheng, Mou, Wang 2017, "random round private SGD"): DP-SGD whose output is
    the iterate of a uniformly random round R. R is drawn up front, independently of the data, so
    the output rule costs no privacy; the noise is calibrated, and the ledger charged, for all T
    rounds (the most R can be)."""
    return DPSGD(lr=lr, clip=clip, noise_multiplier=noise_multiplier, batch_size=batch_size, sampling=sampling,
                 output_rule="uniform", noise=noise)


#: ``dp-bandmf``'s bands when its parameters leave them unset.
BANDMF_BANDS = 4


def _from_params(params: DPSGDParams, bands: int) -> DPSGD:
    """DP-SGD of its parameters: ``lr``, ``clip``, ``batch_size``, ``sampling``, ``noise``, ``bands`` (``bands``
    when they leave it unset), ``clip_quantile``, ``clip_lr``, ``count_noise``."""
    return DPSGD(lr=params.lr, clip=params.clip, noise_multiplier=1.0, batch_size=params.batch_size,
                 sampling=batch_sampling(params), noise=noise_kind(params),
                 bands=bands if params.bands is None else params.bands, clip_quantile=params.clip_quantile,
                 clip_lr=params.clip_lr, count_noise=params.count_noise)


def dp_sgd_from_params(params: DPSGDParams) -> DPSGD:
    """``dp-sgd`` by name (bands 1 unless set)."""
    return _from_params(params, 1)


def bandmf_from_params(params: DPSGDParams) -> DPSGD:
    """``dp-bandmf`` by name: ``dp-sgd`` with ``bands`` (default :data:`BANDMF_BANDS`)."""
    return _from_params(params, BANDMF_BANDS)


def dp_gd_from_params(params: Params) -> DPSGD:
    """``dp-gd`` by name: ``lr``, ``clip``, ``noise``."""
    return dp_gd(lr=params.lr, clip=params.clip, noise_multiplier=1.0, noise=noise_kind(params))


def rrpsgd_from_params(params: DPSGDParams) -> DPSGD:
    """``rrpsgd`` by name: ``dp-sgd``'s parameters, the output at a random round."""
    return dataclasses.replace(dp_sgd_from_params(params), output_rule="uniform")
