"""From the scores of runs on D and on D′ to a lower bound on ε, and the power of that bound.

A test "D or D′?" that thresholds a score has a false-positive rate α (a D run scored above the
threshold) and a false-negative rate β (a D′ run at or below it). Two kinds of bound:

* :class:`ClopperPearson` (non-parametric). (ε, δ)-DP forces α·e^ε + β ≥ 1 − δ and
  β·e^ε + α ≥ 1 − δ, so with upper confidence bounds ᾱ, β̄ on the rates
  ε ≥ max(ln((1 − δ − β̄)/ᾱ), ln((1 − δ − ᾱ)/β̄)). It assumes nothing about the mechanism; at
  small δ it needs rates near δ, so many runs, to say much.
* :class:`GaussianDP` (a fitted f-DP estimate; Nasr et al. 2023, "Tight Auditing of
  Differentially Private Machine Learning"). A μ-GDP mechanism has the trade-off curve
  β ≥ Φ(Φ⁻¹(1 − α) − μ), so μ ≥ Φ⁻¹(1 − ᾱ) − Φ⁻¹(β̄); the bound is the ε(δ) of that μ,
  ε_μ(δ) solving δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). It holds if the mechanism's privacy
  curve has the Gaussian shape (exactly for the Gaussian mechanism without sampling, closely
  for many subsampled steps), and it uses the whole curve, not only its tail: a few thousand
  runs resolve ε at δ = 1e−5.

ᾱ and β̄ are one-sided Clopper–Pearson bounds at level (1 − confidence)/2 each (a union bound),
so each bound holds with probability ≥ ``confidence``. The threshold (and the statistic, see
:mod:`dpopt.audit.statistics`) is chosen on the first half of each side's runs and the bound is
computed on the second half: choosing costs no confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, stats

from .. import _validate

_NORMAL = stats.norm


@overload
def clopper_pearson_upper(failures: float, trials: float, alpha: float) -> float: ...
@overload
def clopper_pearson_upper(failures: np.ndarray, trials: ArrayLike, alpha: float) -> np.ndarray: ...
def clopper_pearson_upper(failures: ArrayLike, trials: ArrayLike, alpha: float) -> float | np.ndarray:
    """One-sided upper confidence bound at level 1 − α on a binomial rate (element-wise)."""
    failures, trials = np.asarray(failures), np.asarray(trials)
    upper = stats.beta.ppf(1 - alpha, failures + 1, np.maximum(trials - failures, 1))
    upper = np.where(failures >= trials, 1.0, upper)
    return float(upper) if upper.ndim == 0 else upper


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth, Su 2019, Corollary 2.13)."""
    return float(_NORMAL.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + _NORMAL.logcdf(-epsilon / mu - mu / 2)))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The ε(δ) of μ-GDP (0 when μ-GDP is already (0, δ)-DP); ∞ for μ = ∞."""
    if mu <= 0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, high, xtol=1e-10))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP has ε(δ) = ``epsilon`` (the inverse of :func:`gaussian_epsilon`)."""
    high = 1.0
    while gaussian_epsilon(high, delta) < epsilon:
        high *= 2
    return float(optimize.brentq(lambda m: gaussian_epsilon(m, delta) - epsilon, 1e-9, high, xtol=1e-10))


class BoundKind(Protocol):
    """How two error-rate upper bounds become a lower bound on ε at δ: ``strength`` (element-wise,
    increasing in the bound, cheap: tests are compared by it) and ``epsilon`` of a strength."""

    @property
    def name(self) -> str: ...

    def strength(self, fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray: ...

    def epsilon(self, strength: float, delta: float) -> float: ...


@dataclass(frozen=True)
class ClopperPearson:
    """Non-parametric: max(0, ln((1−δ−β̄)/ᾱ), ln((1−δ−ᾱ)/β̄)), with ln(x/0) = ∞ for x > 0."""

    name: str = "clopper-pearson"

    def strength(self, fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            sides = [np.where(num > 0, np.log(np.maximum(num, 1e-300)) - np.log(den), 0.0)
                     for num, den in ((1 - delta - fnr, fpr), (1 - delta - fpr, fnr))]
        return np.maximum(0.0, np.maximum(*sides))

    def epsilon(self, strength: float, delta: float) -> float:
        return float(strength)


@dataclass(frozen=True)
class GaussianDP:
    """Fitted Gaussian-DP: ε_μ(δ) for μ = Φ⁻¹(1 − ᾱ) − Φ⁻¹(β̄) (symmetric in the two rates)."""

    name: str = "gaussian-dp"

    def strength(self, fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
        return np.maximum(0.0, _NORMAL.isf(fpr) - _NORMAL.ppf(fnr))

    def epsilon(self, strength: float, delta: float) -> float:
        return gaussian_epsilon(float(strength), delta)


KINDS: dict[str, BoundKind] = {kind.name: kind for kind in (ClopperPearson(), GaussianDP())}


@dataclass(frozen=True)
class Bound:
    """A lower bound on ε, the rate bounds it rests on, and the threshold of the test."""

    epsilon: float
    fpr: float
    fnr: float
    threshold: float


def _tests(kind: BoundKind, out: np.ndarray, inside: np.ndarray, thresholds: np.ndarray, delta: float,
           confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(strength, ᾱ, β̄) of the tests "score > threshold" for every threshold."""
    alpha = (1 - _validate.open_unit("confidence", confidence)) / 2
    false_pos = len(out) - np.searchsorted(np.sort(out), thresholds, side="right")
    false_neg = np.searchsorted(np.sort(inside), thresholds, side="right")
    fpr = clopper_pearson_upper(false_pos, len(out), alpha)
    fnr = clopper_pearson_upper(false_neg, len(inside), alpha)
    return kind.strength(np.atleast_1d(fpr), np.atleast_1d(fnr), delta), np.atleast_1d(fpr), np.atleast_1d(fnr)


def choose(kind: BoundKind, out: np.ndarray, inside: np.ndarray, delta: float, confidence: float) -> Bound:
    """The best test over thresholds on these scores (used on the selection half only): every
    score when few, else 1,000 quantiles of the pooled scores."""
    pooled = np.concatenate([out, inside])
    thresholds = np.unique(pooled if len(pooled) <= 1000 else np.quantile(pooled, np.linspace(0, 1, 1001)))
    strength, fpr, fnr = _tests(kind, out, inside, thresholds, delta, confidence)
    best = int(np.argmax(strength))
    return Bound(kind.epsilon(strength[best], delta), float(fpr[best]), float(fnr[best]), float(thresholds[best]))


def evaluate(kind: BoundKind, out: np.ndarray, inside: np.ndarray, threshold: float, delta: float,
             confidence: float) -> Bound:
    """The bound of one fixed test (threshold) on held-out scores."""
    strength, fpr, fnr = _tests(kind, out, inside, np.array([threshold]), delta, confidence)
    return Bound(kind.epsilon(strength[0], delta), float(fpr[0]), float(fnr[0]), threshold)


def lower_bound(kind: BoundKind, out: np.ndarray, inside: np.ndarray, delta: float, confidence: float,
                statistics: Callable[[np.ndarray, np.ndarray], Iterable[Callable[[np.ndarray], np.ndarray]]]
                = lambda out, inside: (lambda x: x,)) -> Bound:
    """The statistic (among ``statistics(first halves)``, a score per observation; default the
    observation itself) and its threshold chosen on the first halves of the observations on D
    (``out``) and D′ (``inside``), the bound computed on the second halves: the choice never sees
    the observations that bound it. Ties go to the first statistic."""
    h_out, h_in = len(out) // 2, len(inside) // 2
    best = None
    for score in statistics(out[:h_out], inside[:h_in]):
        picked = choose(kind, score(out[:h_out]), score(inside[:h_in]), delta, confidence)
        if best is None or picked.epsilon > best[1].epsilon:
            best = (score, picked)
    assert best is not None  # statistics() gave at least one statistic
    score, picked = best
    return evaluate(kind, score(out[h_out:]), score(inside[h_in:]), picked.threshold, delta, confidence)


def smallest_refutable_epsilon(kind: BoundKind, claimed: float, held_out: int, delta: float,
                               confidence: float) -> float:
    """The smallest true ε this audit refutes: the ε_μ(δ) of the least μ-GDP (Gaussian) mechanism
    whose audit with ``held_out`` scored runs per side, at its median outcome (error counts at
    their expected values, the best threshold), gives a lower bound above ``claimed``.

    It states the audit's power for Gaussian-shaped mechanisms: a pass means the true ε is
    probably below this number, not below the claim."""
    alpha = (1 - confidence) / 2
    thresholds = np.linspace(-3.0, 3.0, 601)

    def median_bound(mu: float) -> float:
        t = thresholds + mu / 2
        fpr = clopper_pearson_upper(np.round(held_out * _NORMAL.sf(t)), held_out, alpha)
        fnr = clopper_pearson_upper(np.round(held_out * _NORMAL.cdf(t - mu)), held_out, alpha)
        return kind.epsilon(float(np.max(kind.strength(fpr, fnr, delta))), delta)

    if math.isinf(claimed):
        return math.inf
    low = gaussian_mu(claimed, delta) if claimed > 0 else 1e-6
    high = 2 * low
    while median_bound(high) <= claimed:
        high *= 2
        if high > 1e3:
            return math.inf
    for _ in range(40):  # bisection on μ; the median bound grows with μ
        mid = (low + high) / 2
        low, high = (mid, high) if median_bound(mid) <= claimed else (low, mid)
    return gaussian_epsilon(high, delta)
