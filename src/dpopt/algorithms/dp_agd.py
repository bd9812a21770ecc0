"""DP-AGD: gradient descent with an adaptive per-iteration zCDP budget (Lee & Kifer, KDD 2018).

"Concentrated Differentially Private Gradient Descent with Adaptive per-Iteration Privacy
Budget", arXiv:1808.09501, Algorithm 2 (with GradAvg, its Algorithm 1); cross-checked against
the authors' code (github.com/ppmlguy/DP-AGD, ``algo/agd_rho.py``, ``common/noisy_max.py``).
Full batch, replace-one adjacency. Names (paper → here): ρ → ``ρ_total`` = 1/(2 z²) with z =
``noise_multiplier``; ρ_ng → ``grad_fraction``·ρ_total (initial; it grows); ρ_nmax →
``select_fraction``·ρ_total; γ → ``gamma``; C_grad → ``clip``; C_obj → ``obj_clip``;
Φ = {0, α_max/m, 2α_max/m, …, α_max} with m = ``num_candidates`` and α_max starting at
``max_step``; the Φ update every τ = ``adapt_every`` iterations with growth η = ``step_growth``.

One ``step`` is one iteration t of the paper's outer loop::

    S ← Σ_i clip(∇f_i(θ_t), C) + N(0, (z_g·2C)² I),  z_g = 1/√(2ρ_g)        [ρ_g-zCDP]
    loop:
        d ← (S/n) / ‖S/n‖                                   (the paper normalises the direction)
        u_k ← Σ_i min(max(ℓ_i(θ_t − α_k d), 0), C_obj) + n·r(θ_t − α_k d),   α_k ∈ Φ
        k ← argmin_k (u_k − b·G_k),  G_k ~ Gumbel(0, 1),  b = C_obj/√(2ρ_s)     [ρ_s-zCDP]
        if k > 0:  θ_{t+1} ← θ_t − α_k d;  stop
        else (−d is no descent direction; GradAvg):  ρ_new ← (1+γ)·ρ_g
            S' ← Σ_i clip(∇f_i(θ_t), C) + N(0, (z'·2C)² I),  z' = 1/√(2(ρ_new − ρ_g))
            S ← (ρ_g·S + (ρ_new − ρ_g)·S') / ρ_new;  ρ_g ← ρ_new  (kept for later iterations)
    every τ iterations: α_max ← min((1+η)·max{nonzero α chosen in the last τ}, max_step)

Privacy accounting (a zCDP privacy filter with budget ρ_total):

* The clipped sum has L2 sensitivity 2C under replace-one, so the Gaussian with multiplier z is
  exactly 1/(2z²)-zCDP; a release planned at ρ uses z = 1/√(2ρ), and the ledger records the
  ``GaussianDpEvent(z)`` that :func:`mechanisms.gaussian` returns. GradAvg's weights make the average
  exactly as accurate as one release at ρ_new (variance (2C)²/(2ρ_new)): the averaging is
  post-processing of two recorded releases.
* The noisy min is the exponential mechanism P(k) ∝ exp(−ε u_k/(2Δ)), run as Gumbel-max, with
  Δ = C_obj: each record adds a value in [0, C_obj] to every score (the regulariser term is
  data-independent), so replacing a record moves every u_k by at most C_obj. That mechanism is
  ε-bounded-range, hence ε²/8-zCDP (Cesar & Rogers, ALT 2021), for any neighbouring relation and
  without monotone scores; we set ε = √(8ρ_s), i.e. Gumbel scale b = 2Δ/ε = C_obj/√(2ρ_s). The
  paper instead charges ε²/2 (ε-DP ⇒ ε²/2-zCDP) for report-noisy-max with one-sided exponential
  noise of scale C_obj/ε, ε = √(2ρ_s) — the same noise scale, but that ε-DP claim needs
  monotone scores (add/remove-one), not replace-one; our Gumbel version is exactly ρ_s-zCDP
  here. :func:`mechanisms.noisy_argmin` runs it and returns ``ZCDpEvent(ρ_s)``.
* The budgets are chosen adaptively, so the guarantee rests on a Rényi/zCDP privacy filter
  (Feldman & Zrnic 2021, Whitehouse et al. 2023): at every order α the recorded RDP sums to at
  most α·ρ_total, so the whole run is ρ_total-zCDP whatever the data. ``planned_event`` is
  ``ZCDpEvent(ρ_total)``, and that is the guarantee a run reports (at every step: the budgets
  ahead depend on the data, so the realised spend is no guarantee); the ledger's events sum to at
  most ρ_total (:func:`dpopt.accounting.guarantee` checks it), exactly ρ_total once the budget
  is spent.

Decisions where the paper (or its code) is loose:

* **Stopping rule, exact spend.** Spending is organised in rounds (a fresh gradient + one noisy
  min, or a GradAvg increment + one noisy min) of nominal cost c. If the remaining budget is
  below 2c, this round is the last: both of its parts are scaled by remaining/c so it spends
  exactly the remainder (the paper's loop "while ρ > 0" may overdraw its last round; the
  authors' code charges after the fact and can go negative). After that every ``step`` returns
  ``NoOpDpEvent()`` and leaves θ unchanged; if the last noisy min picks α = 0, θ is unchanged.
* GradAvg combines the *current* estimate (budget ρ_g) with the fresh one, as in the paper's
  Algorithm 1; the authors' code re-averages the first estimate on repeated failures.
* The authors' code also charges ρ_ng after a successful step (double counting); we do not.
* Per-record losses are clipped to [0, C_obj] (the code clips from above; GLM losses are ≥ 0).
  The regulariser enters the clipped per-record gradients (like :mod:`.dp_sgd`), whereas the
  code adds it after normalisation; its score term n·r(θ) is data-independent.
* Φ's update follows the code (τ = 10, η = 0.1, capped at the initial α_max = 2); only nonzero
  chosen steps count, and α_max is kept if none was chosen.
* Defaults approximate the code's initial budgets (its ``splits = 60`` at δ = 1e-8):
  ρ_nmax ≈ ρ_total/400 and ρ_ng ≈ ρ_total/14400 (``grad_fraction`` = 7e-5).
* The output is the last iterate.

With ``noise_multiplier = 0`` the run is non-private (ε = ∞): exact clipped
gradients and an exact argmin over Φ; a failed line search is not retried (it would repeat
itself) and θ stays put for that iteration. With ``clip = obj_clip = inf`` this is normalised
gradient descent with an exact line search over Φ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
from ..mechanisms import Bounded
from ._common import check_noise, noise_kind

if TYPE_CHECKING:
    from .params import DPAGDParams


class DPAGDState(NamedTuple):
    theta: Tensor
    remaining: float      # zCDP budget not yet spent (inf when non-private)
    rho_grad: float       # ρ_ng: the budget of the next fresh gradient
    max_step: float       # α_max: Φ = linspace(0, α_max, num_candidates + 1)
    chosen: tuple[float, ...]  # nonzero step sizes chosen since the last Φ update
    exhausted: bool


@dataclass(frozen=True)
class DPAGD:
    """Keyword-only hyper-parameters: ``noise_multiplier`` (z: total budget ρ = 1/(2z²); 0 =
    non-private), gradient clip ``clip`` (C_grad), loss clip ``obj_clip`` (C_obj), initial
    budget fractions ``grad_fraction`` (ρ_ng/ρ) and ``select_fraction`` (ρ_nmax/ρ), budget
    growth ``gamma`` (γ), step sizes ``max_step`` (initial α_max) and ``num_candidates`` (m
    nonzero candidates), Φ's update every ``adapt_every`` iterations by ``step_growth``, and
    ``noise``, the source of the Gaussian and the Gumbel noise (:data:`dpopt.mechanisms.NOISES`;
    "discrete" makes the Gaussian releases discrete, the Gumbel noise comes from the CSPRNG)."""

    noise_multiplier: float
    clip: float
    obj_clip: float
    grad_fraction: float = 7e-5
    select_fraction: float = 2.5e-3
    gamma: float = 0.1
    max_step: float = 2.0
    num_candidates: int = 20
    adapt_every: int = 10
    step_growth: float = 0.1
    noise: mechanisms.Noise = mechanisms.CONTINUOUS

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def __post_init__(self) -> None:
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.positive("obj_clip", self.obj_clip, allow_inf=True)
        if self.noise_multiplier > 0:
            for name in ("clip", "obj_clip"):
                if math.isinf(getattr(self, name)):
                    raise _validate.DpoptError(
                        f"{name}=inf must be finite when noise_multiplier={self.noise_multiplier!r} > 0 "
                        "(unbounded sensitivity; inf is allowed only with noise_multiplier=0)")
        _validate.open_unit("grad_fraction", self.grad_fraction)
        _validate.open_unit("select_fraction", self.select_fraction)
        if self.grad_fraction + self.select_fraction > 1:
            raise _validate.DpoptError(
                f"grad_fraction={self.grad_fraction!r} + select_fraction={self.select_fraction!r} must be <= 1")
        _validate.positive("gamma", self.gamma)
        _validate.positive("max_step", self.max_step)
        _validate.positive_int("num_candidates", self.num_candidates)
        _validate.positive_int("adapt_every", self.adapt_every)
        _validate.non_negative("step_growth", self.step_growth)
        check_noise(self.noise, sampling.FullBatch)

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def rho_total(self) -> float:
        """The zCDP budget: that of one Gaussian with multiplier z (∞ when z = 0)."""
        return 1 / (2 * self.noise_multiplier**2) if self.private else math.inf

    def relation(self) -> dpa.NeighboringRelation:
        return sampling.FullBatch.relation

    def sampler(self, t: int, n: int) -> Sampler:
        return sampling.FullBatch(n)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPAGDState:
        rho = self.rho_total
        return DPAGDState(theta0.clone(), rho, self.grad_fraction * rho, self.max_step, (), False)

    def step(self, state: DPAGDState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPAGDState, dpa.DpEvent]:
        if state.exhausted:
            return state, dpa.NoOpDpEvent()
        n = batch.sampler.expected_size
        rows = oracle.per_record(state.theta, batch.indices)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], batch.sampler.relation)
        rho_select = self.select_fraction * self.rho_total
        remaining = state.remaining
        events: list[dpa.DpEvent] = []

        rho_g, rho_s, last = _round(remaining, state.rho_grad, rho_select)
        noised = self._gaussian(clipped, rho_g, source, events)
        remaining = _spend(remaining, rho_g)
        alphas = torch.linspace(0.0, state.max_step, self.num_candidates + 1, dtype=state.theta.dtype)
        while True:
            candidates = state.theta - alphas[:, None] * _unit(noised / n)
            scores = _candidate_scores(oracle, candidates, batch.indices, self.obj_clip, n)
            pick, event = mechanisms.noisy_argmin(scores, rho_s if self.private else math.inf, source)
            events.append(event)
            remaining = 0.0 if last else _spend(remaining, rho_s)
            if pick > 0 or last or not self.private:
                break
            rho_new = (1 + self.gamma) * rho_g                       # GradAvg: raise the budget
            increment, rho_s, last = _round(remaining, rho_new - rho_g, rho_select)
            fresh = self._gaussian(clipped, increment, source, events)
            noised = (rho_g * noised + increment * fresh) / (rho_g + increment)
            rho_g, remaining = rho_g + increment, _spend(remaining, increment)

        theta = candidates[pick].clone() if pick > 0 else state.theta
        chosen = state.chosen + ((float(alphas[pick]),) if pick > 0 else ())
        max_step = state.max_step
        if (batch.t + 1) % self.adapt_every == 0:
            if chosen:
                max_step = min((1 + self.step_growth) * max(chosen), self.max_step)
            chosen = ()
        new_state = DPAGDState(theta, remaining, rho_g, max_step, chosen, last)
        return new_state, events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)

    def _gaussian(self, clipped: mechanisms.Bounded, rho: float, source: NoiseSource,
                  events: list[dpa.DpEvent]) -> Tensor:
        """The Gaussian mechanism at zCDP budget ρ (multiplier 1/√(2ρ)); appends its event."""
        z = 1 / math.sqrt(2 * rho) if self.private else 0.0
        noised, event = mechanisms.gaussian(clipped, z, source, self.noise)
        events.append(event)
        return noised

    def output(self, state: DPAGDState) -> Tensor:
        return state.theta

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        """The privacy filter's budget: ZCDpEvent(ρ_total), whatever ``steps`` (at most this is spent)."""
        return dpa.ZCDpEvent(self.rho_total) if self.private else dpa.NonPrivateDpEvent()


def _round(remaining: float, rho_grad: float, rho_select: float) -> tuple[float, float, bool]:
    """Budgets (gradient part, noisy-min part, is-last) of a round of nominal cost c.

    If less than 2c remains, this round is the last one and spends exactly what remains, split
    in the nominal ratio; otherwise it spends c and at least c is left.
    """
    cost = rho_grad + rho_select
    if remaining >= 2 * cost:
        return rho_grad, rho_select, False
    grad = remaining * (rho_grad / cost)
    return grad, remaining - grad, True


def _spend(remaining: float, rho: float) -> float:
    """What is left after spending ρ (an infinite, non-private budget stays infinite)."""
    return remaining if math.isinf(remaining) else remaining - rho


def _unit(vector: Tensor) -> Tensor:
    norm = vector.norm()
    return vector / norm if norm > 0 else torch.zeros_like(vector)


def _candidate_scores(oracle: Oracle, thetas: Tensor, indices: Tensor, obj_clip: float, n: float) -> Bounded:
    """u_k = Σ_i min(max(ℓ_i(θ_k), 0), C_obj) + n·r(θ_k): sensitivity C_obj
    (:func:`~dpopt.clipping.clip_loss_sums`; the regulariser r does not depend on the data)."""
    losses = oracle.per_record_loss(thetas, indices)
    regulariser = torch.stack([oracle.regulariser(theta) for theta in thetas])
    return clipping.clip_loss_sums(losses, obj_clip, public_offset=n * regulariser)


def from_params(params: DPAGDParams) -> DPAGD:
    """``dp-agd`` by name: ``clip``, ``obj_clip``, ``noise``."""
    return DPAGD(clip=params.clip, obj_clip=params.obj_clip, noise_multiplier=1.0, noise=noise_kind(params))
