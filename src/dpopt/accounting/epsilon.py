"""ε(δ) of an event, and which accountant computes it.

:func:`accountant_for` picks the accountant: the one asked for (PLD by default, the tightest),
or RDP where PLD cannot compose the event (sampling without replacement, zCDP) or its PLD would
not fit in memory. :func:`epsilon_of` translates the event once
(:func:`~dpopt.accounting.events.in_accountant_terms`), reduces it to its multiset of atoms and
memoises ε on it; the PLD grid is picked from a coarse first pass (:func:`pld_discretization`).
Where dpopt computes ε other than by dp_accounting's accountants, it does so in
:mod:`dpopt.accounting.fast`, and only there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import NeighboringRelation, dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from .. import _validate
from ..names import ACCOUNTANTS
from . import fast
from .events import RELATION_NAMES, compose, count_steps, in_accountant_terms, merged, run_length

#: PLD grid: the coarsest (fast, accurate to ~0.1 % when ε is large against √T) and the finest.
COARSE_DISCRETIZATION = 1e-3
FINEST_DISCRETIZATION = 1e-5


#: The events of dp_accounting that wrap one other event (``event``): repeated, sampled, selected.
WRAPPING_EVENTS = (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent, dpa.SampledWithReplacementDpEvent,
                   dpa.SampledWithoutReplacementDpEvent, dp_event.RepeatAndSelectDpEvent)


def _has_noiseless_gaussian(event: dpa.DpEvent) -> bool:
    if isinstance(event, dpa.GaussianDpEvent):
        return bool(event.noise_multiplier == 0)
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_has_noiseless_gaussian(sub) for sub in event.events)
    if isinstance(event, dpa.SelfComposedDpEvent) and event.count <= 0:
        return False
    return isinstance(event, WRAPPING_EVENTS) and _has_noiseless_gaussian(event.event)


def _is_plain_gaussians(runs: Sequence[tuple[dpa.DpEvent, int]]) -> bool:
    return bool(runs) and all(isinstance(atom, dpa.GaussianDpEvent) and atom.noise_multiplier > 0
                              for atom, _ in runs)


def _accountant(kind: str, relation: NeighboringRelation, discretization: float) -> dpa.PrivacyAccountant:
    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=discretization)
    return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)


#: The most grid points one PLD may span (a few float64 and complex arrays of this length are
#: alive at once: ~0.5 GB): past it the privacy loss range is too wide for the grid (tiny noise,
#: huge ε) and RDP answers instead, a valid bound computed in closed form.
MAX_PLD_POINTS = 5_000_000
_TAIL = 12.0  #: standard deviations of the Gaussian kept by dp_accounting's tail truncation (mass e⁻⁵⁰)


def _pld_points(event: dpa.DpEvent, relation: NeighboringRelation, grid: float) -> float:
    """An upper estimate of the grid points of the PLD of translated ``event``.

    A Gaussian step of multiplier s against a shift of 1 (s = z/2 for a translated replace-one
    z) has privacy loss L(x) = (x − 1/2)/s² over |x| ≤ 12 s: a span of ≤ 12/s + 1/(2s²) on one
    side; Poisson sampling at rate q maps a loss L to log(1 − q + q·e^L). Composing k steps
    spans at most the smaller of k single spans and one span plus 16√k standard deviations of
    the per-step loss (dp_accounting truncates the tails of every composition), that standard
    deviation being 1/s, or q·√(e^{1/s²} − 1) when sampled."""
    halve = relation == NeighboringRelation.REPLACE_ONE
    total = 0.0
    for atom, count in merged(run_length([event])):
        rate = atom.sampling_probability if isinstance(atom, dpa.PoissonSampledDpEvent) else 1.0
        inner = atom.event if isinstance(atom, dpa.PoissonSampledDpEvent) else atom
        if not (isinstance(inner, dpa.GaussianDpEvent) and inner.noise_multiplier > 0 and rate > 0):
            continue
        s = inner.noise_multiplier / (2 if halve else 1)
        loss = _TAIL / s + 1 / (2 * s * s)
        spread = 1 / s
        if rate < 1:
            loss = float(np.logaddexp(math.log1p(-rate), math.log(rate) + loss)) - math.log1p(-rate)
            spread = min(spread, rate * math.sqrt(math.expm1(min(1 / (s * s), 700.0))))
        total += min(count * 2 * loss, 2 * loss + 16 * math.sqrt(count) * spread) / grid
    return total


def accountant_for(event: dpa.DpEvent, relation: NeighboringRelation, requested: str) -> str:
    """``requested``, or "rdp" where PLD cannot compose ``event`` (or its PLD would not fit in
    memory, :data:`MAX_PLD_POINTS`); error if neither can."""
    _validate.one_of("accountant", requested, ACCOUNTANTS)
    for kind in (requested, "rdp"):
        translated = in_accountant_terms(event, relation, kind)
        if (kind == "pld" and not _is_plain_gaussians(run_length([translated]))
                and _pld_points(translated, relation, COARSE_DISCRETIZATION) > MAX_PLD_POINTS):
            continue
        if _accountant(kind, relation, COARSE_DISCRETIZATION).supports(translated):
            return kind
    raise _validate.DpoptError(
        f"event {event} is not supported by dp_accounting under {RELATION_NAMES[relation]} adjacency"
    )


def accountant_note(event: dpa.DpEvent, relation: NeighboringRelation, requested: str) -> str | None:
    """None where ``requested`` composes ``event``; else the sentence saying which accountant
    :func:`accountant_for` uses instead, and why."""
    used = accountant_for(event, relation, requested)
    if used == requested:
        return None
    translated = in_accountant_terms(event, relation, requested)
    why = ("its privacy loss distribution would exceed the grid's memory (too little noise: a very large ε)"
           if _accountant(requested, relation, COARSE_DISCRETIZATION).supports(translated)
           else "it cannot compose this run's events")
    return f"accountant={requested!r} was asked for and {used!r} is used: {why}; {used}'s ε is a valid, looser bound"


def pld_discretization(epsilon_estimate: float, steps: int) -> float:
    """The PLD grid for an ε of about ``epsilon_estimate`` over ``steps`` composed events.

    Pessimistic rounding costs up to one grid step per composed event, which matters when ε
    is small against √T; the grid is ε/(30√T) rounded down to a half decade (1e-3, 3.2e-4,
    1e-4, …) and kept within [1e-5, 1e-3]. Every grid gives an upper bound on the true ε; the
    finer ones are only used where they are cheap (small ε).
    """
    raw = epsilon_estimate / (30 * math.sqrt(steps))
    if raw >= COARSE_DISCRETIZATION:
        return COARSE_DISCRETIZATION
    return max(FINEST_DISCRETIZATION, 10 ** (math.floor(2 * math.log10(raw)) / 2))


def epsilon_of(event: dpa.DpEvent, delta: float, relation: NeighboringRelation, accountant: str = "pld",
               grid: float | None = None) -> float:
    """ε(δ) of ``event`` (dpopt's convention) under ``relation``: PLD, falling back to RDP where
    PLD cannot.

    The event is translated once (:func:`in_accountant_terms`) and reduced to its multiset of
    atoms (:func:`merged`), so ε does not depend on how the events are grouped. PLD is evaluated
    on ``grid``, by default the one :func:`pld_discretization` picks from a coarse first pass;
    the result is dp_accounting's pessimistic estimate, an upper bound on the true ε.
    """
    _validate.open_unit("delta", delta)
    kind = accountant_for(event, relation, accountant)
    return _memoised_epsilon(merged(run_length([in_accountant_terms(event, relation, kind)])), delta, relation,
                             kind, grid)


#: ε is a pure function of the translated runs; memoised on their ``repr`` (events holding lists
#: are unhashable), oldest entry first out.
_EPSILON_CACHE: dict[tuple[Any, ...], float] = {}
_EPSILON_CACHE_SIZE = 4096


def _memoised_epsilon(runs: list[tuple[dpa.DpEvent, int]], delta: float, relation: NeighboringRelation, kind: str,
                      grid: float | None) -> float:
    key = (repr(runs), delta, relation, kind, grid)
    if key not in _EPSILON_CACHE:
        if len(_EPSILON_CACHE) >= _EPSILON_CACHE_SIZE:
            _EPSILON_CACHE.pop(next(iter(_EPSILON_CACHE)))
        _EPSILON_CACHE[key] = _epsilon(runs, delta, relation, kind, grid)
    return _EPSILON_CACHE[key]


def _epsilon(runs: list[tuple[dpa.DpEvent, int]], delta: float, relation: NeighboringRelation, kind: str,
             grid: float | None) -> float:
    """ε(δ) of translated, merged ``runs`` by accountant ``kind``: the closed form where the runs
    are plain Gaussians, dpopt's fast PLD for (Poisson-sampled) Gaussians, else dp_accounting."""
    if not runs:
        return 0.0
    event = compose(runs)
    if _has_noiseless_gaussian(event):
        return math.inf  # RDP's sampled-without-replacement formula divides by the multiplier
    if kind == "pld":
        if _is_plain_gaussians(runs):
            return fast.composed_gaussian_epsilon(runs, delta, relation)
        if grid is None:  # both grids' answers memoised: a calibration has usually computed them already
            coarse = _memoised_epsilon(runs, delta, relation, kind, COARSE_DISCRETIZATION)
            steps = sum(count for _, count in runs)
            grid = (COARSE_DISCRETIZATION if not math.isfinite(coarse) or coarse == 0
                    else pld_discretization(coarse, steps))
            return _memoised_epsilon(runs, delta, relation, kind, grid)
        pld = fast.sampled_gaussians_pld(runs, relation, grid)
        if pld is not None:
            return float(pld.get_epsilon_for_delta(delta))
    acc = _accountant(kind, relation, grid or COARSE_DISCRETIZATION)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def ledger_grid(event: dpa.DpEvent, delta: float, relation: NeighboringRelation) -> float:
    """The PLD grid :func:`epsilon_of` uses for ``event`` by default: the coarse grid's ε sets it
    (:func:`pld_discretization`); the coarse grid itself where that ε is 0 or infinite."""
    eps = epsilon_of(event, delta, relation, "pld", COARSE_DISCRETIZATION)
    if not math.isfinite(eps) or eps == 0:
        return COARSE_DISCRETIZATION
    return pld_discretization(eps, count_steps(event))
