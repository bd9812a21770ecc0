"""Noise calibration: the smallest noise scale whose planned event meets a target (ε, δ).

:func:`solve_noise` finds the scale of any event family by root finding on ε, as
:func:`~dpopt.accounting.epsilon.epsilon_of` (the ledger's own ε) computes it; :func:`calibrate`
applies it to an algorithm's ``planned_event(n, steps)`` through :func:`scaled`, so the event
that sets the noise is the event the ledger must equal after the run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import dp_accounting as dpa
from dp_accounting import NeighboringRelation
from scipy import optimize, special

from .. import _validate
from ..base import S, Algorithm, Wrapper
from .epsilon import COARSE_DISCRETIZATION, FINEST_DISCRETIZATION, accountant_for, epsilon_of, ledger_grid
from .events import one_release


def _root(gap: Callable[[float], float], start: float, accept: float) -> float:
    """Smallest s with ``gap(s)`` in [accept, 0] for a decreasing ``gap`` (log ε − log target).

    Secant steps on log s aimed at the middle of the band, safeguarded by a bracket once one
    is known (Illinois false position: the stale end's value is halved when the same end
    moves twice in a row).
    """
    lo = hi = None  # gap(lo) > 0 >= gap(hi)
    f_lo = f_hi = 0.0
    scale, f = start, gap(start)
    previous: tuple[float, float] | None = None
    side = 0
    for _ in range(100):
        moved = -1 if f > 0 else 1
        if moved == -1:
            lo, f_lo = scale, f
            if side == -1 and hi is not None:
                f_hi /= 2
        else:
            hi, f_hi = scale, f
            if side == 1 and lo is not None:
                f_lo /= 2
        side = moved
        if hi is not None and f_hi >= accept:
            return hi
        if lo is not None and hi is not None:
            if hi / lo < 1 + 1e-4:  # ε moves < 0.1 % across the bracket: more steps only oscillate
                return hi
            new = (math.exp(math.log(hi) - f_hi * math.log(hi / lo) / (f_hi - f_lo))
                   if math.isfinite(f_lo) and math.isfinite(f_hi) else math.sqrt(lo * hi))
            new = min(max(new, lo * (1 + 1e-9)), hi * (1 - 1e-9))
        else:
            slope = (f - previous[1]) / math.log(scale / previous[0]) if previous and math.isfinite(f) else -1.0
            aim = f - accept / 2  # the middle of the accepted band, so one side cannot creep in forever
            # less noise is costlier to account (a wider privacy-loss range): halve at most
            new = scale * math.exp(min(2.0, max(-0.7, -aim / slope if slope < 0 else -aim)))
            if not math.isfinite(new) or new == scale:
                new = scale * (2.0 if f > 0 else 0.5)
        if not 1e-8 < new < 1e8:
            raise _validate.DpoptError("no noise multiplier in [1e-8, 1e8] reaches the target epsilon")
        previous = (scale, f)
        scale, f = new, gap(new)
    raise _validate.DpoptError("noise calibration did not converge")


def _gdp_mu_squared(event: dpa.DpEvent) -> float | None:
    """μ² of the central-limit Gaussian-DP approximation of ``event`` (Dong, Roth and Su 2022):
    1/z² for a Gaussian step, q²(e^{1/z²} − 1) for a Poisson-sampled one, summed over a
    composition. None for any other kind of event. Only a starting point for :func:`solve_noise`."""
    if isinstance(event, dpa.GaussianDpEvent):
        return 1 / event.noise_multiplier**2 if event.noise_multiplier > 0 else math.inf
    inner = one_release(event.event) if isinstance(event, dpa.PoissonSampledDpEvent) else None
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(inner, dpa.GaussianDpEvent):
        z = inner.noise_multiplier
        return event.sampling_probability**2 * math.expm1(min(1 / z**2, 700.0)) if z > 0 else math.inf
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = _gdp_mu_squared(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [part for sub in event.events if (part := _gdp_mu_squared(sub)) is not None]
        return sum(parts) if len(parts) == len(event.events) else None
    return None


def _gdp_start(event_of: Callable[[float], dpa.DpEvent], epsilon: float, delta: float) -> float:
    """A noise scale whose Gaussian-DP approximation is (ε, δ)-DP, or 1.0 where the events are
    not Gaussian: the bisection's first guess (within a few per cent for long runs)."""
    if _gdp_mu_squared(event_of(1.0)) is None:
        return 1.0

    def delta_of(mu: float) -> float:  # δ(ε) of μ-GDP
        return float(special.ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon) * special.ndtr(-epsilon / mu - mu / 2))

    def excess(log_scale: float) -> float:
        mu_squared = _gdp_mu_squared(event_of(math.exp(log_scale)))
        assert mu_squared is not None  # the family's events are Gaussian at every scale, as at 1.0
        return math.log(mu_squared) - 2 * math.log(mu)

    try:
        mu = optimize.brentq(lambda m: delta_of(m) - delta, 1e-6, 50.0)
        return math.exp(optimize.brentq(excess, math.log(1e-4), math.log(1e5), xtol=1e-4))
    except (ValueError, OverflowError, ZeroDivisionError):
        return 1.0


def solve_noise(event_of: Callable[[float], dpa.DpEvent], *, epsilon: float, delta: float,
                relation: NeighboringRelation, accountant: str = "pld",
                tolerance: float = 0.005, grid: float | None = None) -> tuple[float, float]:
    """The smallest noise scale s (to ``tolerance``) with ε(event_of(s)) ≤ ``epsilon``.

    ε is decreasing in s. The search starts at the Gaussian-DP (central limit) approximation's
    answer (:func:`_gdp_start`) and runs on the PLD grid the ledger picks near the answer
    (:func:`ledger_grid`), so every evaluation is one the ledger would make; the answer is then
    checked with :func:`epsilon_of` exactly as the ledger computes it and nudged up until it
    passes. Achieved ε ≤ ``epsilon`` and ≥ (1 − 2·tolerance)·``epsilon``. Returns ``(s, achieved ε)``.
    An ``epsilon`` above :data:`~dpopt._validate.IMPLAUSIBLE_EPSILON` is solved for, with a warning.

    ``grid``: a PLD grid for every evaluation and the final check instead of the ledger's (for a
    number reported to more digits than the ledger's grid resolves, e.g. ``tolerance=1e-4`` with
    ``grid=1e-4``: PLD on any grid is an upper bound on ε, finer grids are tighter). A training run
    keeps the default, so that its ledger, on its own grid, meets the target.
    """
    _validate.positive("epsilon", epsilon)
    _validate.plausible_epsilon(epsilon)
    _validate.open_unit("delta", delta)
    if not 0 < tolerance < 0.5:
        raise _validate.DpoptError(f"tolerance={tolerance!r} must be in (0, 0.5)")
    if grid is not None and not FINEST_DISCRETIZATION <= grid <= COARSE_DISCRETIZATION:
        raise _validate.DpoptError(f"grid={grid!r} must be in [{FINEST_DISCRETIZATION}, {COARSE_DISCRETIZATION}]")
    kind = accountant_for(event_of(1.0), relation, accountant)
    accept = math.log(1 - tolerance)

    def gap_on(grid: float | None) -> Callable[[float], float]:
        def gap(scale: float) -> float:
            eps = epsilon_of(event_of(scale), delta, relation, kind, grid)
            return math.log(eps / epsilon) if eps > 0 else -math.inf
        return gap

    scale = _gdp_start(event_of, epsilon, delta)
    if kind == "rdp" or grid is not None:
        scale = _root(gap_on(grid if kind == "pld" else None), scale, accept)
    else:  # on the grid the ledger picks near the answer (it changes by half decades, rarely twice)
        picked = None
        for _ in range(3):
            wanted = ledger_grid(event_of(scale), delta, relation)
            if wanted == picked:
                break
            picked = wanted
            scale = _root(gap_on(picked), scale, accept)
    final = grid if kind == "pld" else None
    achieved = epsilon_of(event_of(scale), delta, relation, kind, final)
    while achieved > epsilon:
        scale *= 1 + tolerance / 2
        achieved = epsilon_of(event_of(scale), delta, relation, kind, final)
    return scale, achieved


def noise_of(algorithm: Algorithm[S]) -> dict[str, float]:
    """The noise multipliers of ``algorithm`` by field (``NOISE_FIELDS``; a wrapper's are its inner
    algorithm's, :class:`dpopt.base.Wrapper`)."""
    if isinstance(algorithm, Wrapper):
        return noise_of(algorithm.inner)
    return {field: getattr(algorithm, field) for field in algorithm.NOISE_FIELDS}


def with_noise(algorithm: Algorithm[S], noise: Mapping[str, float]) -> Algorithm[S]:
    """A copy of ``algorithm`` with the noise multipliers ``noise`` (by field, as :func:`noise_of`
    gives them); a wrapper around the inner algorithm so changed."""
    if isinstance(algorithm, Wrapper):
        return algorithm.around(with_noise(algorithm.inner, noise))
    return dataclasses.replace(algorithm, **noise)


def scaled(algorithm: Algorithm[S], scale: float, ratios: Sequence[float] | None = None) -> Algorithm[S]:
    """A copy of ``algorithm`` with noise multipliers ``scale · ratios`` (fields ``NOISE_FIELDS``;
    a wrapper's, its inner algorithm's)."""
    fields = tuple(noise_of(algorithm))
    ratios = tuple(ratios) if ratios is not None else algorithm.noise_ratios
    if len(ratios) != len(fields):
        raise _validate.DpoptError(f"noise_ratios={ratios} must have one entry per field {fields}")
    return with_noise(algorithm, {f: scale * r for f, r in zip(fields, ratios)})


def calibrate(algorithm: Algorithm[S], *, epsilon: float, delta: float, n: int, steps: int,
              ratios: Sequence[float] | None = None, accountant: str = "pld", tolerance: float = 0.005) -> Algorithm[S]:
    """``algorithm`` with its noise multipliers set so the whole run is (ε, δ)-DP.

    Bisects on a common scale s of all noise multipliers (fixed ratios, default
    ``algorithm.noise_ratios``) using ``algorithm.planned_event(n, steps)`` — the same event
    the ledger must equal after the run. Achieved ε ≤ ``epsilon`` and ≥ (1 − 2·``tolerance``)·ε
    (within 1 % by default), on the ledger's own PLD grid.
    """
    _validate.positive_int("steps", steps)
    relation = algorithm.relation()
    scale, _ = solve_noise(lambda s: scaled(algorithm, s, ratios).planned_event(n, steps),
                           epsilon=epsilon, delta=delta, relation=relation, accountant=accountant,
                           tolerance=tolerance)
    return scaled(algorithm, scale, ratios)
