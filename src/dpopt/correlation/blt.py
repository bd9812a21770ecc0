"""Buffered linear Toeplitz (BLT) strategies (McMahan et al. 2024, arXiv 2408.08868; Dvijotham et
al. 2024, arXiv 2404.16706): a Toeplitz C that is not banded, whose C⁻¹z is generated online from
a few buffers.

C has first column c_0 = 1, c_j = Σ_i ω_i θ_i^{j−1} (j ≥ 1) for decays θ_i ∈ [0, 1) and weights
ω_i ≥ 0 with Σ_i ω_i ≤ 1, so its entries are non-negative and non-increasing. As a power series
C(x) = 1 + x Σ_i ω_i/(1 − θ_i x) = N(x)/Q(x), Q(x) = Π_i (1 − θ_i x); C⁻¹ is Q/N. Solving
C x = z step by step needs only the buffers s_i (t) = Σ_{j ≥ 1} θ_i^{j−1} x_{t−j}:

    x_t = z_t − Σ_i ω_i s_i(t),      s_i(t + 1) = θ_i s_i(t) + x_t,      s_i(0) = 0,

O(buffers·d) memory (:func:`dpopt.correlation.noise.buffered_gaussian`).

Privacy. C is not banded, so the amplification argument of banded strategies does not apply and
none is claimed. The batches are fixed and cyclic: m = ⌊n/B⌋ batches of B records of one public
random order, step t uses batch t mod m (``dpopt.sampling.SinglePass(n, (t mod m)·B, B, seed)``,
replace-one), so the record of batch j takes part exactly at the steps π_j = {j, j + m, …} < T.
The run is C·G + Z read through C⁻¹; the record moves C·G by Σ_{t∈π_j} C[:, t]·v_tᵀ with
‖v_t‖ ≤ Δ, whose Frobenius norm is at most Δ·‖C·1_{π_j}‖ because CᵀC ≥ 0 entrywise (the bound is
attained with all v_t equal), and ‖C·1_{π_j}‖ is largest at j = 0 (:meth:`BufferedToeplitz.
sensitivity`). The whole run is one Gaussian mechanism of multiplier z/sensitivity for adaptively
chosen gradients too (C lower-triangular: Denisov et al. 2022, arXiv 2202.08312).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, signal

from .. import _validate
from .strategy import PREFIX_SUMS, Workload, workload_error


def _polynomials(decays: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """N and Q of C(x) = N(x)/Q(x), coefficients in increasing powers."""
    q = np.array([1.0])
    for theta in decays:
        q = np.convolve(q, [1.0, -theta])
    n = np.concatenate((q, [0.0]))
    for i, omega in enumerate(weights):
        term = np.array([0.0, 1.0])  # x·Π_{j≠i}(1 − θ_j x)
        for j, theta in enumerate(decays):
            if j != i:
                term = np.convolve(term, [1.0, -theta])
        n[: len(term)] += omega * term
    return n, q


def _impulse(numerator: np.ndarray, denominator: np.ndarray, steps: int) -> np.ndarray:
    impulse = np.zeros(steps)
    impulse[0] = 1.0
    return signal.lfilter(numerator, denominator, impulse)


def cyclic_sensitivity(coefficients: np.ndarray, period: int) -> float:
    """‖C·1_{π_0}‖ for the Toeplitz C of first column ``coefficients`` (T terms) and the steps
    π_0 = {0, m, 2m, …} < T, m = ``period``: with F(s) = Σ_{i ≥ 0, im ≤ s} c_{s−im} (F(s) =
    c_s + F(s − m)), C·1_{π_j} is F shifted down by j and cut at T, so ‖C·1_{π_j}‖² =
    Σ_{s < T−j} F(s)², largest at j = 0."""
    comb = np.array(coefficients, dtype=float)
    for start in range(period, len(comb), period):
        block = slice(start, min(start + period, len(comb)))
        comb[block] += comb[start - period : block.stop - period]
    return math.sqrt(float(np.dot(comb, comb)))


@dataclass(frozen=True)
class BufferedToeplitz:
    """A BLT strategy by its ``decays`` θ_i ∈ [0, 1) and ``weights`` ω_i ≥ 0, Σ ω_i ≤ 1 (one
    buffer per pair); see the module docstring."""

    decays: tuple[float, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        theta, omega = self.decays, self.weights
        if not (isinstance(theta, tuple) and isinstance(omega, tuple) and len(theta) == len(omega) >= 1):
            raise _validate.DpoptError(f"decays={theta!r} and weights={omega!r} must be tuples of equal length >= 1")
        if not all(isinstance(v, float) and 0 <= v < 1 for v in theta):
            raise _validate.DpoptError(f"decays={theta!r} must be floats in [0, 1)")
        if not (all(isinstance(v, float) and v >= 0 for v in omega) and math.fsum(omega) <= 1):
            raise _validate.DpoptError(f"weights={omega!r} must be floats >= 0 with sum <= 1")

    @property
    def buffers(self) -> int:
        return len(self.decays)

    def coefficients(self, steps: int) -> np.ndarray:
        """c_0 … c_{T−1}: the first column of C over ``steps`` steps."""
        return _impulse(*_polynomials(np.array(self.decays), np.array(self.weights)), steps)

    def inverse_coefficients(self, steps: int) -> np.ndarray:
        """The first column of C⁻¹ over ``steps`` steps (Q/N)."""
        n, q = _polynomials(np.array(self.decays), np.array(self.weights))
        return _impulse(q, n, steps)

    def squared_error(self, steps: int, workload: Workload = PREFIX_SUMS) -> float:
        """‖A C⁻¹‖_F² over ``steps`` steps, per unit noise variance."""
        return workload_error(self.inverse_coefficients(steps), workload)

    def sensitivity(self, steps: int, period: int) -> float:
        """The L2 sensitivity factor of C when a record takes part at the steps j, j + m, … < T
        of its fixed cyclic batch (m = ``period``): max_j ‖C·1_{π_j}‖ = ‖C·1_{π_0}‖
        (:func:`cyclic_sensitivity`; exact because C ≥ 0 entrywise)."""
        _validate.positive_int("steps", steps)
        _validate.positive_int("period", period)
        return cyclic_sensitivity(self.coefficients(steps), period)

    @classmethod
    def optimal(cls, buffers: int, steps: int, period: int, workload: Workload = PREFIX_SUMS) -> BufferedToeplitz:
        """The BLT of ``buffers`` buffers with the least sensitivity² · ‖A C⁻¹‖_F² (the total squared
        error at a fixed ε) for ``steps`` steps and cyclic batches of period m; cached."""
        _validate.positive_int("buffers", buffers)
        _validate.positive_int("steps", steps)
        _validate.positive_int("period", period)
        return _optimal(buffers, steps, period, workload)


def _unpack(params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unconstrained parameters to (θ, ω): θ_i = sigmoid(a_i) ∈ (0, 1); ω_i = e^{b_i}/(1 + Σ e^{b_l})
    (positive, summing to < 1)."""
    half = len(params) // 2
    decays = 1 / (1 + np.exp(-params[:half]))
    spread = np.exp(params[half:])
    return decays, spread / (1 + spread.sum())


def _pack(decays: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.concatenate((np.log(decays / (1 - decays)), np.log(weights / (1 - weights.sum()))))


def _log_objective(params: np.ndarray, steps: int, period: int, workload: Workload) -> float:
    """log(sensitivity² · ‖A C⁻¹‖_F²); a wall where it overflows (C⁻¹ growing geometrically)."""
    decays, weights = _unpack(params)
    n, q = _polynomials(decays, weights)
    with np.errstate(over="ignore", invalid="ignore"):
        value = cyclic_sensitivity(_impulse(n, q, steps), period) ** 2 * workload_error(_impulse(q, n, steps), workload)
    return math.log(value) if math.isfinite(value) and value > 0 else 1e6


@functools.lru_cache(maxsize=32)
def _optimal(buffers: int, steps: int, period: int, workload: Workload) -> BufferedToeplitz:
    """By continuation (L-BFGS on the log objective, finite-difference gradients): one buffer of
    time scale √T, then each time the optimum so far plus one buffer, started at a negligible
    weight (so never worse than one buffer fewer) and at weight 0.05 with time scale 2 and T."""
    decays, weights = np.array([math.exp(-1 / math.sqrt(steps))]), np.array([0.5])
    starts = [(decays, weights)]
    for _ in range(buffers):
        found = min((optimize.minimize(_log_objective, _pack(*start), args=(steps, period, workload),
                                       method="L-BFGS-B") for start in starts), key=lambda result: result.fun)
        decays, weights = _unpack(found.x)
        starts = [(np.append(decays, decay), np.append(weights * (1 - weight), weight))
                  for decay, weight in ((float(decays[0]), 1e-6), (math.exp(-0.5), 0.05), (math.exp(-1 / steps), 0.05))]
    decays = np.minimum(decays, 1 - 2.0**-53)  # a decay of 1 − 1e-17 would round to 1
    return BufferedToeplitz(tuple(float(v) for v in decays), tuple(float(v) for v in weights))
