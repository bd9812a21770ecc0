"""How many trials a private tuning runs: a random number K, secret, from one of the two families
whose repeat-and-select has a Rényi-DP bound (Papernot & Steinke 2022, "Hyperparameter tuning
with Renyi differential privacy", ICLR).

* :class:`Poisson`: P[K = k] = e^{−μ} μ^k / k!, k ≥ 0 (K = 0 happens: nothing is released).
* :class:`TruncatedNegativeBinomial` with shape η ≥ 0 and γ ∈ (0, 1]:
  P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Γ(k + η) / (Γ(η) k!) for k ≥ 1 (the negative binomial
  conditioned on K ≥ 1); η = 1 is the geometric P[K = k] = γ(1 − γ)^{k−1}, η = 0 the logarithmic
  P[K = k] = (1 − γ)^k / (k ln(1/γ)). γ is set by the mean μ = η(1 − γ) / (γ(1 − γ^η)).

If one trial is (λ, ε(λ))-RDP at every order λ, running K trials with independent randomness and
releasing only the best one is RDP with ε'(λ) = ε(λ) + (η + 1)(1 − 1/λ̂)ε(λ̂) + (η + 1) ln(1/γ)/λ̂
+ ln(μ)/(λ − 1) for any λ̂ (TNB, their Theorem 2; Poisson: Theorem 6). dp_accounting computes
it for ``RepeatAndSelectDpEvent(event, mean=μ, shape=η)`` (shape = ∞ for Poisson) with its RDP
accountant; :meth:`wrap` builds that event, the only place the selection's privacy is described.
The theorem needs K, and which trials are run, to stay secret: only the best trial is released,
never K (see :mod:`dpopt.tuning.select`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from dp_accounting import dp_event
from scipy import optimize, stats

from .. import _validate


class Trials(Protocol):
    """The distribution of the number of trials K (``str()``: its name and parameters in words)."""

    @property
    def mean(self) -> float: ...  # read-only: the distributions are frozen dataclasses

    @property
    def shape(self) -> float: ...

    def draw(self, rng: np.random.Generator) -> int: ...

    def pmf(self, k: int) -> float: ...

    def wrap(self, trial: dp_event.DpEvent) -> dp_event.DpEvent: ...


def _repeat_and_select(trial: dp_event.DpEvent, mean: float, shape: float) -> dp_event.DpEvent:
    return dp_event.RepeatAndSelectDpEvent(trial, mean, shape)


@dataclass(frozen=True)
class Poisson:
    """K ~ Poisson(``mean``), ``mean`` ≥ 1 (dp_accounting's bound needs it). K = 0 has probability
    e^{−mean}: the tuning then releases nothing (and still costs its ε)."""

    mean: float

    def __post_init__(self) -> None:
        if _validate.positive("mean", self.mean) < 1:
            raise _validate.DpoptError(f"mean={self.mean!r} must be >= 1 (the mean number of trials)")

    @property
    def shape(self) -> float:
        return math.inf

    def __str__(self) -> str:
        """In words, as the reports show it: ``Poisson (mean 3)``."""
        return f"Poisson (mean {self.mean:g})"

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.poisson(self.mean))

    def pmf(self, k: int) -> float:
        return float(stats.poisson.pmf(k, self.mean))

    def wrap(self, trial: dp_event.DpEvent) -> dp_event.DpEvent:
        """The event of the best of K ~ Poisson(mean) runs of ``trial``."""
        return _repeat_and_select(trial, self.mean, self.shape)


def tnb_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial (η = ``shape``): η(1 − γ)/(γ(1 − γ^η)), its limits
    1/γ at η = 1 and (1 − γ)/(γ ln(1/γ)) at η = 0; 1 at γ = 1."""
    if gamma >= 1:
        return 1.0
    if shape == 0:
        return (1 - gamma) / (gamma * -math.log(gamma))
    return shape * (1 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


@dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """K ≥ 1 from the truncated negative binomial with ``mean`` ≥ 1 and ``shape`` η ≥ 0 (η = 1:
    geometric; η = 0: logarithmic). A smaller η costs less privacy for the same mean but has a
    heavier tail (more trials now and then)."""

    mean: float
    shape: float = 1.0
    gamma: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if _validate.positive("mean", self.mean) < 1:
            raise _validate.DpoptError(f"mean={self.mean!r} must be >= 1 (the mean number of trials)")
        _validate.non_negative("shape", self.shape)
        gamma = 1.0 if self.mean == 1 else optimize.brentq(
            lambda g: tnb_mean(g, self.shape) - self.mean, 1e-300, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps)
        object.__setattr__(self, "gamma", gamma)

    def __str__(self) -> str:
        """In words, as the reports show it: ``truncated negative binomial (mean 3, shape 1)``."""
        return f"truncated negative binomial (mean {self.mean:g}, shape {self.shape:g})"

    def draw(self, rng: np.random.Generator) -> int:
        if self.gamma >= 1:
            return 1
        if self.shape == 0:
            return int(rng.logseries(1 - self.gamma))
        while True:  # the negative binomial NB(η, γ) conditioned on K >= 1, by rejection
            k = int(rng.negative_binomial(self.shape, self.gamma))
            if k >= 1:
                return k

    def pmf(self, k: int) -> float:
        if k < 1:
            return 0.0
        if self.gamma >= 1:
            return float(k == 1)
        if self.shape == 0:
            return float(stats.logser.pmf(k, 1 - self.gamma))
        return float(stats.nbinom.pmf(k, self.shape, self.gamma) / -math.expm1(self.shape * math.log(self.gamma)))

    def wrap(self, trial: dp_event.DpEvent) -> dp_event.DpEvent:
        """The event of the best of K runs of ``trial``. The mean given to the accountant is the
        larger of ``mean`` and the sampled distribution's exact mean (γ is found to rounding), so
        the bound, which grows with the mean, covers the distribution actually sampled."""
        return _repeat_and_select(trial, max(self.mean, tnb_mean(self.gamma, self.shape)), self.shape)


def trials_of(mean: float, shape: float) -> Trials:
    """Poisson(mean) for shape = ∞ (dp_accounting's convention), else the truncated negative binomial."""
    return Poisson(mean) if math.isinf(shape) else TruncatedNegativeBinomial(mean, shape)
