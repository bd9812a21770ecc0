"""Resuming from a checkpoint: only the same run, and only with the ε its steps really spent.

A checkpoint (a :class:`~dpopt.snapshot.Snapshot`) stores the run's settings, described one by
one (:func:`describe`); resuming with any setting changed is refused with a line naming the first
that differs (:func:`check_settings`). Its ledger must be what the plan says the steps done so
far spend (:func:`checked_ledger`): a ledger that records less would make the resumed run report
less ε than it spent. Every refusal advises another ``--out``, never deleting the checkpoint: it
is the record of the ε already spent on the data. :func:`dpopt.snapshot.read` makes these checks,
after verifying the checkpoint's tag under the user's key (:func:`dpopt.checkpoint.load`) and
before :func:`dpopt.journal.resume` refuses a checkpoint older than its run's latest.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import dp_accounting as dpa

from ._validate import DpoptError
from .accounting import Ledger, PlanMismatch, compose, count_steps, guarantee, is_filter, run_length
from .accounting.ledger import LedgerState
from .base import Delegating, Digested, ModelDigested, Regularised

if TYPE_CHECKING:
    from .base import S, Oracle
    from .plan import Plan

def describe(algorithm: object, oracle: Oracle, **settings: object) -> dict[str, str]:
    """Everything that determines a run, setting by setting, in a fixed order: the algorithm
    (its type and each hyper-parameter its repr shows), the oracle (type, n, dim, regulariser, the
    digest of its training data, where it has one: ``data_digest``, and of a module's structure and
    loss: ``model_digest``) and ``settings``."""
    oracle = oracle.oracle if isinstance(oracle, Delegating) else oracle  # a wrapper runs the same problem
    if dataclasses.is_dataclass(algorithm):
        described = {"algorithm": type(algorithm).__qualname__} | {
            f"algorithm.{f.name}": repr(getattr(algorithm, f.name)) for f in dataclasses.fields(algorithm) if f.repr}
    else:
        described = {"algorithm": repr(algorithm)}
    return described | {
        "oracle": type(oracle).__name__, "n": str(oracle.n), "dim": str(oracle.dim),
        "reg": repr(oracle.reg if isinstance(oracle, Regularised) else None),
        "data": oracle.data_digest if isinstance(oracle, Digested) else "no digest",
        "model": oracle.model_digest if isinstance(oracle, ModelDigested) else "closed form",
    } | {name: repr(value) for name, value in settings.items()}


def checked_ledger(name: str, state: LedgerState, done: object, plan: Plan[S], *, stop_at: int) -> Ledger:
    """The ledger saved as ``state`` after ``done`` steps, refused (naming checkpoint ``name``)
    unless ``done`` is a step in [0, ``stop_at``] and the ledger records what ``plan`` spends in
    those steps.

    Schedules (the plan fixes every step's event): the ledger must equal the first k atomic events
    of ``canonical(algorithm.planned_event(n, steps))``, k those of the steps done. A zCDP privacy
    filter (DP-AGD's budget, whose steps choose their own spending): the ledger must stay within
    it (:func:`dpopt.accounting.guarantee`).
    """
    if type(done) is not int or not 0 <= done <= stop_at:
        raise DpoptError(f"{name} records step={done!r}, not a step in [0, {stop_at}] of this run")
    try:
        ledger = Ledger.from_state(state)
    except (KeyError, TypeError, ValueError) as err:
        raise DpoptError(f"{name} holds no ledger ({err}); it was not used") from None
    relation, planned = plan.relation, plan.run_event
    if ledger.relation != relation:
        raise DpoptError(f"{name} records a ledger under {ledger.neighboring_relation} adjacency, this run's is "
                         f"{Ledger(relation).neighboring_relation}; it was not used")
    if is_filter(planned):
        try:
            guarantee(ledger.event(), planned)
        except PlanMismatch as err:
            raise DpoptError(f"{name}: {err}; it was not used") from None
    elif ledger.event() != compose(_prefix(run_length([planned]), _atoms(plan, done))):
        raise DpoptError(f"{name} records a ledger of {ledger.steps} events after {done} steps that is not what "
                         f"the plan spends in those steps; it was not used")
    return ledger


def check_settings(name: str, saved: object, described: dict[str, str]) -> None:
    """Refuse a checkpoint whose settings differ, naming the first setting that does."""
    if not isinstance(saved, dict):
        raise DpoptError(f"{name} records no settings; it was not used")
    for key in [*described, *(k for k in saved if k not in described)]:
        if saved.get(key) != described.get(key):
            raise DpoptError(f"{name} belongs to another run: its {key} is {_shown(saved.get(key))}, this run's is "
                             f"{_shown(described.get(key))}; resume with the same settings, or use another --out "
                             "for a new run (keep the checkpoint: it records the ε already spent)")


def _shown(value: str | None) -> str:
    return "not set" if value is None else value if len(value) <= 100 else value[:97] + "..."


def _atoms(plan: Plan[S], done: int) -> int:
    """How many atomic events the plan spends in its first ``done`` steps: those of
    ``planned_event(n, done)``; one per step for a plan that exists only for its whole length
    (R-AClip's stages). A wrong count fails closed: the genuine checkpoint is refused."""
    if done == 0:
        return 0
    try:
        return count_steps(plan.algorithm.planned_event(plan.n, done))
    except DpoptError:
        return done


def _prefix(runs: list[tuple[dpa.DpEvent, int]], atoms: int) -> list[tuple[dpa.DpEvent, int]]:
    """The first ``atoms`` atomic events of the run-length list ``runs``."""
    prefix = []
    for event, count in runs:
        if atoms <= 0:
            break
        prefix.append((event, min(count, atoms)))
        atoms -= count
    return prefix

