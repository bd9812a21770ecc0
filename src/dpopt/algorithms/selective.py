"""DPSUR: DP-SGD with selective update and release (Fu, Ye, Wang, Huang, Liu, Chen, Sun, Zhang,
VLDB 2024): every step proposes a DP-SGD candidate and keeps it only if a noised test on a
validation batch says that it lowered the loss.

Step t, at θ_t:

1. **Candidate.** A Poisson batch B (rate q = b/n, b the expected batch size):

       θ' = θ_t − η·( Σ_{i∈B} clip(∇f_i(θ_t), C) + N(0, (σC)² I) ) / b

   Event: ``PoissonSampled(q, Gaussian(σ))`` (sensitivity C under add/remove-one).
2. **Test.** A second Poisson batch V of the training records (rate q_v, b_v = q_v·n), drawn from
   the run's secret generator independently of B (a record may be in both). Per record the loss
   change d_i = ℓ_i(θ') − ℓ_i(θ_t), each record's loss alone (:meth:`dpopt.base.Oracle.per_record_loss`),
   clipped to [−C_v, C_v], then

       u = ( Σ_{i∈V} clip(d_i, C_v) + N(0, (σ_v C_v)²) ) / b_v + r(θ') − r(θ_t)

   (r the oracle's regulariser: public, added after the noise). Adding or removing one record moves
   the clipped sum by at most C_v, so the event is ``PoissonSampled(q_v, Gaussian(σ_v))``.
3. **Selection.** θ_{t+1} = θ' if u < β (a public threshold), else θ_t.

Privacy: each step composes the candidate's and the test's events,
``Composed([PoissonSampled(q, Gaussian(σ)), PoissonSampled(q_v, Gaussian(σ_v))])``, whether the
candidate is kept or not: a rejected step has released both. The two releases are on independent
samples, so they are composed, not combined into one Gaussian. θ, the accept bit and the number of
accepted steps are functions of the two noised releases only (post-processing). The plan writes
the same T pairs from the hyper-parameters; calibration keeps σ_v/σ fixed (``noise_ratios``) and
scales σ. The validation losses themselves are never released: only their clipped, noised sum is
(docs/algorithms.md §7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
from ._common import check_noise, noise_kind

if TYPE_CHECKING:
    from .params import DPSURParams


class DPSURState(NamedTuple):
    theta: Tensor
    accepted: int  # steps whose candidate passed the noised test (a function of releases only)


@dataclass(frozen=True)
class DPSUR:
    """Keyword-only hyper-parameters: step size ``lr`` (η), clip norm ``clip`` (C), noise multiplier
    ``noise_multiplier`` (σ), expected batch ``batch_size`` (b, Poisson), the test's sampling rate
    ``val_rate`` (q_v in (0, 1]), its clip ``val_clip`` (C_v) and noise multiplier
    ``val_noise_multiplier`` (σ_v), the acceptance threshold ``threshold`` (β: accept iff u < β),
    ``noise_ratios`` (σ : σ_v, fixed while calibration scales both) and ``noise`` (continuous: the
    batches are sampled). See the module docstring."""

    lr: float
    clip: float
    noise_multiplier: float
    val_noise_multiplier: float
    batch_size: int = 1
    val_rate: float = 0.01
    val_clip: float = 1.0
    threshold: float = 0.0
    noise_ratios: tuple[float, float] = (1.0, 1.0)
    noise: mechanisms.Noise = mechanisms.CONTINUOUS

    NOISE_FIELDS = ("noise_multiplier", "val_noise_multiplier")

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.non_negative("val_noise_multiplier", self.val_noise_multiplier)
        private = self.noise_multiplier > 0 or self.val_noise_multiplier > 0
        for name in ("clip", "val_clip"):  # an infinite clip only for the non-private reference
            _validate.positive(name, getattr(self, name), allow_inf=not private)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.unit_interval("val_rate", self.val_rate)
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float) \
                or not math.isfinite(self.threshold):
            raise _validate.DpoptError(f"threshold={self.threshold!r} must be a finite number")
        ratios = self.noise_ratios
        if not (isinstance(ratios, tuple | list) and len(ratios) == 2 and all(
                isinstance(r, int | float) and not isinstance(r, bool) and 0 < r < math.inf for r in ratios)):
            raise _validate.DpoptError(f"noise_ratios={ratios!r} must be two finite numbers > 0 (σ : σ_v)")
        object.__setattr__(self, "noise_ratios", (float(ratios[0]), float(ratios[1])))
        check_noise(self.noise, sampling.Poisson)

    def relation(self) -> dpa.NeighboringRelation:
        return sampling.Poisson.relation

    def sampler(self, t: int, n: int) -> Sampler:
        """The candidate's batch: Poisson at rate b/n."""
        return sampling.Poisson.of(n, self.batch_size)

    def validation_sampler(self, n: int) -> sampling.Poisson:
        """The test's batch: Poisson at rate q_v over the same n training records."""
        return sampling.Poisson(n, self.val_rate)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSURState:
        return DPSURState(theta0.clone(), 0)

    def step(self, state: DPSURState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSURState, dpa.DpEvent]:
        theta, relation = state.theta, batch.sampler.relation
        rows = oracle.per_record(theta, batch.indices)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], relation)
        noised, candidate_event = mechanisms.gaussian(clipped, self.noise_multiplier, source, self.noise)
        candidate = theta.add(noised, alpha=-self.lr / batch.sampler.expected_size)
        checks = self.validation_sampler(oracle.n)
        change, test_event = self.test(theta, candidate, checks.sample(source.generator), checks, oracle, source)
        accept = change < self.threshold
        new = DPSURState(candidate if accept else theta, state.accepted + accept)
        return new, dpa.ComposedDpEvent([batch.sampler.wrap(candidate_event), checks.wrap(test_event)])

    def test(self, theta: Tensor, candidate: Tensor, indices: Tensor, checks: Sampler, oracle: Oracle,
             source: NoiseSource) -> tuple[float, dpa.DpEvent]:
        """u: the noised mean change of the loss from θ to the candidate on the validation records
        ``indices`` (each record's change clipped to [−C_v, C_v], sensitivity C_v), plus the
        regulariser's change; and the Gaussian's event (before sampling)."""
        losses = oracle.per_record_loss(torch.stack([theta, candidate]), indices)
        changes = clipping.Dense((losses[:, 1] - losses[:, 0]).unsqueeze(1))  # |clip(d)| ≤ C_v: a 1-D clip
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, changes, self.val_clip)], checks.relation)
        noised, event = mechanisms.gaussian(clipped, self.val_noise_multiplier, source, self.noise)
        public = float(oracle.regulariser(candidate) - oracle.regulariser(theta))
        return float(noised) / checks.expected_size + public, event

    def output(self, state: DPSURState) -> Tensor:
        return state.theta

    def released_counts(self, state: DPSURState) -> Mapping[str, float]:
        """``accepted_steps``: how many candidates passed the test (private: noised tests decided)."""
        return {"accepted_steps": float(state.accepted)}

    def step_event(self, n: int) -> dpa.DpEvent:
        """One step's two releases, from the hyper-parameters: the candidate's then the test's."""
        return dpa.ComposedDpEvent([self.sampler(0, n).wrap(self.noise.event(self.noise_multiplier)),
                                    self.validation_sampler(n).wrap(self.noise.event(self.val_noise_multiplier))])

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        """T steps of :meth:`step_event`, in the order a run records them (rejected steps included)."""
        return dpa.ComposedDpEvent([self.step_event(n)] * steps)


def from_params(params: DPSURParams) -> DPSUR:
    """``dp-sur`` by name: ``lr``, ``clip``, ``batch_size`` (Poisson only), ``val_rate`` (None: b/n),
    ``obj_clip`` as C_v (the clip of a per-record loss change), ``noise_ratio`` as σ_v/σ,
    ``threshold`` as β, ``noise``."""
    if params.sampling != "poisson":
        raise _validate.DpoptError(f"sampling={params.sampling!r} is refused for algorithm='dp-sur': its candidate and "
                                   "test batches are Poisson samples (sampling='poisson')")
    _validate.positive_int("batch_size", params.batch_size, maximum=params.n, maximum_name="n (training records)")
    ratio = _validate.positive("noise_ratio", params.noise_ratio)
    return DPSUR(lr=params.lr, clip=params.clip, noise_multiplier=1.0, val_noise_multiplier=ratio,
                 batch_size=params.batch_size,
                 val_rate=params.batch_size / params.n if params.val_rate is None else params.val_rate,
                 val_clip=params.obj_clip, threshold=params.threshold, noise_ratios=(1.0, ratio),
                 noise=noise_kind(params))
