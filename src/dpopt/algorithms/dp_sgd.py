"""DP-SGD (Abadi et al. 2016), its special cases DP-GD and RRPSGD, and its variants beyond
independent noise at a fixed clip (banded matrix factorisation, quantile adaptive clipping), as a
composition of parts (:mod:`~dpopt.algorithms.parts`).

Step t, on a batch B_t from the selection:

    g̃_t = ( Σ_{i∈B_t} clip(∇f_i(θ_t), C_t) + noise ) / b,     θ_{t+1} = θ_t − η g̃_t

with b the sampler's public expected batch size, Δ_t = f·C_t the clipped sum's sensitivity (C_t
under add/remove-one, 2C_t under replace-one) and the noise N(0, (z·Δ_t)² I) for independent noise.
Privacy event per step: ``sampler.wrap(Gaussian(z))`` for independent noise at a fixed clip; in
general the parts' composition (:class:`~dpopt.algorithms.parts.Parts`).

:class:`ComposedSGD` is DP-SGD of any parts; :class:`DPSGD` takes today's hyper-parameters and picks
the parts they name:

* selection: ``sampling`` (:class:`~dpopt.algorithms.parts.Sampled`), or with ``bands`` = b > 1 cyclic
  Poisson over b secret groups (:class:`~dpopt.algorithms.parts.CyclicGroups`, group t mod b at rate
  b·B/n; the run's event is ⌈T/b⌉ rounds of PoissonSampled(b·B/n, Gaussian(z)));
* clipping rule: ``clip`` (:class:`~dpopt.algorithms.parts.FixedClip`), or with ``clip_quantile`` = γ
  the clip C_t following the γ-quantile of the gradient norms through a noised count
  (:class:`~dpopt.algorithms.parts.QuantileClip`): z is the pair's multiplier, the gradient noised at
  z_grad = (z⁻² − z_count⁻²)^(−1/2);
* noise: independent (:class:`~dpopt.algorithms.parts.Independent`, of kind ``noise``), or with
  b > 1 banded correlated noise z·Δ·(C⁻¹Z)_t (:class:`~dpopt.algorithms.parts.Correlated`). b = 1 is
  DP-SGD exactly (the same draws, θ and ledger).

* DP-GD: ``sampling=FullBatch`` (replace-one, no amplification).
* RRPSGD (Zhang et al. 2017, "random round private SGD"): DP-SGD whose output is θ^R for R
  uniform on {0, …, T−1}; R is drawn before training, so it costs no privacy, and all T
  steps are accounted (their noise was calibrated for T).
With z = 0 and C = ∞ this is plain minibatch SGD.
"""

from __future__ import annotations

import dataclasses
import functools
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
from .parts import Correlated, CyclicGroups, FixedClip, Independent, Parts, QuantileClip, Sampled

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


class _Steps:
    """The step of DP-SGD from its parts (``composition()``), shared by :class:`DPSGD` and
    :class:`ComposedSGD`: the sampler, state, release and event of each part, in that order."""

    lr: float
    noise_multiplier: float
    output_rule: str

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def composition(self) -> Parts:
        raise NotImplementedError

    def relation(self) -> dpa.NeighboringRelation:
        return self.composition().selection.relation

    def sampler(self, t: int, n: int) -> Sampler:
        """Step t's sampler for planning; with a secret key (cyclic groups) it cannot draw
        (:meth:`batch_sampler` can)."""
        return self.composition().selection.sampler(n, t)

    def batch_sampler(self, state: DPSGDState, t: int, n: int) -> Sampler:
        """Step t's sampler: with cyclic groups, over the groups of the state's key."""
        return self.composition().selection.sampler(n, t, None if state.banded is None else state.banded.key)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSGDState:
        """The output rule's pick, then the selection's key, from ``gen``; the noise's ring and the rule's clip."""
        parts = self.composition()
        out = output_init(self.output_rule, theta0, steps, gen)
        key, ring = parts.selection.start(gen), parts.noise.start(theta0, steps)
        keyed = None if key is None or ring is None else banded.Banded(key, ring)
        return DPSGDState(theta0.clone(), out, torch.zeros_like(theta0), 1.0, 0.0, keyed, parts.clipping.start())

    def step(self, state: DPSGDState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSGDState, dpa.DpEvent]:
        """Clip at the rule's C_t, noise at its gradient multiplier, then the rule's own releases;
        the event is theirs, wrapped by the batch's sampler."""
        parts = self.composition()
        rows = oracle.per_record(state.theta, batch.indices)
        relation = batch.sampler.relation
        clip = parts.clipping.current(state.clip)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, clip)], relation)
        b = batch.sampler.expected_size  # a public constant: θ − η·(release / b) in one operation
        z = parts.clipping.multiplier(self.noise_multiplier, relation)
        noised, ring, event, scale = parts.noise.release(clipped, z, state.banded, source, batch.t)
        next_clip, event = parts.clipping.after(rows, clip, b, event, parts.noise, relation, source)
        out = output_track(state.out, batch.t, state.theta)
        std = _std(z, clipped) * scale
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
        """Written from the hyper-parameters (:meth:`Parts.planned_event`): T times
        ``wrap(Gaussian(z))`` at a fixed clip with independent noise; ``wrap(Composed([Gaussian(z_grad),
        Gaussian(z_count)]))`` with ``clip_quantile``; ⌈T/b⌉ rounds of the group's Poisson-sampled
        Gaussian with bands > 1."""
        return self.composition().planned_event(self.noise_multiplier, n, steps)


@dataclass(frozen=True)
class DPSGD(_Steps):
    """Keyword-only hyper-parameters: step size ``lr`` (η), clip norm ``clip`` (C; with
    ``clip_quantile``, the first step's), ``noise_multiplier`` (z), ``batch_size`` (b, expected size
    under Poisson), ``sampling`` (:class:`~dpopt.sampling.Poisson`, :class:`~dpopt.sampling.FixedSize`
    or :class:`~dpopt.sampling.FullBatch`, the class), ``output_rule`` ("last" or "uniform"),
    ``noise`` (the kind of noise, :data:`dpopt.mechanisms.Noise`), ``bands`` (b ≥ 1: banded matrix
    factorisation with cyclic Poisson batches for b > 1; continuous noise, ``sampling=Poisson``) and
    adaptive clipping: ``clip_quantile`` (γ in (0, 1), None: off), ``clip_lr`` (η_C) and
    ``count_noise`` (σ_b, the count's noise std; None: ``batch_size``/20). They pick the parts
    (:meth:`composition`); see the module docstring."""

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

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.positive_int("batch_size", self.batch_size)
        sampling.check("sampling", self.sampling)
        _validate.one_of("output_rule", self.output_rule, OUTPUT_RULES)
        check_noise(self.noise, self.sampling)
        _validate.positive_int("bands", self.bands)
        self._parts.check(self.noise_multiplier)

    @property
    def count_std(self) -> float:
        """σ_b: ``count_noise``, or the expected batch size / 20."""
        return self.batch_size / quantile.COUNT_NOISE_DIVISOR if self.count_noise is None else self.count_noise

    def composition(self) -> Parts:
        """The parts the hyper-parameters pick (computed once per instance, kept outside its fields)."""
        return self._parts

    @functools.cached_property
    def _parts(self) -> Parts:
        return _picked(self)


def _picked(algorithm: DPSGD) -> Parts:
    """``sampling`` or, for b > 1 Poisson batches, cyclic groups; ``clip`` or quantile clipping from it;
    independent noise of kind ``noise`` or, for b > 1, banded noise."""
    a = algorithm
    cyclic = a.bands > 1 and a.sampling is sampling.Poisson
    selection = CyclicGroups(a.bands, a.batch_size) if cyclic else Sampled(a.sampling, a.batch_size)
    rule = (FixedClip(a.clip) if a.clip_quantile is None
            else QuantileClip(a.clip, a.clip_quantile, a.clip_lr, a.count_std))
    noise = Correlated(a.bands, a.noise) if a.bands > 1 else Independent(a.noise)
    return Parts(selection, rule, noise)


@dataclass(frozen=True)
class ComposedSGD(_Steps):
    """DP-SGD of any ``parts`` (a selection, a clipping rule, a noise: :mod:`~dpopt.algorithms.parts`),
    step size ``lr`` (η), noise multiplier ``noise_multiplier`` (z, what calibration scales) and
    ``output_rule``. Each part's refusals run at construction."""

    lr: float
    noise_multiplier: float
    parts: Parts
    output_rule: str = "last"

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.one_of("output_rule", self.output_rule, OUTPUT_RULES)
        if not isinstance(self.parts, Parts):
            raise _validate.DpoptError(f"parts={self.parts!r} must be dpopt.algorithms.parts.Parts(selection, "
                                       "clipping, noise)")
        self.parts.check(self.noise_multiplier)

    @property
    def noise(self) -> mechanisms.Noise:
        """The noise's kind (the data-parallel check reads it)."""
        return self.parts.noise.kind

    def composition(self) -> Parts:
        return self.parts


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
