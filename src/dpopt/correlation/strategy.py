"""Banded Toeplitz strategies: the matrix C of a correlated-noise release, and its error.

A strategy is the lower-triangular Toeplitz matrix C with first column (c_0, …, c_{b−1}, 0, …):
b bands, ``c_0 > 0``, unit column norm (Σ_j c_j² = 1). The release adds x = C⁻¹z to the gradient
sums g (z i.i.d. Gaussian), i.e. it is C·g + z read through C⁻¹, and C⁻¹ is the lower-triangular
Toeplitz matrix of the power series d(x) = 1/c(x) truncated to T terms:

    d_0 = 1/c_0,   d_m = −(Σ_{j=1}^{min(m, b−1)} c_j d_{m−j}) / c_0.

The error of a strategy is measured on a **workload** A (lower-triangular Toeplitz: what the
training loop makes of the noise): θ_t − θ_t(noiseless) = −η·(A x)_t. Its total squared error per
unit noise variance is ‖A C⁻¹‖_F² = Σ_{m=0}^{T−1} (T − m)·e_m² with e = a·d the product series
(A C⁻¹ is Toeplitz, its m-th diagonal e_m appears T − m times). Every series here is a rational
function, so all of them are computed as linear recurrences (``scipy.signal.lfilter``) in
O(T·b).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, signal

from .. import _validate


@dataclass(frozen=True)
class Workload:
    """SGD with momentum β (β = 0: plain SGD, the prefix sums): m_t = β·m_{t−1} + x_t,
    θ_{t+1} = θ_t − η·m_t, so the noise reaches θ through the series a(x) = 1/((1 − x)(1 − βx)):
    a_m = (1 − β^{m+1})/(1 − β), a_m = 1 for β = 0."""

    momentum: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise _validate.DpoptError(f"momentum={self.momentum!r} must be in [0, 1)")

    def apply(self, series: np.ndarray) -> np.ndarray:
        """a·``series``: A applied to a vector (the first T terms of the product series)."""
        beta = self.momentum
        return signal.lfilter([1.0], [1.0, -(1.0 + beta), beta], series)


PREFIX_SUMS = Workload(0.0)


def inverse_series(coefficients: np.ndarray, steps: int) -> np.ndarray:
    """The first ``steps`` terms of 1/c(x): the first column of C⁻¹ (the recursion above)."""
    impulse = np.zeros(steps)
    impulse[0] = 1.0
    return signal.lfilter([1.0], coefficients, impulse)


def workload_error(inverse: np.ndarray, workload: Workload = PREFIX_SUMS) -> float:
    """‖A C⁻¹‖_F² for the lower-triangular Toeplitz C⁻¹ of first column ``inverse`` (T terms):
    Σ_m (T − m)·e_m², e = a·d."""
    e = workload.apply(inverse)
    return float(np.dot(np.arange(len(e), 0, -1, dtype=float), e * e))


def squared_error(coefficients: np.ndarray, steps: int, workload: Workload = PREFIX_SUMS) -> float:
    """‖A C⁻¹‖_F² over ``steps`` steps for the strategy with first column ``coefficients``:
    the total squared error of the workload's noise per unit noise variance and coordinate."""
    return workload_error(inverse_series(np.asarray(coefficients, float), steps), workload)


def banded_square_root(bands: int) -> np.ndarray:
    """The first ``bands`` coefficients of (1 − x)^{−1/2}, binom(2j, j)/4^j, normalised to unit
    norm: the banded square root of the prefix-sum matrix (Kalinin & Lampert 2024)."""
    c = np.ones(bands)
    for j in range(1, bands):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c / np.linalg.norm(c)


def _error_and_gradient(free: np.ndarray, steps: int, workload: Workload) -> tuple[float, np.ndarray]:
    """L(c) = ‖A C⁻¹‖_F² at c = u/‖u‖, u = (1, ``free``), and its gradient in ``free``.

    In power series, ∂(1/c)/∂c_j = −x^j/c², so ∂e/∂c_j = −x^j·a·d² and
    ∂L/∂c_j = −2 Σ_{m ≥ j} r_m·p_{m−j} with r_m = (T − m)·e_m and p = a·d² (d² = d/c: one more
    recursion). The normalisation c = u/‖u‖ maps a gradient g in c to
    (g − c·⟨c, g⟩)/‖u‖ in u.
    """
    u = np.concatenate(([1.0], free))
    norm = np.linalg.norm(u)
    c = u / norm
    d = inverse_series(c, steps)
    e = workload.apply(d)
    r = np.arange(steps, 0, -1, dtype=float) * e
    p = workload.apply(signal.lfilter([1.0], c, d))
    grad_c = np.array([-2.0 * np.dot(r[j:], p[: steps - j]) for j in range(len(c))])
    grad_u = (grad_c - c * np.dot(c, grad_c)) / norm
    return float(np.dot(r, e)), grad_u[1:]


def unit_norm(coefficients: np.ndarray) -> tuple[float, ...]:
    """``coefficients`` scaled to Σ c_j² ≤ 1 within one rounding (never above: the column norm
    is the release's sensitivity factor)."""
    c = np.asarray(coefficients, float) / np.linalg.norm(coefficients)
    while math.fsum(float(v) ** 2 for v in c) > 1.0:
        c = c * (1.0 - 2.0**-52)
    return tuple(float(v) for v in c)


_WALL = 1e6  #: log L where L overflows float64 (log L ≤ 710 elsewhere)


@functools.lru_cache(maxsize=64)
def _optimal(bands: int, steps: int, workload: Workload) -> tuple[float, ...]:
    """The coefficients of :meth:`BandedToeplitz.optimal` (cached: a pure function of its arguments)."""
    if bands == 1:
        return (1.0,)
    start = banded_square_root(bands)

    def objective(free: np.ndarray) -> tuple[float, np.ndarray]:
        # log L: finite and informative where L is huge (c(x) with a root near the unit disc);
        # where L overflows (a root inside it: C⁻¹ grows geometrically) a wall the line search backs off
        with np.errstate(over="ignore", invalid="ignore"):
            value, grad = _error_and_gradient(free, steps, workload)
        if not (math.isfinite(value) and value > 0 and np.all(np.isfinite(grad))):
            return _WALL, np.zeros_like(free)
        return math.log(value), grad / value

    found = optimize.minimize(objective, start[1:] / start[0], jac=True, method="L-BFGS-B",
                              options={"maxiter": 1000, "ftol": 1e-15, "gtol": 1e-10})
    candidates = [unit_norm(np.concatenate(([1.0], found.x))), unit_norm(start)]  # never worse than the closed form
    return min(candidates, key=lambda c: squared_error(np.array(c), steps, workload))


@dataclass(frozen=True)
class BandedToeplitz:
    """A b-banded lower-triangular Toeplitz strategy C, by its first column ``coefficients``
    (c_0, …, c_{b−1}): c_0 > 0 and unit column norm, Σ c_j² ≤ 1 (at most one rounding below 1).

    A column of C holds (c_0, …, c_{b−1}) (truncated at the last step), so one record's clipped
    gradient, of norm ≤ Δ, moves C·g by at most Δ in one step's column, and the columns of two
    steps at least b apart have disjoint supports: the two facts the amplification argument of
    :func:`dpopt.correlation.events.banded_event` rests on. b = 1 is C = I (DP-SGD).
    """

    coefficients: tuple[float, ...]

    def __post_init__(self) -> None:
        c = self.coefficients
        if not (isinstance(c, tuple) and c and all(isinstance(v, float) and math.isfinite(v) for v in c)):
            raise _validate.DpoptError(f"coefficients={c!r} must be a non-empty tuple of finite floats")
        if not c[0] > 0:
            raise _validate.DpoptError(f"coefficients={c!r} must have c_0 > 0")
        total = math.fsum(v * v for v in c)
        if not 1.0 - 1e-12 <= total <= 1.0:
            raise _validate.DpoptError(f"coefficients={c!r} must have unit column norm (sum of squares {total!r})")

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    @classmethod
    def optimal(cls, bands: int, steps: int, workload: Workload = PREFIX_SUMS) -> BandedToeplitz:
        """The b-banded strategy of least ‖A C⁻¹‖_F² over ``steps`` steps for ``workload``:
        the b − 1 free coefficients optimised in float64 by L-BFGS from the banded square root
        (:func:`banded_square_root`), never worse than it; cached. b = 1 is exactly (1.0,)."""
        _validate.positive_int("steps", steps)
        _validate.positive_int("bands", bands, maximum=steps, maximum_name="steps")
        return cls(_optimal(bands, steps, workload))

    @classmethod
    def square_root(cls, bands: int) -> BandedToeplitz:
        """The closed form :func:`banded_square_root` (no optimisation)."""
        _validate.positive_int("bands", bands)
        return cls(unit_norm(banded_square_root(bands)))

    def squared_error(self, steps: int, workload: Workload = PREFIX_SUMS) -> float:
        """‖A C⁻¹‖_F² over ``steps`` steps (:func:`squared_error`)."""
        return squared_error(np.array(self.coefficients), steps, workload)
