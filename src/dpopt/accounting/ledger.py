"""The run's own entry of the double entry: the :class:`Ledger` of every event a step returned,
and :func:`guarantee`, which checks it against the plan and says what ε the run may claim.

:class:`PlanMismatch` is raised where what a run recorded is not covered by its plan (a privacy
bug, never a user error); :func:`is_filter` recognises a zCDP privacy filter's plan.
"""

from __future__ import annotations

import math
from typing import TypedDict

import dp_accounting as dpa
from dp_accounting import NeighboringRelation

from .. import _validate
from ..names import ACCOUNTANTS
from .epsilon import accountant_for, epsilon_of
from .events import RELATION_NAMES, compose, count_steps, run_length


class PlanMismatch(_validate.DpoptError):
    """What a run recorded is not covered by its plan: a privacy bug, never a user error."""


def _zcdp_rho(atom: dpa.DpEvent) -> float | None:
    """ρ of an atom that is exactly ρ-zCDP: ``ZCDpEvent(ρ)`` (ξ = 0), or ``GaussianDpEvent(z)``
    (noise over the distance: 1/(2z²)); None for any other atom."""
    if isinstance(atom, dpa.ZCDpEvent) and atom.xi == 0:
        return float(atom.rho)
    if isinstance(atom, dpa.GaussianDpEvent):
        return 1 / (2 * atom.noise_multiplier**2) if atom.noise_multiplier > 0 else math.inf
    return None


def is_filter(planned: dpa.DpEvent) -> bool:
    """Whether ``planned`` is a zCDP privacy filter's budget: one ``ZCDpEvent`` for the whole run,
    whatever its steps spend (DP-AGD)."""
    plan = run_length([planned])
    return len(plan) == 1 and isinstance(plan[0][0], dpa.ZCDpEvent) and plan[0][1] == 1


def guarantee(recorded: dpa.DpEvent, planned: dpa.DpEvent, *, finished: bool = False) -> dpa.DpEvent:
    """The event whose ε a run may claim, having recorded ``recorded`` under the plan ``planned``
    (the whole run's, from ``algorithm.planned_event(n, steps)``): the second entry of the double
    entry, checked at run time.

    * A fixed plan: the recorded runs must be a prefix of the planned runs (the same atoms in
      the same order, the last run possibly shorter); the guarantee is what was recorded. A run
      that took every planned step (``finished``) must have recorded the whole plan: a shorter
      ledger then means a release whose event was left out (e.g. a step that skips one of its
      two events), and its ε would be too small.
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
        spends = [rho * count for atom, count in done if (rho := _zcdp_rho(atom)) is not None]
        if len(spends) < len(done):
            raise PlanMismatch(f"the run recorded {recorded} under a zCDP filter: only zCDP events may be recorded")
        spent = math.fsum(spends)
        if spent > plan[0][0].rho * (1 + 1e-9):
            raise PlanMismatch(f"the run spent rho={spent!r} of a zCDP filter of rho={plan[0][0].rho!r}")
        return planned
    for i, (atom, count) in enumerate(done):
        last = i == len(done) - 1
        if i >= len(plan) or plan[i][0] != atom or (count > plan[i][1] if last else count != plan[i][1]):
            want = plan[i] if i < len(plan) else "nothing more"
            raise PlanMismatch(f"the run recorded {count} x {atom} where its plan has {want}: the ledger is not a "
                               "prefix of the planned event (a privacy bug)")
    if finished and done != plan:
        raise PlanMismatch(f"the run took every planned step but recorded {count_steps(recorded)} of its plan's "
                           f"{count_steps(planned)} events: a release's event is missing from the ledger "
                           "(a privacy bug)")
    return recorded


class LedgerState(TypedDict):
    """A ledger as a checkpoint keeps it: the adjacency's name, the accountant asked for, and the
    runs of releases (an event and how many times in a row it was released)."""

    relation: str
    accountant: str
    runs: list[tuple[dpa.DpEvent, int]]


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

    def state(self) -> LedgerState:
        return {"relation": self.relation.name, "accountant": self.requested_accountant, "runs": list(self._runs)}

    @classmethod
    def from_state(cls, state: LedgerState) -> Ledger:
        ledger = cls(NeighboringRelation[state["relation"]], state["accountant"])
        ledger._runs = [(event, int(count)) for event, count in state["runs"]]
        return ledger
