"""The privacy ledger and noise calibration, both over ``dp_accounting``.

One description of the mechanisms serves twice (double entry): an algorithm's
``planned_event(n, steps)`` calibrates its noise before training, and the :class:`Ledger`
records every event a step actually returns. A contract test asserts the two agree.

Accountants: PLD (tightest, the default) or RDP. A ledger asked for PLD falls back to RDP for
events PLD cannot compose (sampling without replacement, zCDP, trees) and says so in
:attr:`Ledger.accountant`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import NeighboringRelation, dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution, privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, special

from . import _validate
from .gaussian_pld import gaussian_pld
from .names import ACCOUNTANTS

RELATION_NAMES = {
    NeighboringRelation.ADD_OR_REMOVE_ONE: "add/remove-one",
    NeighboringRelation.REPLACE_ONE: "replace-one",
    NeighboringRelation.REPLACE_SPECIAL: "replace-special",
}
#: PLD grid: the coarsest (fast, accurate to ~0.1 % when ε is large against √T) and the finest.
COARSE_DISCRETIZATION = 1e-3
FINEST_DISCRETIZATION = 1e-5


def run_length(events: Sequence[dpa.DpEvent]) -> list[tuple[dpa.DpEvent, int]]:
    """Flatten compositions into ``[(atomic event, count), ...]``, merging equal neighbours.

    ``NoOpDpEvent`` costs nothing and is left out, so how events are grouped (nesting, splitting
    a ``SelfComposedDpEvent``, no-ops in between) never changes the runs' total."""
    runs: list[tuple[dpa.DpEvent, int]] = []

    def push(event: dpa.DpEvent, count: int) -> None:
        if count == 0 or isinstance(event, dpa.NoOpDpEvent):
            return
        if isinstance(event, dpa.ComposedDpEvent):  # k times [a, b] is k times a and k times b
            for sub in event.events:
                push(sub, count)
        elif isinstance(event, dpa.SelfComposedDpEvent):
            push(event.event, count * event.count)
        elif runs and runs[-1][0] == event:
            runs[-1] = (event, runs[-1][1] + count)
        else:
            runs.append((event, count))

    for event in events:
        push(event, 1)
    return runs


def merged(runs: Sequence[tuple[dpa.DpEvent, int]]) -> list[tuple[dpa.DpEvent, int]]:
    """Equal atoms merged wherever they stand, in order of first appearance (composition
    commutes, so ε depends only on this multiset)."""
    counts: dict[str, tuple[dpa.DpEvent, int]] = {}
    for atom, count in runs:
        key = repr(atom)
        counts[key] = (atom, counts[key][1] + count) if key in counts else (atom, count)
    return list(counts.values())


def count_steps(event: dpa.DpEvent) -> int:
    """How many atomic events ``event`` composes (no-ops left out)."""
    return sum(count for _, count in run_length([event]))


def compose(runs: Sequence[tuple[dpa.DpEvent, int]]) -> dpa.DpEvent:
    """The canonical event of a run-length list: ``Composed([SelfComposed(e, k), ...])``."""
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(event, count) for event, count in runs])


def canonical(event: dpa.DpEvent) -> dpa.DpEvent:
    """The canonical form of any event, so that equal compositions compare equal."""
    return compose(run_length([event]))


def tree_depth(step_counts: Sequence[int]) -> int:
    """⌈log₂(L + 1)⌉ for the longest of the trees: how many nodes of its tree one increment
    enters (a record sits in one increment of one tree)."""
    return math.ceil(math.log2(max(step_counts) + 1))


def in_accountant_terms(event: dpa.DpEvent, relation: NeighboringRelation, kind: str) -> dpa.DpEvent:
    """The one translation of dpopt's events into what accountant ``kind`` reads.

    dpopt's convention, for every release and every neighbouring relation: a noise multiplier z
    is (noise standard deviation) / (L2 distance between the released statistic on neighbouring
    data sets) — 2C for a sum of C-clipped records under replace-one, C under add/remove-one.

    * RDP (dp_accounting) reads ``GaussianDpEvent(z)`` as noise z against a shift of 1 under
      every relation: dpopt's meaning, unchanged.
    * PLD (dp_accounting) reads ``GaussianDpEvent(z)`` under replace-one as noise z between
      outputs at ±1, a distance of 2: the event becomes ``GaussianDpEvent(2z)``, also inside
      sampling events.
    * A binary tree ``SingleEpochTreeAggregationDpEvent(z, [L₁, …])`` (trees on disjoint records)
      is exactly one Gaussian mechanism of multiplier z/√h, h = :func:`tree_depth`: a record
      moves the h nodes above its increment, each by at most the distance, with independent
      noise on each, so the joint shift has norm ≤ √h·distance. It is translated to that
      Gaussian (whose RDP, α·h/(2z²), is dp_accounting's tree RDP) before the rule above.
    * ``NoOpDpEvent`` is dropped; compositions are translated part by part; other events
      (zCDP, non-private) mean the same to every accountant.
    """
    double = kind == "pld" and relation == NeighboringRelation.REPLACE_ONE

    def walk(e: dpa.DpEvent) -> dpa.DpEvent:
        if isinstance(e, dpa.SingleEpochTreeAggregationDpEvent):
            z = e.noise_multiplier
            return walk(dpa.GaussianDpEvent(z / math.sqrt(tree_depth(e.step_counts)) if z > 0 else 0.0))
        if isinstance(e, dpa.GaussianDpEvent):
            return dpa.GaussianDpEvent(2 * e.noise_multiplier) if double else e
        if isinstance(e, dpa.ComposedDpEvent):
            return dpa.ComposedDpEvent([walk(sub) for sub in e.events if not isinstance(sub, dpa.NoOpDpEvent)])
        if isinstance(e, dpa.SelfComposedDpEvent):
            return dpa.SelfComposedDpEvent(walk(e.event), e.count)
        if isinstance(e, dpa.PoissonSampledDpEvent):
            return dpa.PoissonSampledDpEvent(e.sampling_probability, walk(e.event))
        if isinstance(e, dpa.SampledWithoutReplacementDpEvent):
            return dpa.SampledWithoutReplacementDpEvent(e.source_dataset_size, e.sample_size, walk(e.event))
        if isinstance(e, dp_event.RepeatAndSelectDpEvent):
            return dp_event.RepeatAndSelectDpEvent(walk(e.event), e.mean, e.shape)
        return e

    return walk(event)


def _has_noiseless_gaussian(event: dpa.DpEvent) -> bool:
    if isinstance(event, dpa.GaussianDpEvent):
        return event.noise_multiplier == 0
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_has_noiseless_gaussian(sub) for sub in event.events)
    inner = getattr(event, "event", None)
    count = getattr(event, "count", 1)
    return inner is not None and count > 0 and _has_noiseless_gaussian(inner)


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
            return _composed_gaussian_epsilon(runs, delta, relation)
        if grid is None:  # both grids' answers memoised: a calibration has usually computed them already
            coarse = _memoised_epsilon(runs, delta, relation, kind, COARSE_DISCRETIZATION)
            steps = sum(count for _, count in runs)
            grid = (COARSE_DISCRETIZATION if not math.isfinite(coarse) or coarse == 0
                    else pld_discretization(coarse, steps))
            return _memoised_epsilon(runs, delta, relation, kind, grid)
        pld = _gaussian_pld(runs, relation, grid)
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


def _is_plain_gaussians(runs: Sequence[tuple[dpa.DpEvent, int]]) -> bool:
    return bool(runs) and all(isinstance(atom, dpa.GaussianDpEvent) and atom.noise_multiplier > 0
                              for atom, _ in runs)


def _composed_gaussian_epsilon(runs: Sequence[tuple[dpa.DpEvent, int]], delta: float,
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
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(s, sensitivity=1.0)
    if loss.get_delta_for_epsilon(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while loss.get_delta_for_epsilon(hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if loss.get_delta_for_epsilon(mid) > delta else (lo, mid)
    return hi


def _gaussian_pld(runs: Sequence[tuple[dpa.DpEvent, int]], relation: NeighboringRelation,
                  grid: float) -> privacy_loss_distribution.PrivacyLossDistribution | None:
    """The PLD of runs of (Poisson-sampled) Gaussian events (translated: dp_accounting's
    reading), built as dp_accounting's PLDAccountant builds it, but reusing each sampled-Gaussian
    step's PLD across calls (a ledger is asked for ε at every logged step); None if any event is
    of another kind."""
    total = privacy_loss_distribution.identity(grid)
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
                           grid: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    return gaussian_pld(noise_multiplier, grid, relation, sampling_prob=rate)


class PlanMismatch(_validate.DpoptError):
    """What a run recorded is not covered by its plan: a privacy bug, never a user error."""


def _zcdp_rho(atom: dpa.DpEvent) -> float | None:
    """ρ of an atom that is exactly ρ-zCDP: ``ZCDpEvent(ρ)`` (ξ = 0), or ``GaussianDpEvent(z)``
    (noise over the distance: 1/(2z²)); None for any other atom."""
    if isinstance(atom, dpa.ZCDpEvent) and atom.xi == 0:
        return atom.rho
    if isinstance(atom, dpa.GaussianDpEvent):
        return 1 / (2 * atom.noise_multiplier**2) if atom.noise_multiplier > 0 else math.inf
    return None


def is_filter(planned: dpa.DpEvent) -> bool:
    """Whether ``planned`` is a zCDP privacy filter's budget: one ``ZCDpEvent`` for the whole run,
    whatever its steps spend (DP-AGD)."""
    plan = run_length([planned])
    return len(plan) == 1 and isinstance(plan[0][0], dpa.ZCDpEvent) and plan[0][1] == 1


def guarantee(recorded: dpa.DpEvent, planned: dpa.DpEvent) -> dpa.DpEvent:
    """The event whose ε a run may claim, having recorded ``recorded`` under the plan ``planned``
    (the whole run's, from ``algorithm.planned_event(n, steps)``): the second entry of the double
    entry, checked at run time.

    * A fixed plan: the recorded runs must be a prefix of the planned runs (the same atoms in
      the same order, the last run possibly shorter); the guarantee is what was recorded.
    * A zCDP privacy filter (the plan is one ``ZCDpEvent(ρ)``, DP-AGD): every recorded atom must
      be exactly zCDP and their ρ sum to at most the plan's (Feldman & Zrnic 2021: adaptively
      chosen budgets within a filter compose to the filter's budget); the guarantee is the plan
      itself: the realised spend depends on the data and is no guarantee.
    * A non-private plan: the guarantee is the plan (ε = ∞).

    Raises :class:`PlanMismatch` naming the first difference otherwise.
    """
    plan = run_length([planned])
    done = run_length([recorded])
    if plan and all(isinstance(atom, dpa.NonPrivateDpEvent) for atom, _ in plan):
        return planned
    if is_filter(planned):
        rhos = [(_zcdp_rho(atom), count) for atom, count in done]
        if any(rho is None for rho, _ in rhos):
            raise PlanMismatch(f"the run recorded {recorded} under a zCDP filter: only zCDP events may be recorded")
        spent = math.fsum(rho * count for rho, count in rhos)
        if spent > plan[0][0].rho * (1 + 1e-9):
            raise PlanMismatch(f"the run spent rho={spent!r} of a zCDP filter of rho={plan[0][0].rho!r}")
        return planned
    for i, (atom, count) in enumerate(done):
        last = i == len(done) - 1
        if i >= len(plan) or plan[i][0] != atom or (count > plan[i][1] if last else count != plan[i][1]):
            want = plan[i] if i < len(plan) else "nothing more"
            raise PlanMismatch(f"the run recorded {count} x {atom} where its plan has {want}: the ledger is not a "
                               "prefix of the planned event (a privacy bug)")
    return recorded


class Ledger:
    """What a run has actually spent: every event a step returned, in order.

    ``record(event)`` appends; ``event()`` is the canonical composition; ``epsilon(delta)``
    asks dp_accounting. The ledger's state is plain data, saved in checkpoints.
    """

    def __init__(self, relation: NeighboringRelation, accountant: str = "pld") -> None:
        _validate.one_of("accountant", accountant, ACCOUNTANTS)
        self.relation = relation
        self.requested_accountant = accountant
        self._runs: list[tuple[dpa.DpEvent, int]] = []

    def record(self, event: dpa.DpEvent) -> None:
        for atom, count in run_length([event]):
            if self._runs and self._runs[-1][0] == atom:
                self._runs[-1] = (atom, self._runs[-1][1] + count)
            else:
                self._runs.append((atom, count))

    def event(self) -> dpa.DpEvent:
        return compose(self._runs)

    @property
    def steps(self) -> int:
        """How many atomic events were recorded (no-ops, which cost nothing, not counted)."""
        return count_steps(self.event())

    @property
    def accountant(self) -> str:
        """The accountant actually used for the recorded events ("pld" or "rdp")."""
        return accountant_for(self.event(), self.relation, self.requested_accountant)

    @property
    def neighboring_relation(self) -> str:
        return RELATION_NAMES[self.relation]

    def epsilon(self, delta: float) -> float:
        """ε(δ) of everything recorded so far (0 for an empty ledger); memoised by :func:`epsilon_of`."""
        _validate.open_unit("delta", delta)
        if not self._runs:
            return 0.0
        return epsilon_of(self.event(), delta, self.relation, self.requested_accountant)

    def state(self) -> dict[str, Any]:
        return {"relation": self.relation.name, "accountant": self.requested_accountant, "runs": list(self._runs)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ledger:
        ledger = cls(NeighboringRelation[state["relation"]], state["accountant"])
        ledger._runs = [(event, int(count)) for event, count in state["runs"]]
        return ledger


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
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        z = event.event.noise_multiplier
        return event.sampling_probability**2 * math.expm1(min(1 / z**2, 700.0)) if z > 0 else math.inf
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = _gdp_mu_squared(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [_gdp_mu_squared(sub) for sub in event.events]
        return None if None in parts else sum(parts)
    return None


def _gdp_start(event_of: Callable[[float], dpa.DpEvent], epsilon: float, delta: float) -> float:
    """A noise scale whose Gaussian-DP approximation is (ε, δ)-DP, or 1.0 where the events are
    not Gaussian: the bisection's first guess (within a few per cent for long runs)."""
    if _gdp_mu_squared(event_of(1.0)) is None:
        return 1.0

    def delta_of(mu: float) -> float:  # δ(ε) of μ-GDP
        return special.ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon) * special.ndtr(-epsilon / mu - mu / 2)

    def excess(log_scale: float) -> float:
        return math.log(_gdp_mu_squared(event_of(math.exp(log_scale)))) - 2 * math.log(mu)

    try:
        mu = optimize.brentq(lambda m: delta_of(m) - delta, 1e-6, 50.0)
        return math.exp(optimize.brentq(excess, math.log(1e-4), math.log(1e5), xtol=1e-4))
    except (ValueError, OverflowError, ZeroDivisionError):
        return 1.0


def solve_noise(event_of: Callable[[float], dpa.DpEvent], *, epsilon: float, delta: float,
                relation: NeighboringRelation, accountant: str = "pld",
                tolerance: float = 0.005) -> tuple[float, float]:
    """The smallest noise scale s (to ``tolerance``) with ε(event_of(s)) ≤ ``epsilon``.

    ε is decreasing in s. The search starts at the Gaussian-DP (central limit) approximation's
    answer (:func:`_gdp_start`) and runs on the PLD grid the ledger picks near the answer
    (:func:`ledger_grid`), so every evaluation is one the ledger would make; the answer is then
    checked with :func:`epsilon_of` exactly as the ledger computes it and nudged up until it
    passes. Achieved ε ≤ ``epsilon`` and ≥ (1 − 2·tolerance)·``epsilon``. Returns ``(s, achieved ε)``.
    An ``epsilon`` above :data:`~dpopt._validate.IMPLAUSIBLE_EPSILON` is solved for, with a warning.
    """
    _validate.positive("epsilon", epsilon)
    _validate.plausible_epsilon(epsilon)
    _validate.open_unit("delta", delta)
    kind = accountant_for(event_of(1.0), relation, accountant)
    accept = math.log(1 - tolerance)

    def gap_on(grid: float | None) -> Callable[[float], float]:
        def gap(scale: float) -> float:
            eps = epsilon_of(event_of(scale), delta, relation, kind, grid)
            return math.log(eps / epsilon) if eps > 0 else -math.inf
        return gap

    scale = _gdp_start(event_of, epsilon, delta)
    if kind == "rdp":
        scale = _root(gap_on(None), scale, accept)
    else:  # on the grid the ledger picks near the answer (it changes by half decades, rarely twice)
        grid = None
        for _ in range(3):
            wanted = ledger_grid(event_of(scale), delta, relation)
            if wanted == grid:
                break
            grid = wanted
            scale = _root(gap_on(grid), scale, accept)
    achieved = epsilon_of(event_of(scale), delta, relation, kind)
    while achieved > epsilon:
        scale *= 1 + tolerance / 2
        achieved = epsilon_of(event_of(scale), delta, relation, kind)
    return scale, achieved


def scaled(algorithm: Any, scale: float, ratios: Sequence[float] | None = None) -> Any:
    """A copy of ``algorithm`` with noise multipliers ``scale · ratios`` (fields ``NOISE_FIELDS``)."""
    fields = algorithm.NOISE_FIELDS
    ratios = tuple(ratios) if ratios is not None else algorithm.noise_ratios
    if len(ratios) != len(fields):
        raise _validate.DpoptError(f"noise_ratios={ratios} must have one entry per field {fields}")
    return dataclasses.replace(algorithm, **{f: scale * r for f, r in zip(fields, ratios)})


def calibrate(algorithm: Any, *, epsilon: float, delta: float, n: int, steps: int,
              ratios: Sequence[float] | None = None, accountant: str = "pld") -> Any:
    """``algorithm`` with its noise multipliers set so the whole run is (ε, δ)-DP.

    Bisects on a common scale s of all noise multipliers (fixed ratios, default
    ``algorithm.noise_ratios``) using ``algorithm.planned_event(n, steps)`` — the same event
    the ledger must equal after the run. Achieved ε ≤ ``epsilon`` and within 1 % of it.
    """
    _validate.positive_int("steps", steps)
    relation = algorithm.relation()
    scale, _ = solve_noise(lambda s: scaled(algorithm, s, ratios).planned_event(n, steps),
                           epsilon=epsilon, delta=delta, relation=relation, accountant=accountant)
    return scaled(algorithm, scale, ratios)
