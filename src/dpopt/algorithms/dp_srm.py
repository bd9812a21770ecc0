"""DP-SRM: differentially private stochastic recursive momentum (Wang, Jayaraman, Evans, Gu).

docs/algorithms.md §1. State θ^t, θ^{t−1} and the private momentum v^{t−1}:

* t = 0, batch B_0 (expected size b0):
  v^0 = ( Σ_{i∈B_0} clip(∇f_i(θ^0), C1) + N(0, (σ0·Δ1)² I) ) / b0
* t ≥ 1, batch B_t (expected size b), on the same records at both points:
  u_i = γ·clip(∇f_i(θ^t), C1) + (1−γ)·clip(∇f_i(θ^t) − ∇f_i(θ^{t−1}), C2),   ‖u_i‖ ≤ S = γC1 + (1−γ)C2
  v^t = ( Σ_{i∈B_t} u_i + N(0, (σ·Δ)² I) ) / b + (1−γ)·v^{t−1}
* θ^{t+1} = θ^t − η_t v^t, with η_t = ``lr`` ("plain") or the paper's normalised step
  η_t = min{ζ/(n0·L·‖v^t‖), 1/(2·n0·L)} ("normalized": every move is ≤ ζ/(n0 L)).

Δ1 = C1 and Δ = S under add/remove-one (Poisson), 2C1 and 2S under replace-one (fixed-size
sampling without replacement, the paper's Lemma 3.7). Privacy events: step 0 =
``wrap_0(Gaussian(σ0))``, steps 1..T−1 = ``wrap(Gaussian(σ))``. Output: last iterate, or
θ^R with R uniform on {0, …, T−1} (the theory's rule; post-processing).

With σ0 = σ = 0 and C1 = C2 = ∞ this is STORM with constant momentum a = γ and step size η.
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
    from .params import DPSRMParams

STEP_RULES = ("plain", "normalized")


class DPSRMState(NamedTuple):
    theta: Tensor
    theta_prev: Tensor
    momentum: Tensor
    out: Output


@dataclass(frozen=True)
class DPSRM:
    """Hyper-parameters (keyword-only): ``lr`` (η), ``clip`` (C1), ``clip_diff`` (C2),
    ``gamma`` (γ, the paper sets γ = C2), ``noise_multiplier0`` (σ0), ``noise_multiplier``
    (σ), ``batch_size0`` (b0), ``batch_size`` (b), ``sampling``, ``step_rule`` ("plain" or
    "normalized" with ``zeta``, ``n0``, ``smoothness`` = L), ``output_rule``, ``noise`` (the kind
    of noise, :data:`dpopt.mechanisms.Noise`; not discrete: the batches are sampled) and ``noise_ratios``
    (σ0 : σ, fixed while calibration scales both)."""

    lr: float
    clip: float
    clip_diff: float
    gamma: float
    noise_multiplier0: float
    noise_multiplier: float
    batch_size0: int
    batch_size: int
    sampling: sampling.BatchSampling = sampling.Poisson
    step_rule: str = "plain"
    zeta: float = 1.0
    n0: float = 1.0
    smoothness: float = 1.0
    output_rule: str = "last"
    noise: mechanisms.Noise = mechanisms.CONTINUOUS
    noise_ratios: tuple[float, float] = (1.0, 1.0)

    NOISE_FIELDS = ("noise_multiplier0", "noise_multiplier")

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.positive("clip_diff", self.clip_diff, allow_inf=True)
        _validate.unit_interval("gamma", self.gamma)
        _validate.non_negative("noise_multiplier0", self.noise_multiplier0)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        if len(self.noise_ratios) != 2:
            raise _validate.DpoptError(f"noise_ratios={self.noise_ratios!r} must be two numbers (σ0 : σ)")
        object.__setattr__(self, "noise_ratios",
                           tuple(_validate.positive("noise_ratios", r) for r in self.noise_ratios))
        _validate.positive_int("batch_size0", self.batch_size0)
        _validate.positive_int("batch_size", self.batch_size)
        sampling.check("sampling", self.sampling, (sampling.Poisson, sampling.FixedSize))
        _validate.one_of("step_rule", self.step_rule, STEP_RULES)
        for name in ("zeta", "n0", "smoothness"):
            _validate.positive(name, getattr(self, name))
        _validate.one_of("output_rule", self.output_rule, OUTPUT_RULES)
        check_noise(self.noise, self.sampling)

    def relation(self) -> dpa.NeighboringRelation:
        return self.sampling.relation

    def sampler(self, t: int, n: int) -> Sampler:
        return self.sampling.of(n, self.batch_size0 if t == 0 else self.batch_size)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSRMState:
        zeros = torch.zeros_like(theta0)
        return DPSRMState(theta0.clone(), theta0.clone(), zeros, output_init(self.output_rule, theta0, steps, gen))

    def step(self, state: DPSRMState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSRMState, dpa.DpEvent]:
        grads = oracle.per_record(state.theta, batch.indices)
        if batch.t == 0:
            terms = [clipping.Term(1.0, grads, self.clip)]
            noise, carried = self.noise_multiplier0, torch.zeros_like(state.momentum)
        else:
            diffs = grads - oracle.per_record(state.theta_prev, batch.indices)
            terms = [clipping.Term(self.gamma, grads, self.clip), clipping.Term(1 - self.gamma, diffs, self.clip_diff)]
            noise, carried = self.noise_multiplier, (1 - self.gamma) * state.momentum
        clipped, _ = clipping.clip_sum(terms, batch.sampler.relation)
        noised, event = mechanisms.gaussian(clipped, noise, source, self.noise)
        momentum = noised / batch.sampler.expected_size + carried
        out = output_track(state.out, batch.t, state.theta)
        theta = state.theta - self._step_size(momentum) * momentum
        return DPSRMState(theta, state.theta, momentum, out), batch.sampler.wrap(event)

    def direction(self, state: DPSRMState) -> Tensor:
        """g̃_t = v^t, the private momentum of the last step."""
        return state.momentum

    def moved(self, state: DPSRMState, theta: Tensor) -> DPSRMState:
        """θ^{t+1} := ``theta``; θ^t (for the next gradient difference) and v^t are kept."""
        return state._replace(theta=theta)

    def _step_size(self, momentum: Tensor) -> float:
        if self.step_rule == "plain":
            return self.lr
        scale = self.n0 * self.smoothness
        norm = float(momentum.norm())
        return min(self.zeta / (scale * norm) if norm > 0 else float("inf"), 1 / (2 * scale))

    def output(self, state: DPSRMState) -> Tensor:
        return output_value(state.out, state.theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        first = self.sampler(0, n).wrap(self.noise.event(self.noise_multiplier0))
        rest = self.sampler(1, n).wrap(self.noise.event(self.noise_multiplier))
        return dpa.ComposedDpEvent([first, dpa.SelfComposedDpEvent(rest, steps - 1)])


def from_params(params: DPSRMParams) -> DPSRM:
    """``dp-srm`` by name: ``lr``, ``clip`` (C1), ``clip_diff`` (C2), ``gamma``, ``batch_size`` (b; b0 =
    ``params.first_batch``), ``sampling``, ``noise`` and ``noise_ratio`` (σ0/σ)."""
    return DPSRM(lr=params.lr, clip=params.clip, clip_diff=params.clip_diff, gamma=params.gamma, noise_multiplier0=1.0,
                 noise_multiplier=1.0, batch_size0=params.first_batch, batch_size=params.batch_size,
                 sampling=batch_sampling(params), noise=noise_kind(params),
                 noise_ratios=(_validate.positive("noise_ratio", params.noise_ratio), 1.0))
