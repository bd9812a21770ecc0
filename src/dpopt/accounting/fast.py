"""Every place where dpopt computes ε other than by calling dp_accounting's accountants, and why
each gives the same bound (or a tighter valid one) faster.

:mod:`dpopt.accounting.epsilon` calls two functions here, on events already translated into
dp_accounting's reading (:func:`dpopt.accounting.events.in_accountant_terms`): a multiplier z is
noise over a shift of 1 (add/remove-one), or over ±1, a distance of 2 (replace-one).

1. :func:`composed_gaussian_epsilon`, for compositions of plain (not subsampled) Gaussians only:
   ε(δ) in closed form where ``PLDAccountant`` would discretise. The privacy loss of a Gaussian
   mechanism is itself Gaussian and runs of them compose to one Gaussian mechanism (Dong, Roth and
   Su 2022, Cor. 2.3); δ(ε) is dp_accounting's own ``GaussianPrivacyLoss.get_delta_for_epsilon``,
   and the bisection returns the upper end of its bracket. Safe: the answer is ≥ the exact ε (to
   1e−12 relative); the PLD accountant's pessimistic estimate is ≥ it as well, only looser.
2. :func:`sampled_gaussians_pld`, for runs of (Poisson-subsampled) Gaussians: the PLD that
   ``PLDAccountant`` composes for the same (merged) runs, run by run as its ``_maybe_compose``
   does (k plain Gaussians as one of multiplier z/√k, k sampled steps as one step's PLD
   self-composed k times). Two departures, neither changing the PLD: a sampled step's PLD is
   cached (:func:`_sampled_gaussian_step`; a ledger is asked for ε at every logged step), and
   one step's PLD is built by :func:`gaussian_pld`, below.
3. :func:`gaussian_pld`: ``privacy_loss_distribution.from_gaussian_mechanism``'s PLD, only faster.
   dp_accounting's connect-the-dots construction evaluates the hockey-stick divergence
   δ(ε) = μ_upper(x_ε) − e^ε μ_lower(x_ε) on every grid point ε = k·h of the privacy-loss range,
   where x_ε is the inverse privacy loss. It inverts the privacy loss one ε at a time in Python
   (about 9,000 scalar calls on the 1e-3 grid for z ≈ 0.8, ~90 % of the time to build a step's
   PLD, and building it is most of a calibration step for runs of ≤ 10⁴ steps). Here the same
   inverse is evaluated over the whole array at once, with the same formulas and branches:

   * remove, rate q < 1: x = −Δ/2 − σ²/Δ · log(1 + (e^ε − 1)/q)   (for ε > log(1 − q));
   * add, rate q < 1:    x = Δ/2 − σ²/Δ · (−log(1 + (e^{−ε} − 1)/q))   (for ε < −log(1 − q));
   * q = 1 (add, remove): x = ∓Δ/2 − σ²ε/Δ;  replace-one, q = 1: x = −σ²ε/(2Δ).

   Everything else (tails, truncation, the pessimistic connect-the-dots PMF, subsampling's two
   adjacency directions) is dp_accounting's own code, reached through two of its private
   functions, ``privacy_loss_distribution._create_pld_pmf_from_monotone_privacy_loss`` and
   ``privacy_loss_distribution._pld_for_subsampled_mechanism`` (the reason dp-accounting is pinned
   exactly in ``pyproject.toml``; ``tests/test_dp_accounting_pin.py`` fails, naming them, when the
   installed version differs from the pin or lacks them). Replace-one with q < 1 (not produced by
   any dpopt sampler) keeps dp_accounting's scalar path. Safe: ``tests/test_gaussian_pld.py``
   checks the PMF and ε against ``from_gaussian_mechanism`` over noise multipliers, rates,
   relations and grids.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss


def composed_gaussian_epsilon(runs: Sequence[tuple[dpa.DpEvent, int]], delta: float,
                              relation: NeighboringRelation) -> float:
    """ε(δ) of a composition of plain (not subsampled) Gaussian mechanisms, exactly, as the PLD
    accountant reads the (translated) events.

    The privacy loss of a Gaussian mechanism of multiplier s is itself Gaussian, and k_i runs of
    multipliers s_i compose to the Gaussian mechanism of multiplier s = (Σ_i k_i / s_i²)^(−1/2)
    (Dong, Roth & Su 2022, Cor. 2.3). dp_accounting's PLD reads a replace-one multiplier
    against a distance of 2, so there s = z/2 (z the translated multiplier). δ(ε) is
    dp_accounting's closed form (``GaussianPrivacyLoss``, noise s against a shift of 1); ε(δ) is
    found by bisection on it to 1e−12 relative, above the root. This is the PLD accountant's
    answer without its discretisation, which on a single Gaussian of small s costs seconds per
    evaluation (DIFF2 and DP-GD calibrations).
    """
    halve = relation == NeighboringRelation.REPLACE_ONE
    s = math.fsum(count / (atom.noise_multiplier / (2 if halve else 1)) ** 2 for atom, count in runs) ** -0.5
    loss = GaussianPrivacyLoss(s, sensitivity=1.0)
    if loss.get_delta_for_epsilon(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while loss.get_delta_for_epsilon(hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if loss.get_delta_for_epsilon(mid) > delta else (lo, mid)
    return hi


def sampled_gaussians_pld(runs: Sequence[tuple[dpa.DpEvent, int]], relation: NeighboringRelation,
                          grid: float) -> pld_lib.PrivacyLossDistribution | None:
    """The PLD of runs of (Poisson-sampled) Gaussian events (translated: dp_accounting's
    reading), built as dp_accounting's PLDAccountant builds it, but reusing each sampled-Gaussian
    step's PLD across calls (a ledger is asked for ε at every logged step); None if any event is
    of another kind."""
    total = pld_lib.identity(grid)
    for atom, count in runs:  # merged: each distinct atom is composed once
        if isinstance(atom, dpa.GaussianDpEvent):
            part = gaussian_pld(atom.noise_multiplier / math.sqrt(count), grid, relation)
        elif isinstance(atom, dpa.PoissonSampledDpEvent) and isinstance(atom.event, dpa.GaussianDpEvent):
            if atom.sampling_probability == 0:
                continue
            part = _sampled_gaussian_step(atom.sampling_probability, atom.event.noise_multiplier, relation,
                                          grid).self_compose(count)
        else:
            return None
        total = total.compose(part)
    return total


@functools.lru_cache(maxsize=256)
def _sampled_gaussian_step(rate: float, noise_multiplier: float, relation: NeighboringRelation,
                           grid: float) -> pld_lib.PrivacyLossDistribution:
    return gaussian_pld(noise_multiplier, grid, relation, sampling_prob=rate)


#: dp_accounting's defaults for ``from_gaussian_mechanism``, kept identical.
LOG_MASS_TRUNCATION_BOUND = -50.0


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """log(a·e^b + c) for a > 0 > c (dp_accounting's ``common.log_a_times_exp_b_plus_c``, the
    branch subsampling uses), elementwise; log(a + c) where b = 0, as there."""
    d = b + np.log(a)
    out = d + np.log1p(-np.exp(np.log(-c) - d))
    logs: np.ndarray = np.where(b == 0, np.log(a + c), out)  # ndarray == 0 is typed Any
    return logs


class _VectorisedGaussianLoss(GaussianPrivacyLoss):  # type: ignore[misc]  # dp_accounting ships no types
    """``GaussianPrivacyLoss`` whose ``get_delta_for_epsilon`` inverts the privacy loss over an
    array of ε at once."""

    def _inverse_many(self, eps: np.ndarray) -> np.ndarray:
        s: float = self.sensitivity
        var: float = self.standard_deviation**2
        q: float = self.sampling_prob
        if self.adjacency_type == AdjacencyType.REPLACE:
            return -eps * var / s / 2
        if self.adjacency_type == AdjacencyType.REMOVE:
            if q == 1:
                return -0.5 * s - eps * var / s
            loss = _log_a_exp_b_plus_c(1 / q, eps, 1 - 1 / q)
            x = -0.5 * s - loss * var / s
            return np.where(np.isclose(eps, math.log(1 - q), rtol=1e-9, atol=0.0), math.inf, x)
        if q == 1:
            return s + (-0.5 * s - eps * var / s)
        loss = -_log_a_exp_b_plus_c(1 / q, -eps, 1 - 1 / q)
        x = s + (-0.5 * s - loss * var / s)
        return np.where(np.isclose(eps, -math.log(1 - q), rtol=1e-9, atol=0.0), -math.inf, x)

    def get_delta_for_epsilon(self, epsilon: float | np.ndarray) -> float | np.ndarray:
        vectorised = not (self.adjacency_type == AdjacencyType.REPLACE and self.sampling_prob != 1)
        if isinstance(epsilon, numbers.Number) or not vectorised:
            delta: float | np.ndarray = super().get_delta_for_epsilon(epsilon)
            return delta
        epsilons = np.asarray(epsilon, dtype=float)
        deltas = np.zeros_like(epsilons)
        q = self.sampling_prob
        if q == 1.0 or self.adjacency_type == AdjacencyType.REPLACE:
            inverse = np.full_like(epsilons, True, dtype=bool)
        elif self.adjacency_type == AdjacencyType.ADD:
            inverse = epsilons < -math.log1p(-q)  # δ = 0 beyond
        else:
            inverse = epsilons > math.log1p(-q)
            deltas[~inverse] = -np.expm1(epsilons[~inverse])
        x = self._inverse_many(epsilons[inverse])
        deltas[inverse] = self.mu_upper_cdf(x) - np.exp(epsilons[inverse] + self.mu_lower_log_cdf(x))
        clipped: np.ndarray = np.clip(deltas, 0, 1)
        return clipped


def gaussian_pld(noise_multiplier: float, grid: float, relation: NeighboringRelation,
                 sampling_prob: float = 1.0) -> pld_lib.PrivacyLossDistribution:
    """PLD of one Gaussian step of multiplier z (dp_accounting's reading, see the module
    docstring), Poisson-subsampled at rate ``sampling_prob``, on the value grid ``grid``:
    pessimistic, connect-the-dots, equal to ``from_gaussian_mechanism(z,
    value_discretization_interval=grid, sampling_prob=q, neighboring_relation=relation)``."""
    replace = relation == NeighboringRelation.REPLACE_ONE

    def single(adjacency: AdjacencyType) -> pld_pmf.PLDPmf:
        loss = _VectorisedGaussianLoss(noise_multiplier, sensitivity=1.0, pessimistic_estimate=True,
                                       log_mass_truncation_bound=LOG_MASS_TRUNCATION_BOUND,
                                       sampling_prob=sampling_prob, adjacency_type=adjacency)
        return pld_lib._create_pld_pmf_from_monotone_privacy_loss(
            loss, pessimistic_estimate=True, value_discretization_interval=grid, use_connect_dots=True)

    if replace:
        return pld_lib.PrivacyLossDistribution(single(AdjacencyType.REPLACE))
    return pld_lib._pld_for_subsampled_mechanism(single, sampling_prob)
