"""The privacy loss distribution (PLD) of a (Poisson-subsampled) Gaussian step, built as
``dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism`` builds it, only faster.

dp_accounting's connect-the-dots construction evaluates the hockey-stick divergence
δ(ε) = μ_upper(x_ε) − e^ε μ_lower(x_ε) on every grid point ε = k·h of the privacy-loss range,
where x_ε is the inverse privacy loss. It inverts the privacy loss one ε at a time in Python
(about 9,000 scalar calls on the 1e-3 grid for z ≈ 0.8, ~90 % of the time to build a step's
PLD, and building it is most of a calibration step for runs of ≤ 10⁴ steps). Here the same
inverse is evaluated over the whole array at once, with the same formulas and branches:

* remove, rate q < 1: x = −Δ/2 − σ²/Δ · log(1 + (e^ε − 1)/q)   (for ε > log(1 − q));
* add, rate q < 1:    x = Δ/2 − σ²/Δ · (−log(1 + (e^{−ε} − 1)/q))   (for ε < −log(1 − q));
* q = 1 (add, remove): x = ∓Δ/2 − σ²ε/Δ;  replace-one, q = 1: x = −σ²ε/(2Δ).

The multiplier is read as dp_accounting reads a ``GaussianDpEvent``: noise over a shift of 1
(add/remove-one), or over ±1, a distance of 2 (replace-one). dpopt's own convention (noise over
the distance between neighbouring outputs under every relation) is translated into this reading
in one place, :func:`dpopt.accounting.in_accountant_terms`, before any PLD is built.

Everything else (tails, truncation, the pessimistic connect-the-dots PMF, subsampling's two
adjacency directions) is dp_accounting's own code. Replace-one with q < 1 (not produced by any
dpopt sampler) keeps dp_accounting's scalar path. ``tests/test_gaussian_pld.py`` checks the
result against ``from_gaussian_mechanism`` over noise multipliers, rates, relations and grids.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss

#: dp_accounting's defaults for ``from_gaussian_mechanism``, kept identical.
LOG_MASS_TRUNCATION_BOUND = -50.0


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """log(a·e^b + c) for a > 0 > c (dp_accounting's ``common.log_a_times_exp_b_plus_c``, the
    branch subsampling uses), elementwise; log(a + c) where b = 0, as there."""
    d = b + np.log(a)
    out = d + np.log1p(-np.exp(np.log(-c) - d))
    return np.where(b == 0, np.log(a + c), out)


class _VectorisedGaussianLoss(GaussianPrivacyLoss):
    """``GaussianPrivacyLoss`` whose ``get_delta_for_epsilon`` inverts the privacy loss over an
    array of ε at once."""

    def _inverse_many(self, eps: np.ndarray) -> np.ndarray:
        s, var, q = self.sensitivity, self._standard_deviation**2, self.sampling_prob
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
            return super().get_delta_for_epsilon(epsilon)
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
        return np.clip(deltas, 0, 1)


def gaussian_pld(noise_multiplier: float, grid: float, relation: NeighboringRelation,
                 sampling_prob: float = 1.0) -> pld_lib.PrivacyLossDistribution:
    """PLD of one Gaussian step of multiplier z (dp_accounting's reading, see the module
    docstring), Poisson-subsampled at rate ``sampling_prob``, on the value grid ``grid``:
    pessimistic, connect-the-dots, equal to ``from_gaussian_mechanism(z,
    value_discretization_interval=grid, sampling_prob=q, neighboring_relation=relation)``."""
    replace = relation == NeighboringRelation.REPLACE_ONE

    def single(adjacency: AdjacencyType) -> pld_lib.pld_pmf.PLDPmf:
        loss = _VectorisedGaussianLoss(noise_multiplier, sensitivity=1.0, pessimistic_estimate=True,
                                       log_mass_truncation_bound=LOG_MASS_TRUNCATION_BOUND,
                                       sampling_prob=sampling_prob, adjacency_type=adjacency)
        return pld_lib._create_pld_pmf_from_monotone_privacy_loss(
            loss, pessimistic_estimate=True, value_discretization_interval=grid, use_connect_dots=True)

    if replace:
        return pld_lib.PrivacyLossDistribution(single(AdjacencyType.REPLACE))
    return pld_lib._pld_for_subsampled_mechanism(single, sampling_prob)
