"""AClipped-dpSGD and R-AClipped-dpSGD (Jin, Zhou, Han, Cheng, Zeng): clip the batch mean once.

docs/algorithms.md §2. Step k, on a Poisson batch B_k of rate m/n (expected size m):

    g_k  = (1/m) Σ_{i∈B_k} ∇f_i(x^k)                 one ordinary pass, no per-record gradients
    g̃_k  = clip(g_k, λ) + N(0, (z·2λ)² I)
    x^{k+1} = Proj_R(x^k − γ g̃_k)                     Proj_R: onto the ball ‖x‖ ≤ R (R = ∞: none)

and the output is the average of the iterates x̄ = (1/N) Σ_{k=1}^{N} x^k (post-processing).

**Sensitivity 2λ, not λ.** The paper's privacy proof (its Theorem 2) takes the sensitivity of
clip(g, λ) to be λ. Both clip(g(S)) and clip(g(S′)) lie in the λ-ball and one record can move
g arbitrarily (gradients are unbounded: the heavy-tailed setting), so they can be 2λ apart.
dpopt calibrates and accounts with Δ = 2λ: the noise multiplier z is σ̂/(2λ), and the paper's
σ̂ formula gives half the z it assumes (``dpopt account --explain aclip`` quantifies this).
Privacy event per step: ``PoissonSampled(m/n, Gaussian(z))`` under add/remove-one adjacency.

``bands`` = b > 1 replaces the independent noise with banded correlated noise z·2λ·(C⁻¹Z)_k over
cyclic Poisson batches (group k mod b at rate b·m/n; :mod:`~dpopt.algorithms.banded`): DP-SGD's
argument holds as it is, every step releasing clip(mean, λ) of its own batch at sensitivity 2λ and
the one multiplier z. Event: ⌈N/b⌉ rounds of ``PoissonSampled(b·m/n, Gaussian(z))``.

R-AClipped-dpSGD runs τ stages; stage s has N_s steps, batch m_s, clip λ_s and step size γ_s,
and starts from the previous stage's averaged output (stage 0 from x^0); the output is the
last stage's average. The paper splits (ε, δ) over stages by advanced composition; dpopt
composes the stages' events exactly in the ledger instead, with one noise multiplier z
shared by all stages (calibrated jointly).

With z = 0 and λ = ∞ this is plain minibatch SGD with iterate averaging.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypedDict

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, accounting, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
from . import banded
from ._common import check_noise, noise_kind

if TYPE_CHECKING:
    from .params import AClipParams


@dataclass(frozen=True)
class Stage:
    """One run of AClipped-dpSGD inside the restarted variant: ``steps`` (N_s), ``batch_size``
    (m_s), ``clip`` (λ_s) and ``lr`` (γ_s)."""

    steps: int
    batch_size: int
    clip: float
    lr: float

    def __post_init__(self) -> None:
        _validate.positive_int("steps", self.steps)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.positive("lr", self.lr)


class AClipState(NamedTuple):
    theta: Tensor
    iterate_sum: Tensor  # Σ x^k over the current stage's steps so far
    count: int  # type: ignore[assignment]  # shadows tuple.count; the name is in checkpoints
    direction: Tensor    # g̃_{k−1}, the last step's noised clipped mean (zero before the first)
    banded: banded.Banded | None = None  # bands > 1: the group key and the noise ring


def _project(theta: Tensor, radius: float) -> Tensor:
    """Euclidean projection onto the ball ‖x‖ ≤ radius (identity for radius = ∞)."""
    if math.isinf(radius):
        return theta
    norm = float(theta.norm())
    return theta * (radius / norm) if norm > radius else theta


def _aclip_step(state: AClipState, batch: Batch, oracle: Oracle, source: NoiseSource, *, lr: float,
                clip: float, noise_multiplier: float, radius: float,
                noise: mechanisms.Noise) -> tuple[AClipState, dpa.DpEvent]:
    """One AClipped-dpSGD step with step size ``lr`` and clip ``clip`` (the mechanism shared by
    both variants)."""
    mean = oracle.gradient_sum(state.theta, batch.indices) / batch.sampler.expected_size
    clipped, ring = clipping.clip_aggregate(mean, clip), state.banded
    if ring is None:
        noised, event = mechanisms.gaussian(clipped, noise_multiplier, source, noise)
    else:
        noised, ring, event = banded.release(clipped, noise_multiplier, ring, source, batch.t)
    theta = _project(state.theta.add(noised, alpha=-lr), radius)
    return AClipState(theta, state.iterate_sum + theta, state.count + 1, noised, ring), batch.sampler.wrap(event)


def _start(theta0: Tensor) -> AClipState:
    return AClipState(theta0.clone(), torch.zeros_like(theta0), 0, torch.zeros_like(theta0))


def _average(state: AClipState) -> Tensor:
    return state.iterate_sum / state.count if state.count else state.theta


@dataclass(frozen=True)
class AClip:
    """AClipped-dpSGD. Keyword-only: ``lr`` (γ), ``clip`` (λ), ``noise_multiplier`` (z = σ̂/(2λ)),
    ``batch_size`` (m, the expected Poisson batch size and the divisor of the batch sum),
    ``radius`` (R of the constraint ball; ∞ for the unconstrained variant), ``noise`` (the kind
    of noise, :data:`dpopt.mechanisms.Noise`; not discrete: the batches are sampled) and ``bands``
    (b > 1: banded correlated noise over cyclic Poisson batches, :mod:`~dpopt.algorithms.banded`;
    DP-SGD's argument holds as it is: every step releases clip(mean, λ) of its own batch, of
    sensitivity 2λ, at the one multiplier z)."""

    lr: float
    clip: float
    noise_multiplier: float
    batch_size: int = 1
    radius: float = math.inf
    noise: mechanisms.Noise = mechanisms.CONTINUOUS
    bands: int = 1

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def __post_init__(self) -> None:
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.positive("radius", self.radius, allow_inf=True)
        check_noise(self.noise, sampling.Poisson)
        Stage(1, self.batch_size, self.clip, self.lr)  # validates lr, clip and batch_size
        _validate.positive_int("bands", self.bands)

    def relation(self) -> dpa.NeighboringRelation:
        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    def sampler(self, t: int, n: int) -> Sampler:
        """Step t's sampler for planning; with bands > 1 it cannot draw (:meth:`batch_sampler` can)."""
        return banded.sampler(sampling.Poisson, n, self.batch_size, self.bands, t)

    def batch_sampler(self, state: AClipState, t: int, n: int) -> Sampler:
        """Step t's sampler: with bands > 1, cyclic Poisson over the groups of the state's key."""
        return banded.sampler(sampling.Poisson, n, self.batch_size, self.bands, t, state.banded)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> AClipState:
        start = _start(_project(theta0, self.radius))
        return start._replace(banded=banded.start(theta0, self.bands, steps, gen)) if self.bands > 1 else start

    def step(self, state: AClipState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[AClipState, dpa.DpEvent]:
        return _aclip_step(state, batch, oracle, source, lr=self.lr, clip=self.clip,
                           noise_multiplier=self.noise_multiplier, radius=self.radius, noise=self.noise)

    def output(self, state: AClipState) -> Tensor:
        return _average(state)

    def running_output(self, state: AClipState) -> Tensor:
        """The output if the run stopped now (what the training loop logs)."""
        return _average(state)

    def direction(self, state: AClipState) -> Tensor:
        """g̃_k = clip(g_k, λ) + noise of the last step."""
        return state.direction

    def release_variance(self, state: AClipState) -> float:
        """Φ = (z·2λ)² per coordinate of g̃_k: the noise of the clipped mean (sensitivity 2λ); with
        bands, times the variance of row k of C⁻¹."""
        if self.noise_multiplier == 0:
            return 0.0
        ring = state.banded
        scale = 1.0 if ring is None or ring.noise.step == 0 else banded.noise_scale(ring, ring.noise.step - 1)
        return (self.noise_multiplier * 2 * self.clip * scale) ** 2

    def moved(self, state: AClipState, theta: Tensor) -> AClipState:
        """x^{k+1} := ``theta`` (the average then counts ``theta``; no projection: the new rule is
        the caller's)."""
        return state._replace(theta=theta, iterate_sum=state.iterate_sum - state.theta + theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        if self.bands > 1:
            return banded.planned_event(self.noise_multiplier, n, self.batch_size, self.bands, steps)
        step = self.sampler(0, n).wrap(self.noise.event(self.noise_multiplier))
        return dpa.SelfComposedDpEvent(step, steps)


@dataclass(frozen=True)
class RestartedAClip:
    """R-AClipped-dpSGD: ``stages`` (a tuple of :class:`Stage`), one ``noise_multiplier`` for
    all of them, ``radius`` and ``noise``. A run must have exactly Σ_s N_s steps."""

    stages: tuple[Stage, ...]
    noise_multiplier: float
    radius: float = math.inf
    noise: mechanisms.Noise = mechanisms.CONTINUOUS

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def __post_init__(self) -> None:
        if not self.stages or not all(isinstance(s, Stage) for s in self.stages):
            raise _validate.DpoptError(f"stages={self.stages!r} must be a non-empty tuple of Stage")
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.positive("radius", self.radius, allow_inf=True)
        check_noise(self.noise, sampling.Poisson)

    @property
    def total_steps(self) -> int:
        return sum(stage.steps for stage in self.stages)

    def _stage_of(self, t: int) -> tuple[Stage, bool]:
        """The stage step t belongs to, and whether t is that stage's last step."""
        end = 0
        for stage in self.stages:
            end += stage.steps
            if t < end:
                return stage, t == end - 1
        raise _validate.DpoptError(f"step={t} is past the last stage (total {self.total_steps} steps)")

    def relation(self) -> dpa.NeighboringRelation:
        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    def sampler(self, t: int, n: int) -> Sampler:
        return sampling.Poisson.of(n, self._stage_of(t)[0].batch_size)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> AClipState:
        if steps != self.total_steps:
            raise _validate.DpoptError(f"steps={steps} must equal the stages' total, {self.total_steps}")
        return _start(_project(theta0, self.radius))

    def step(self, state: AClipState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[AClipState, dpa.DpEvent]:
        stage, last = self._stage_of(batch.t)
        state, event = _aclip_step(state, batch, oracle, source, lr=stage.lr, clip=stage.clip,
                                   noise_multiplier=self.noise_multiplier, radius=self.radius, noise=self.noise)
        if last and batch.t + 1 < self.total_steps:  # restart from this stage's average
            state = _start(_average(state))
        return state, event

    def output(self, state: AClipState) -> Tensor:
        return _average(state)

    def running_output(self, state: AClipState) -> Tensor:
        """The output if the run stopped now (what the training loop logs)."""
        return _average(state)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        if steps != self.total_steps:
            raise _validate.DpoptError(f"steps={steps} must equal the stages' total, {self.total_steps}")
        gaussian = self.noise.event(self.noise_multiplier)
        return dpa.ComposedDpEvent([
            dpa.SelfComposedDpEvent(sampling.Poisson.of(n, stage.batch_size).wrap(gaussian), stage.steps)
            for stage in self.stages])


class NoiseRow(TypedDict):
    """One sensitivity of :func:`paper_noise`: its noise multiplier and the exact ε it gives."""

    sensitivity: str
    noise_multiplier: float
    epsilon: float


class PaperNoise(TypedDict):
    """What :func:`paper_noise` returns."""

    explain: str
    claimed_epsilon: float
    delta: float
    restarts: int
    stage_epsilon: float
    stage_delta: float
    steps_per_stage: int
    sampling_rate: float
    sigma_over_lambda: float
    rows: list[NoiseRow]
    accountant: str
    neighboring_relation: str


def paper_noise(*, epsilon: float, delta: float, n: int, batch_size: int, steps: int,
                restarts: int = 1) -> PaperNoise:
    """What the paper's noise formula really gives, accounted exactly.

    The paper's Theorem 2 (with the constant c = 1 of its Theorems 3 and 4) sets
    σ̂ = λ·m·√(N ln(1/δ))/(n ε) for N steps at Poisson rate m/n and claims (ε, δ)-DP, taking the
    sensitivity of clip(mean) to be λ: a noise multiplier σ̂/λ. With τ restarts (Theorem 5) each
    stage of N steps uses ε̂ = ε/(2√(2τ ln(2/δ))) and δ̂ = δ/(2τ) (advanced composition). The
    honest sensitivity is 2λ, so the real noise multiplier is σ̂/(2λ). Returns the multipliers
    and the exact PLD ε(δ) of all τ·N steps under each sensitivity, beside the claimed ε.
    """
    _validate.positive("epsilon", epsilon)
    _validate.open_unit("delta", delta)
    n = _validate.positive_int("dataset_size", n)
    batch_size = _validate.positive_int("batch_size", batch_size, maximum=n, maximum_name="dataset_size")
    steps = _validate.positive_int("steps", steps)
    restarts = _validate.positive_int("restarts", restarts)
    if restarts == 1:
        stage_epsilon, stage_delta = epsilon, delta
    else:
        stage_epsilon = epsilon / (2 * math.sqrt(2 * restarts * math.log(2 / delta)))
        stage_delta = delta / (2 * restarts)
    per_unit_clip = batch_size * math.sqrt(steps * math.log(1 / stage_delta)) / (n * stage_epsilon)
    rate = batch_size / n

    def spent(z: float) -> float:
        step = dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(z))
        return accounting.epsilon_of(dpa.SelfComposedDpEvent(step, steps * restarts), delta,
                                     dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)

    rows: list[NoiseRow] = [{"sensitivity": "λ (the paper's proof)", "noise_multiplier": per_unit_clip,
             "epsilon": spent(per_unit_clip)},
            {"sensitivity": "2λ (honest)", "noise_multiplier": per_unit_clip / 2, "epsilon": spent(per_unit_clip / 2)}]
    return {"explain": "aclip", "claimed_epsilon": epsilon, "delta": delta, "restarts": restarts,
            "stage_epsilon": stage_epsilon, "stage_delta": stage_delta, "steps_per_stage": steps,
            "sampling_rate": rate, "sigma_over_lambda": per_unit_clip, "rows": rows, "accountant": "pld",
            "neighboring_relation": "add_or_remove_one"}


def from_params(params: AClipParams) -> AClip:
    """``aclip`` by name: ``lr``, ``clip`` (λ), ``batch_size``, ``radius``, ``noise``, ``bands`` (default 1)."""
    _validate.positive_int("batch_size", params.batch_size, maximum=params.n, maximum_name="n (training records)")
    return AClip(lr=params.lr, clip=params.clip, noise_multiplier=1.0, batch_size=params.batch_size,
                 radius=params.radius, noise=noise_kind(params), bands=1 if params.bands is None else params.bands)
