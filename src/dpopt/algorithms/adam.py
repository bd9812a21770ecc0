"""DP-AdamBC (Tang, Shpilevskiy, Lécuyer, AAAI 2024, arXiv 2312.14334): Adam on a private gradient,
its second moment corrected for the noise's variance.

A private gradient g̃_t carries noise of variance Φ_t per coordinate, so Adam's second moment v
estimates E[g²] + Φ: with DP noise the denominator √v̂ is mostly noise and the update is DP-SGD's
with a rescaled step. DP-AdamBC subtracts it, at step t ≥ 1:

    m_t = β1·m_{t−1} + (1 − β1)·g̃_t,        v_t = β2·v_{t−1} + (1 − β2)·g̃_t²
    φ_t = β2·φ_{t−1} + (1 − β2)·Φ_t          (the noise's share of E[v_t])
    m̂ = m_t/(1 − β1^t),   v̂ = v_t/(1 − β2^t),   φ̂ = φ_t/(1 − β2^t)
    θ_{t+1} = θ_t − lr·m̂ / (√max(v̂ − φ̂, γ) + eps)

For a constant Φ (DP-SGD: (zΔ/B)²) φ̂ = Φ and this is the paper's update θ − lr·m̂/√max(v̂ − Φ, γ')
(with eps = 0, the default: γ keeps the root away from 0; eps > 0 adds Adam's own); φ carries the
same correction when Φ_t changes from step to step (banded noise, adaptive clipping's C_t).

Privacy: g̃_t is a release and Φ_t a function of public quantities
(:class:`~dpopt.base.NoiseVariance`), so the update is post-processing: whatever Φ is subtracted
(even a wrong one) costs nothing. The run's event is the inner algorithm's.

Two ways to run it, one update (:func:`bias_corrected_step`): :class:`AdamBC` wraps a
:class:`~dpopt.base.Directed` algorithm for ``dpopt.run``/``fit`` (and ``optimizer="adambc"`` by
name); :class:`dpopt.optim.AdamBC` is a ``torch.optim`` optimizer for a loop of one's own
around :class:`dpopt.Private`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, mechanisms
from ..base import S, Algorithm, Batch, Directed, KeyedSampling, NoiseSource, NoiseVariance, Oracle, Sampler

if TYPE_CHECKING:
    from .params import Params


def bias_corrected_step(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, *, step: int, noise: float,
                        variance: float, lr: float, betas: tuple[float, float], eps: float, gamma: float) -> float:
    """Step ``step`` (t ≥ 1) of DP-AdamBC on ``param`` with the private gradient ``grad`` of noise
    variance ``variance`` (Φ_t per coordinate), in place on ``param``, ``m`` and ``v``; ``noise`` is
    φ_{t−1}. Returns φ_t. See the module docstring."""
    beta1, beta2 = betas
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    noise = beta2 * noise + (1 - beta2) * variance
    second = 1 - beta2**step
    denominator = (v / second).sub_(noise / second).clamp_(min=gamma).sqrt_()
    if eps:
        denominator.add_(eps)
    param.addcdiv_(m, denominator, value=-lr / (1 - beta1**step))
    return noise


def check(lr: float, betas: tuple[float, float], eps: float, gamma: float) -> None:
    """Valid hyper-parameters of the update: lr > 0, betas in [0, 1), eps ≥ 0, gamma > 0."""
    _validate.positive("lr", lr)
    if not (isinstance(betas, tuple) and len(betas) == 2 and all(isinstance(b, float) and 0 <= b < 1 for b in betas)):
        raise _validate.DpoptError(f"betas={betas!r} must be two floats in [0, 1)")
    _validate.non_negative("eps", eps)
    _validate.positive("gamma", gamma)


class AdamBCState(NamedTuple):
    inner: Any        # the inner algorithm's state; its θ is the iterate
    m: Tensor         # first moment
    v: Tensor         # second moment
    noise: float      # φ_t, the noise's share of v_t
    count: int  # type: ignore[assignment]  # t: the updates made (shadows tuple.count; the name is in checkpoints)

    @property
    def theta(self) -> Tensor:
        return self.inner.theta


@dataclass(frozen=True)
class AdamBC:
    """``inner`` (a :class:`~dpopt.base.Directed` algorithm stating its noise variance,
    :class:`~dpopt.base.NoiseVariance`) with DP-AdamBC's update instead of its own: each step runs
    the inner step (its batch, release and event) and moves θ_t by Adam on the inner's g̃_t. ``lr``,
    ``betas`` (β1, β2), ``eps`` and ``gamma`` (γ, the floor of the corrected second moment) are
    the update's. Its noise multipliers, samplers and planned event are the inner's
    (:class:`~dpopt.base.Wrapper`)."""

    inner: Any
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 0.0
    gamma: float = 1e-8
    _keyed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.inner, Directed) and isinstance(self.inner, NoiseVariance)):
            raise _validate.DpoptError(
                f"inner={self.inner!r} must be an algorithm whose update is θ − η·g̃ and whose g̃ has a "
                "stated noise variance (DP-SGD, DP-GD, RRPSGD, AClip): DP-AdamBC subtracts that variance")
        check(self.lr, self.betas, self.eps, self.gamma)
        object.__setattr__(self, "_keyed", isinstance(self.inner, KeyedSampling))

    # ------------------------------------------------------------------ the inner's privacy

    @property
    def NOISE_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 - the Algorithm protocol's name
        return self.inner.NOISE_FIELDS

    @property
    def noise_ratios(self) -> tuple[float, ...]:
        return self.inner.noise_ratios

    @property
    def noise(self) -> mechanisms.Noise:
        """The inner's kind of noise (the data-parallel check reads it)."""
        return self.inner.noise

    def around(self, inner: Algorithm[S]) -> AdamBC:
        return dataclasses.replace(self, inner=inner)

    def relation(self) -> dpa.NeighboringRelation:
        return self.inner.relation()

    def sampler(self, t: int, n: int) -> Sampler:
        return self.inner.sampler(t, n)

    def batch_sampler(self, state: AdamBCState, t: int, n: int) -> Sampler:
        return self.inner.batch_sampler(state.inner, t, n) if self._keyed else self.inner.sampler(t, n)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return self.inner.planned_event(n, steps)

    # ------------------------------------------------------------------ the update

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> AdamBCState:
        zeros = torch.zeros_like(theta0)
        return AdamBCState(self.inner.init(theta0, steps, gen), zeros, zeros.clone(), 0.0, 0)

    def step(self, state: AdamBCState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[AdamBCState, dpa.DpEvent]:
        inner, event = self.inner.step(state.inner, batch, oracle, source)
        theta, m, v = state.theta.clone(), state.m.clone(), state.v.clone()
        noise = bias_corrected_step(theta, self.inner.direction(inner), m, v, step=state.count + 1, noise=state.noise,
                                    variance=self.inner.release_variance(inner), lr=self.lr, betas=self.betas,
                                    eps=self.eps, gamma=self.gamma)
        return AdamBCState(self.inner.moved(inner, theta), m, v, noise, state.count + 1), event

    def direction(self, state: AdamBCState) -> Tensor:
        """The inner's g̃_t (what the update was made from)."""
        return self.inner.direction(state.inner)

    def release_variance(self, state: AdamBCState) -> float:
        return self.inner.release_variance(state.inner)

    def moved(self, state: AdamBCState, theta: Tensor) -> AdamBCState:
        return state._replace(inner=self.inner.moved(state.inner, theta))

    def output(self, state: AdamBCState) -> Tensor:
        return self.inner.output(state.inner)


def from_params(inner: Algorithm[S], params: Params) -> AdamBC:
    """``optimizer="adambc"`` by name: ``inner`` (built by its entry) with DP-AdamBC's update at step
    size ``params.lr`` and floor ``params.adam_gamma`` (betas and eps at their defaults)."""
    return AdamBC(inner, lr=params.lr, gamma=params.adam_gamma)
