"""The plan of a private run, as one value: what is released, on how many records, how often,
and what that costs.

    plan = Plan(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=256), n=30_000, steps=600,
                delta=1e-5).calibrated(epsilon=1.0)
    plan.epsilon()            # ≤ 1.0: the accountant's ε(δ) of the planned event
    history = dpopt.train.train(plan, oracle, Options(seed=None))

A :class:`Plan` carries the one planned event, ``algorithm.planned_event(n, steps)`` — wrapped
by a private selection's repeat-and-select event when the plan is a tuning (:meth:`Plan.tuning`)
— that calibrates the noise before the run (:meth:`Plan.calibrated`) and that the run's ledger
is checked against after every logged step (:meth:`Plan.guarantee`): the double entry. Every
entry point (``run``, ``Private``, ``fit``, ``tune``, ``audit``, ``reproduce``, ``bench``) builds a
plan and hands it on; none assembles build → calibrate → run by hand.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Generic, Protocol

from dp_accounting import DpEvent, NeighboringRelation

from . import _validate
from .accounting import RELATION_NAMES, Ledger, accountant_for, epsilon_of, guarantee, scaled, solve_noise
from .base import S, Algorithm

#: How a user accepts δ ≥ 1/n knowingly, in the Python API and on the command line.
OVERRIDE = "allow_large_delta=True (--allow-large-delta)"


class Selection(Protocol):
    """How many runs a private selection makes (:mod:`dpopt.tuning.trials`): ``wrap`` turns one
    run's event into the event of releasing the best of K runs."""

    @property
    def mean(self) -> float: ...  # read-only: the distributions are frozen dataclasses

    def wrap(self, event: DpEvent) -> DpEvent: ...


@dataclasses.dataclass(frozen=True)
class Plan(Generic[S]):
    """``algorithm`` run for ``steps`` steps on ``n`` records at (·, ``delta``), accounted by
    ``accountant`` ("pld" or "rdp"; a plan whose events PLD cannot compose is accounted by RDP,
    :attr:`accountant_used`). ``selection``: a private tuning's number of trials (None: one run).
    ``noise_ratios``: the fixed ratios of the noise multipliers calibration scales (default the
    algorithm's). δ must be below 1/n unless ``allow_large_delta``
    (:func:`dpopt._validate.meaningful_delta` says why). Immutable: :meth:`calibrated` returns a
    new plan."""

    algorithm: Algorithm[S]
    n: int
    steps: int
    delta: float
    accountant: str = "pld"
    selection: Selection | None = None
    noise_ratios: tuple[float, ...] | None = None
    allow_large_delta: bool = False

    def __post_init__(self) -> None:
        _validate.positive_int("n", self.n)
        _validate.positive_int("steps", self.steps)
        _validate.meaningful_delta(self.delta, self.n, allow_large_delta=self.allow_large_delta,
                                   override=OVERRIDE)
        if self.noise_ratios is not None:
            object.__setattr__(self, "noise_ratios", tuple(float(r) for r in self.noise_ratios))

    # --------------------------------------------------------------------------- the event

    @property
    def relation(self) -> NeighboringRelation:
        """The neighbouring relation of the guarantee (the algorithm's sampling says it)."""
        return self.algorithm.relation()

    @property
    def relation_name(self) -> str:
        return RELATION_NAMES[self.relation]

    @functools.cached_property
    def run_event(self) -> DpEvent:
        """One run's planned event, ``algorithm.planned_event(n, steps)``: what each run's ledger
        is checked against."""
        return self.algorithm.planned_event(self.n, self.steps)

    @functools.cached_property
    def event(self) -> DpEvent:
        """The event the guarantee is computed from: one run's, or the selection's around it."""
        return self._total(self.algorithm)

    def _total(self, algorithm: Algorithm[S]) -> DpEvent:
        run = algorithm.planned_event(self.n, self.steps)
        return run if self.selection is None else self.selection.wrap(run)

    @functools.cached_property
    def accountant_used(self) -> str:
        """The accountant that computes ε of :attr:`event`: the requested one, or RDP where PLD
        cannot compose it."""
        return accountant_for(self.event, self.relation, self.accountant)

    def epsilon(self, delta: float | None = None) -> float:
        """ε(δ) of the planned event (δ = the plan's by default)."""
        return epsilon_of(self.event, self.delta if delta is None else delta, self.relation, self.accountant)

    # --------------------------------------------------------------------------- calibration

    def calibrated(self, epsilon: float) -> Plan[S]:
        """This plan with the algorithm's noise multipliers (``NOISE_FIELDS``, at fixed ratios) set
        to the smallest common scale whose planned event is (``epsilon``, δ)-DP (achieved ε within
        1 % below the target)."""
        _validate.positive("epsilon", epsilon)
        ratios = self.noise_ratios
        scale, _ = solve_noise(lambda s: self._total(scaled(self.algorithm, s, ratios)), epsilon=epsilon,
                               delta=self.delta, relation=self.relation, accountant=self.accountant)
        return dataclasses.replace(self, algorithm=scaled(self.algorithm, scale, ratios))

    def with_algorithm(self, algorithm: Algorithm[S]) -> Plan[S]:
        """The same plan for another algorithm object (e.g. a tuning candidate at the calibrated
        noise); its planned event must be the plan's."""
        return dataclasses.replace(self, algorithm=algorithm)

    def affordable_steps(self, max_epsilon: float) -> int:
        """The largest t ≤ ``steps`` whose planned ε(δ) stays ≤ ``max_epsilon`` (ε grows with t)."""
        _validate.positive("max_epsilon", max_epsilon)

        def fits(t: int) -> bool:
            return epsilon_of(self.algorithm.planned_event(self.n, t), self.delta, self.relation,
                              self.accountant) <= max_epsilon

        if fits(self.steps):
            return self.steps
        lo, hi = 0, self.steps
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    # --------------------------------------------------------------------------- the double entry

    def ledger(self) -> Ledger:
        """An empty ledger for one run of this plan."""
        return Ledger(self.relation, self.accountant)

    def guarantee(self, ledger: Ledger, delta: float | None = None, *, finished: bool = False) -> float:
        """ε(δ) a run that recorded ``ledger`` may claim: the ledger checked against one run's
        planned event, as the whole of it once the run took every step (``finished``;
        :func:`dpopt.accounting.guarantee`; a mismatch raises ``PlanMismatch``)."""
        return epsilon_of(guarantee(ledger.event(), self.run_event, finished=finished),
                          self.delta if delta is None else delta,
                          ledger.relation, ledger.accountant)


def plan_for(algorithm: Algorithm[S], *, n: int, steps: int, delta: float, epsilon: float | None,
             accountant: str = "pld", noise_ratios: Sequence[float] | None = None,
             allow_large_delta: bool = False) -> Plan[S]:
    """The plan of ``algorithm``, calibrated to (``epsilon``, ``delta``) unless ``epsilon`` is None
    (the algorithm's own noise multipliers are kept)."""
    plan = Plan(algorithm, n=n, steps=steps, delta=delta, accountant=accountant,
                noise_ratios=None if noise_ratios is None else tuple(noise_ratios),
                allow_large_delta=allow_large_delta)
    return plan if epsilon is None else plan.calibrated(epsilon)


def steps_for_epochs(algorithm: Algorithm[S], n: int, epochs: float) -> int:
    """Steps whose expected records visited come closest to ``epochs``·n (at least one)."""
    _validate.positive("epochs", epochs)
    per_step = algorithm.sampler(1, n).expected_size
    return max(1, round(epochs * n / per_step))
