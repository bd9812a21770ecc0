"""DP-SGD (Abadi et al. 2016) and its special cases DP-GD and RRPSGD.

Step t, on a batch B_t from the sampler:

    g̃_t = ( Σ_{i∈B_t} clip(∇f_i(θ_t), C) + N(0, (z·Δ)² I) ) / b,     θ_{t+1} = θ_t − η g̃_t

with b the sampler's public expected batch size and Δ the clipped sum's sensitivity (C under
add/remove-one, 2C under replace-one). Privacy event per step: ``sampler.wrap(Gaussian(z))``.

* DP-GD: ``sampling=FullBatch`` (replace-one, no amplification).
* RRPSGD (Zhang et al. 2017, "random round private SGD"): DP-SGD whose output is θ^R for R
  uniform on {0, …, T−1}; R is drawn before training, so it costs no privacy, and all T
  steps are accounted (their noise was calibrated for T).
With z = 0 and C = ∞ this is plain minibatch SGD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
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
    from .registry import Knobs


class DPSGDState(NamedTuple):
    theta: Tensor
    out: Output
    release: Tensor  # the last step's noised clipped sum (zero before the first step)
    divisor: float   # its public divisor b: g̃_{t−1} = release / divisor


@dataclass(frozen=True)
class DPSGD:
    """Keyword-only hyper-parameters: step size ``lr`` (η), clip norm ``clip`` (C),
    ``noise_multiplier`` (z), ``batch_size`` (b, expected size under Poisson), ``sampling``
    (:class:`~dpopt.sampling.Poisson`, :class:`~dpopt.sampling.FixedSize` or
    :class:`~dpopt.sampling.FullBatch`, the class), ``output_rule`` ("last" or "uniform") and ``noise`` (the
    kind of noise, :data:`dpopt.mechanisms.Noise`)."""

    lr: float
    clip: float
    noise_multiplier: float
    batch_size: int = 1
    sampling: sampling.BatchSampling = sampling.Poisson
    output_rule: str = "last"
    noise: mechanisms.Noise = mechanisms.CONTINUOUS

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

    def relation(self) -> dpa.NeighboringRelation:
        return self.sampling.relation

    def sampler(self, t: int, n: int) -> Sampler:
        return self.sampling.of(n, self.batch_size)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSGDState:
        return DPSGDState(theta0.clone(), output_init(self.output_rule, theta0, steps, gen), torch.zeros_like(theta0),
                          1.0)

    def step(self, state: DPSGDState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSGDState, dpa.DpEvent]:
        rows = oracle.per_record(state.theta, batch.indices)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], batch.sampler.relation)
        noised, event = mechanisms.gaussian(clipped, self.noise_multiplier, source, self.noise)
        out = output_track(state.out, batch.t, state.theta)
        b = batch.sampler.expected_size  # a public constant: θ − η·(release / b) in one operation
        return (DPSGDState(state.theta.add(noised, alpha=-self.lr / b), out, noised, b),
                batch.sampler.wrap(event))

    def direction(self, state: DPSGDState) -> Tensor:
        """g̃_t = (noised clipped sum)/b of the last step (divided here, when asked: the step
        itself folds 1/b into its update)."""
        return state.release / state.divisor

    def moved(self, state: DPSGDState, theta: Tensor) -> DPSGDState:
        """θ_{t+1} := ``theta`` (the output rule tracks it from the next step on)."""
        return state._replace(theta=theta)

    def output(self, state: DPSGDState) -> Tensor:
        return output_value(state.out, state.theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        step = self.sampler(0, n).wrap(self.noise.event(self.noise_multiplier))
        return dpa.SelfComposedDpEvent(step, steps)


def dp_gd(*, lr: float, clip: float, noise_multiplier: float, output_rule: str = "last",
          noise: mechanisms.Noise = mechanisms.CONTINUOUS) -> DPSGD:
    """DP-GD: DP-SGD on the full batch every step (replace-one adjacency)."""
    return DPSGD(lr=lr, clip=clip, noise_multiplier=noise_multiplier, sampling=sampling.FullBatch, output_rule=output_rule,
                 noise=noise)


def rrpsgd(*, lr: float, clip: float, noise_multiplier: float, batch_size: int,
           sampling: sampling.BatchSampling = sampling.Poisson, noise: mechanisms.Noise = mechanisms.CONTINUOUS) -> DPSGD:
    """RRPSGD (Zhang, Zheng, Mou, Wang 2017, "random round private SGD"): DP-SGD whose output is
    the iterate of a uniformly random round R. R is drawn up front, independently of the data, so
    the output rule costs no privacy; the noise is calibrated, and the ledger charged, for all T
    rounds (the most R can be)."""
    return DPSGD(lr=lr, clip=clip, noise_multiplier=noise_multiplier, batch_size=batch_size, sampling=sampling,
                 output_rule="uniform", noise=noise)


def dp_sgd_from_knobs(knobs: Knobs) -> DPSGD:
    """``dp-sgd`` by name: ``lr``, ``clip``, ``batch_size``, ``sampling``, ``noise``."""
    return DPSGD(lr=knobs.lr, clip=knobs.clip, noise_multiplier=1.0, batch_size=knobs.batch_size,
                 sampling=batch_sampling(knobs), noise=noise_kind(knobs))


def dp_gd_from_knobs(knobs: Knobs) -> DPSGD:
    """``dp-gd`` by name: ``lr``, ``clip``, ``noise``."""
    return dp_gd(lr=knobs.lr, clip=knobs.clip, noise_multiplier=1.0, noise=noise_kind(knobs))


def rrpsgd_from_knobs(knobs: Knobs) -> DPSGD:
    """``rrpsgd`` by name: ``lr``, ``clip``, ``batch_size``, ``sampling``, ``noise``."""
    return rrpsgd(lr=knobs.lr, clip=knobs.clip, noise_multiplier=1.0, batch_size=knobs.batch_size,
                  sampling=batch_sampling(knobs), noise=noise_kind(knobs))
