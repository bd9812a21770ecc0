"""The hyper-parameters of Theorems 3.1 (zeroth-order single pass), 4.1 (multi-pass) and 6.1
(first-order single pass) of Kornowski, Liu, Talwar, with every constant the paper hides set
explicitly (:class:`Constants`), and the baseline of Zhang et al. 2024 (Theorem 3.1's algorithm
with m = d directions).

Inputs: n records, dimension d, privacy (ε, δ), smoothing radius α, per-record Lipschitz
constant L, initial sub-optimality Φ (and the target β for the multi-pass theorem). Θ̃/Õ drop
poly-log factors: here they are 1 (``Constants`` multiplies each setting by a constant, 1 by
default). The noise multiplier is left at 1: :func:`dpopt.accounting.calibrate` sets it from the
algorithm's exact event (the theorems' σ formulas are never used to add noise).

Per-record clips (the sensitivity bounds of Lemmas 3.4 and 6.3, made unconditional), with c =
``Constants.concentration`` and ℓ = log(d·B/δ):

* zeroth order, period start: C1 = min(dL, L + c·dL·√(ℓ/m)): an estimate is a mean of m vectors of
  norm ≤ dL (|f(x+αy) − f(x−αy)| ≤ 2αL) concentrating around ∇f_α, of norm ≤ L;
* zeroth order, difference: C2 = min(2dL, 2D·L√d/α + 2c·dL·√(ℓ/m)): ∇f_α is (L√d/α)-Lipschitz and
  ‖z_t − z_{t−1}‖ ≤ 2D;
* first order: C1 = L (a gradient of an L-Lipschitz loss; never bites) and
  C2 = min(2L, 2D·L√d/α + 2c·L·√(ℓ/m)).

The step size is η = D/(L√M) (Proposition 2.6 with G1 = L, the oracle's noiseless second moment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import _validate
from .o2nc import O2NC, O2NCMulti


@dataclass(frozen=True)
class Constants:
    """The constants behind the theorems' Θ̃ and ≲ (all 1 by default), and a compute cap on m."""

    radius: float = 1.0          # D
    period: float = 1.0          # Σ
    directions: float = 1.0      # m
    concentration: float = 1.0   # c in the clip bounds
    max_directions: int = 4096   # m is min(theorem's m, this): the theorems' m is O(d²Σ²)


def _check(n: int, d: int, epsilon: float, delta: float, alpha: float, lipschitz: float, phi: float) -> None:
    _validate.positive_int("n", n)
    _validate.positive_int("d", d)
    _validate.positive("epsilon", epsilon)
    _validate.open_unit("delta", delta)
    _validate.positive("alpha", alpha)
    _validate.positive("lipschitz", lipschitz)
    _validate.positive("phi", phi)


def clips(estimator: str, d: int, lipschitz: float, radius: float, alpha: float, directions: int,
          batch: int, delta: float, concentration: float) -> tuple[float, float]:
    """(C1, C2): the per-record clips at a period start and of a difference (module docstring)."""
    L, log_term = lipschitz, math.sqrt(math.log(d * batch / delta) / directions)
    drift = 2 * radius * L * math.sqrt(d) / alpha
    if estimator == "zeroth":
        return (min(d * L, L + concentration * d * L * log_term),
                min(2 * d * L, drift + 2 * concentration * d * L * log_term))
    return L, min(2 * L, drift + 2 * concentration * L * log_term)


def single_pass(*, n: int, d: int, epsilon: float, delta: float, alpha: float, lipschitz: float, phi: float,
                estimator: str = "zeroth", directions: int | None = None,
                constants: Constants = Constants()) -> tuple[O2NC, int]:
    """Theorem 3.1 (``estimator="zeroth"``) or 6.1 ("first"): (algorithm, T). B1 = Σ, B2 = 1,
    T the most steps one pass over n records affords (≈ n/2),

        D = min{(Φ²α/(L²T²))^{1/3}, (Φαε/(dLT))^{1/2}, (Φ³α²ε/(d^{3/2}L³T³))^{1/5}, (Φ²α/(L²T²d))^{1/3}},
        M = ⌊α/4D⌋,  Σ = ⌈(α/εD)^{2/3} + α/(D√d)⌉,
        m = ⌈d²B1² + dα²B2²/D²⌉ (zeroth) or ⌈B2²α²/(D²d)⌉ (first), capped at ``max_directions``;

    ``directions`` overrides m (Zhang et al.'s baseline: m = d)."""
    _check(n, d, epsilon, delta, alpha, lipschitz, phi)
    L, c = lipschitz, constants

    def settings(T: int) -> tuple[float, int, int]:
        """(D, Σ, records used) for T steps."""
        radius = c.radius * min((phi**2 * alpha / (L**2 * T**2)) ** (1 / 3),
                                (phi * alpha * epsilon / (d * L * T)) ** 0.5,
                                (phi**3 * alpha**2 * epsilon / (d**1.5 * L**3 * T**3)) ** 0.2,
                                (phi**2 * alpha / (L**2 * T**2 * d)) ** (1 / 3))
        period = max(1, math.ceil(c.period * ((alpha / (epsilon * radius)) ** (2 / 3) + alpha / (radius * d**0.5))))
        starts = -(-T // period)
        return radius, period, starts * period + (T - starts)

    lo, hi = 1, n  # records used grow with T (D shrinks, Σ grows): the largest T that fits n
    if settings(1)[2] > n:
        raise _validate.DpoptError(f"n={n} records cannot fill one period of these settings")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if settings(mid)[2] <= n else (lo, mid - 1)
    steps = lo
    radius, period, _ = settings(steps)
    if directions is None:
        raw = d**2 * period**2 + d * alpha**2 / radius**2 if estimator == "zeroth" else alpha**2 / (radius**2 * d)
        directions = max(1, min(c.max_directions, math.ceil(c.directions * raw)))
    window = max(1, min(steps, math.floor(alpha / (4 * radius))))
    clip0, clip = clips(estimator, d, L, radius, alpha, directions, period if estimator == "zeroth" else 1, delta,
                        c.concentration)
    algo = O2NC(lr=radius / (L * math.sqrt(window)), radius=radius, window=window, alpha=alpha, period=period,
                clip0=clip0, clip=clip, noise_multiplier=1.0, estimator=estimator, directions=directions,
                batch_size0=period, batch_size=1)
    return algo, steps


def zhang2024(*, n: int, d: int, epsilon: float, delta: float, alpha: float, lipschitz: float, phi: float,
              constants: Constants = Constants()) -> tuple[O2NC, int]:
    """The baseline of Zhang et al. 2024: the zeroth-order single pass with m = d directions, so
    the per-record estimate's concentration term (and the clip C1) is of order L√d, not L."""
    return single_pass(n=n, d=d, epsilon=epsilon, delta=delta, alpha=alpha, lipschitz=lipschitz, phi=phi,
                       estimator="zeroth", directions=d, constants=constants)


def multi_pass(*, n: int, d: int, epsilon: float, delta: float, alpha: float, beta: float, lipschitz: float,
               phi: float, max_steps: int | None = None, constants: Constants = Constants()) -> tuple[O2NCMulti, int]:
    """Theorem 4.1 (zeroth order, every record every step): (algorithm, T) with

        D = αβ²/L²,  T = ΦL²/(αβ³) (= Φ/(Dβ)),  Σ = ⌈α/(D√d)⌉,  M = ⌊α/4D⌋,
        σ1 = L√(T log(1/δ)/Σ)/(nε),  σ2 = LD√(T d log(1/δ))/(αnε),  m = ⌈L²dΣ/(nσ1²) + L²d/(nσ2²)⌉;

    the paper prints D = α²β²/L², which is not a length (α, D are lengths; β, L gradients) and
    contradicts Proposition 2.6 (3G1/2√M ≤ β needs D ≲ αβ²/L²): we use αβ²/L². σ1/σ2 fixes the
    ratio of the two noise multipliers (σ/(2C)·n each), whose common scale is calibrated.
    ``max_steps`` caps T (compute)."""
    _check(n, d, epsilon, delta, alpha, lipschitz, phi)
    _validate.positive("beta", beta)
    L, c = lipschitz, constants
    radius = c.radius * alpha * beta**2 / L**2
    steps = max(1, math.ceil(phi / (radius * beta)))
    if max_steps is not None:
        steps = min(steps, _validate.positive_int("max_steps", max_steps))
    period = max(1, math.ceil(c.period * alpha / (radius * math.sqrt(d))))
    log_inv = math.log(1 / delta)
    sigma1 = L * math.sqrt(steps * log_inv / period) / (n * epsilon)
    sigma2 = L * radius * math.sqrt(steps * d * log_inv) / (alpha * n * epsilon)
    raw = L**2 * d * period / (n * sigma1**2) + L**2 * d / (n * sigma2**2)
    directions = max(1, min(c.max_directions, math.ceil(c.directions * raw)))
    window = max(1, min(steps, math.floor(alpha / (4 * radius))))
    clip0, clip = clips("zeroth", d, L, radius, alpha, directions, n, delta, c.concentration)
    ratio = (sigma1 / (2 * clip0)) / (sigma2 / (2 * clip))
    algo = O2NCMulti(lr=radius / (L * math.sqrt(window)), radius=radius, window=window, alpha=alpha, period=period,
                     clip0=clip0, clip=clip, noise_multiplier=1.0, noise_multiplier0=ratio, estimator="zeroth",
                     directions=directions)
    return algo, steps
