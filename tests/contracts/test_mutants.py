"""Mutation tests of the privacy contracts: a wrong noise multiplier or a wrong sensitivity in
any single release of any algorithm is caught.

Every release goes through a mechanism (``mechanisms.gaussian``, ``TreeAggregator.add``,
``mechanisms.noisy_argmin``, ``correlation.noise.banded_gaussian``). A mutant changes what one release
hands its mechanism, as a bug in the algorithm would: its noise multiplier (×1.5; for the noisy argmin ρ×2.25, the same
error) or the sensitivity its clipped value claims (×½, so the noise is halved while the event
stays the same), or it drops the release's event from what the step returns (DPSUR's test: a step
that forgets to charge its second release). Two independent checks must catch every mutant, and
pass on the honest code:

* double entry: what the run recorded (the events its mechanisms returned) against the plan
  (``accounting.guarantee``; for non-adaptive algorithms, equal to the plan; for DP-AGD's zCDP
  filter, exactly the budget once exhausted);
* the sensitivity each release claims, against this file's own formula for that release
  (:func:`expected_sensitivity`, the second entry of every sensitivity: 2C per clipped sum under
  replace-one, C under add/remove-one, 2λ for AClip's clipped mean, 2C·‖θ − θ′‖ for a clipped
  difference at two points, the tree's 2·max(C1/B1, C2/B2), C_obj for DP-AGD's scores; adaptive
  clipping's C_t·f, replayed from the counts released before, and ½·f for the count; DPSUR's
  candidate C and its test's C_v, the clip of a per-record loss change).
  Banded noise commits its (z, Δ) at the first release, so a mutant of any one release is refused
  by the mechanism itself.

Below them, the same sensitivity claim checked on the per-record engines rather than on the
algorithms: with a loss that couples records (batch-centred targets), replacing one record must
move the clipped sum by at most the 2C it claims. The mutant is the ghost engine before its fix,
which called ``loss_fn`` on the whole batch (``tests/test_audit_module.py`` audits the same bug).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import dp_accounting as dpa
import pytest
import torch

from dpopt import accounting, clipping, mechanisms, train
from dpopt.accounting import Ledger
from dpopt.audit import worlds
from dpopt.base import Batch, Wrapper
from dpopt.clipping import relation_factor
from dpopt.correlation import noise as correlated
from dpopt.oracles import TorchModel

from tests.contracts.test_algorithms import DIM, NAMES, TABLE, N, oracle, sampler_of
from tests.test_audit_module import centred, linear, records, whole_batch_per_record

PRIVATE = [name for name in NAMES if TABLE[name].private]


@dataclass
class Release:
    kind: str           # "gaussian", "tree" or "argmin"
    step: int
    within: int         # its index among the releases of its step
    sensitivity: float  # what the clipped value handed to the mechanism claims
    queries: list[torch.Tensor] = field(default_factory=list)  # the points θ the oracle was asked at
    value: torch.Tensor | None = None  # what it released (a Gaussian's)


class Spy:
    """Records every release (and the oracle's query points before it) and applies one mutant."""

    def __init__(self, mutant: tuple[str, int, str] | None) -> None:
        self.mutant = mutant  # (kind, index among releases of that kind, "noise" | "sensitivity" | "skip")
        self.releases: list[Release] = []
        self.step = 0
        self.queries: list[torch.Tensor] = []

    def _mutate(self, kind: str, multiplier: float, bounded: mechanisms.Bounded) -> tuple[float, Any]:
        index = sum(release.kind == kind for release in self.releases)
        if self.mutant is None or self.mutant[:2] != (kind, index):
            return multiplier, bounded
        if self.mutant[2] == "noise":
            return multiplier * (2.25 if kind == "argmin" else 1.5), bounded
        if self.mutant[2] == "skip":  # the release as honest; its event is dropped (spied_gaussian)
            return multiplier, bounded
        return multiplier, mechanisms.Bounded(bounded.value, bounded.sensitivity / 2, mechanisms._CLIPPING_TOKEN)

    def record(self, kind: str, bounded: mechanisms.Bounded) -> None:
        within = sum(release.step == self.step for release in self.releases)
        self.releases.append(Release(kind, self.step, within, bounded.sensitivity, self.queries))
        self.queries = []


class QueryOracle:
    """The contract oracle, logging the points per-record gradients are asked at."""

    def __init__(self, spy: Spy) -> None:
        self.inner, self.spy = oracle(), spy

    def per_record(self, theta: torch.Tensor, indices: torch.Tensor) -> Any:
        self.spy.queries.append(theta.clone())
        return self.inner.per_record(theta, indices)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def spied_run(algo: Any, steps: int, spy: Spy, monkeypatch: pytest.MonkeyPatch) -> tuple[Ledger, list[torch.Tensor]]:
    """``dpopt.run``'s loop with every mechanism spied on (and one of them mutated)."""
    gaussian, add, argmin = mechanisms.gaussian, mechanisms.TreeAggregator.add, mechanisms.noisy_argmin
    banded = correlated.banded_gaussian

    def spied_gaussian(x: mechanisms.Bounded, z: float, source: Any, noise: Any = mechanisms.CONTINUOUS) -> Any:
        skipped = spy.mutant == ("gaussian", sum(r.kind == "gaussian" for r in spy.releases), "skip")
        z, x = spy._mutate("gaussian", z, x)
        spy.record("gaussian", x)
        released = gaussian(x, z, source, noise)
        spy.releases[-1].value = released[0]
        return (released[0], dpa.NoOpDpEvent()) if skipped else released

    def spied_banded(x: mechanisms.Bounded, z: float, state: Any, source: Any, *, step: int) -> Any:
        z, x = spy._mutate("banded", z, x)
        spy.record("banded", x)
        return banded(x, z, state, source, step=step)

    def spied_add(tree: mechanisms.TreeAggregator, x: mechanisms.Bounded, source: Any) -> Any:
        z, _ = spy._mutate("tree", tree.noise_multiplier, x)
        if spy.mutant is not None and spy.mutant[:2] == ("tree", sum(r.kind == "tree" for r in spy.releases)) \
                and spy.mutant[2] == "sensitivity":
            tree = dataclasses.replace(tree, sensitivity=tree.sensitivity / 2)
        tree = dataclasses.replace(tree, noise_multiplier=z)
        spy.record("tree", mechanisms.Bounded(x.value, tree.sensitivity, mechanisms._CLIPPING_TOKEN))
        return add(tree, x, source)

    def spied_argmin(scores: mechanisms.Bounded, rho: float, source: Any) -> Any:
        rho, scores = spy._mutate("argmin", rho, scores)
        spy.record("argmin", scores)
        return argmin(scores, rho, source)

    monkeypatch.setattr(mechanisms, "gaussian", spied_gaussian)
    monkeypatch.setattr(mechanisms.TreeAggregator, "add", spied_add)
    monkeypatch.setattr(mechanisms, "noisy_argmin", spied_argmin)
    monkeypatch.setattr(correlated, "banded_gaussian", spied_banded)
    sample_gen, source, _ = train.randomness(3)
    queried = QueryOracle(spy)
    state = algo.init(torch.zeros(DIM, dtype=torch.float64), steps, sample_gen)
    ledger, thetas = Ledger(algo.relation()), [state.theta.clone()]
    for t in range(steps):
        spy.step = t
        sampler = sampler_of(algo, state, t)
        state, event = algo.step(state, Batch(t, sampler.sample(sample_gen), sampler), queried, source)
        ledger.record(event)
        thetas.append(state.theta.clone())
    return ledger, thetas


def adaptive_clip(algo: Any, releases: list[Release], step: int) -> float:
    """Adaptive clipping's C_t at ``step``, replayed from the counts released before it (the second
    release of each step): C_{t+1} = C_t·exp(−η(count/B + ½ − γ))."""
    clip = algo.clip
    for release in releases:
        if release.within == 1 and release.step < step:
            clip *= math.exp(-algo.clip_lr * (float(release.value) / algo.batch_size + 0.5 - algo.clip_quantile))
    return clip


def expected_sensitivity(name: str, algo: Any, release: Release, releases: list[Release]) -> float:
    """This file's own formula for the sensitivity of ``release`` (see the module docstring)."""
    if isinstance(algo, Wrapper):  # an update rule around an algorithm: the releases are the inner's
        algo = algo.inner
    f = relation_factor(algo.relation())
    if name.startswith("dpsgd-quantile"):  # the clipped sum at C_t, then the count (sensitivity ½·f)
        return f * (adaptive_clip(algo, releases, release.step) if release.within == 0 else 0.5)
    if name.startswith("dpsur"):  # the candidate's clipped gradient sum, then the test's clipped loss changes
        return f * (algo.clip if release.within == 0 else algo.val_clip)
    if release.kind == "argmin":
        return algo.obj_clip
    if release.kind == "tree":
        return 2 * max(algo.clip0 / algo.batch_size0, algo.clip / algo.batch_size)
    if name.startswith("aclip"):
        clip = algo.clip if name != "aclip-restarted" else algo._stage_of(release.step)[0].clip
        return 2 * clip
    if name.startswith("dpsrm"):
        return f * (algo.clip if release.step == 0 else algo.gamma * algo.clip + (1 - algo.gamma) * algo.clip_diff)
    if name.startswith("diff2"):
        if len(release.queries) == 1:  # a restart round: the clipped gradients at one point
            return 2 * algo.clip
        first, second = release.queries[-2:]  # the server's x_{r−1}, x_{r−2}; a local step's x_{k−1}, x_{k−2}
        clip = algo.clip_diff if release.within == 0 else algo.local.clip
        return 2 * clip * float((first - second).norm())
    if name.startswith("o2nc"):
        return 2 * (algo.clip0 if release.step % algo.period == 0 else algo.clip)
    return f * algo.clip  # DP-SGD, DP-GD, RRPSGD; DP-AGD's gradient releases


def violations(name: str, mutant: tuple[str, int, str] | None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the two checks find in a run of ``name`` with ``mutant`` (None: the honest code)."""
    case = TABLE[name]
    algo = case.make(1.0, 1.0)
    spy = Spy(mutant)
    found: list[str] = []
    try:
        ledger, _ = spied_run(algo, case.steps, spy, monkeypatch)
    except ValueError as err:  # a mechanism's own guard (e.g. an increment above the tree's sensitivity)
        return [f"refused: {err}"]
    planned = algo.planned_event(N, case.steps)
    try:
        accounting.guarantee(ledger.event(), planned, finished=True)
    except accounting.PlanMismatch as err:
        found.append(f"double entry: {err}")
    if case.adaptive:
        runs = accounting.run_length([ledger.event()])
        spent = math.fsum(count * accounting._zcdp_rho(atom) for atom, count in runs)
        if not math.isclose(spent, algo.rho_total, rel_tol=1e-9):
            found.append(f"double entry: the filter spent rho={spent}, not its budget {algo.rho_total}")
    for release in spy.releases:
        want = expected_sensitivity(name, algo, release, spy.releases)
        if not math.isclose(release.sensitivity, want, rel_tol=1e-9):
            found.append(f"sensitivity: {release.kind} release at step {release.step} claims {release.sensitivity}, "
                         f"its formula gives {want}")
    return found


def kinds(name: str) -> list[str]:
    return {"dpagd": ["gaussian", "argmin"], "o2nc-zeroth-single": ["tree"], "o2nc-first-single": ["tree"],
            "dpsgd-banded": ["banded"], "dpsgd-banded-adambc": ["banded"], "aclip-banded": ["banded"]}.get(
        name, ["gaussian"])


MUTANTS = [(name, kind, index, what) for name in PRIVATE for kind in kinds(name) for index in (0, 7)
           for what in ("noise", "sensitivity")]
# DIFF2-BVR: the server releases at call 0 of each round, the local steps at calls 1 and 2 (K = 3)
MUTANTS += [("diff2-bvr", "gaussian", index, what) for index in (1, 2, 5) for what in ("noise", "sensitivity")]
# DPSUR: the candidate releases at calls 0, 2, 4, …, the test at 1, 3, 5, … (index 7: step 3's test)
MUTANTS += [("dpsur", "gaussian", 1, what) for what in ("noise", "sensitivity")]
SKIPPED_TESTS = [("dpsur", "gaussian", index, "skip") for index in (1, 7, 59)]


@pytest.mark.parametrize("name", PRIVATE)
def test_the_honest_code_passes_both_checks(name, monkeypatch):
    assert violations(name, None, monkeypatch) == []


@pytest.mark.parametrize(("name", "kind", "index", "what"), MUTANTS)
def test_every_single_release_mutant_is_caught(name, kind, index, what, monkeypatch):
    found = violations(name, (kind, index, what), monkeypatch)
    assert found, f"{what} mutant of {kind} release {index} of {name} passed every check"


@pytest.mark.parametrize(("name", "kind", "index", "what"), SKIPPED_TESTS)
def test_a_step_that_drops_its_tests_event_is_caught_by_the_double_entry(name, kind, index, what, monkeypatch):
    """DPSUR with one test's event left out of the ledger (the first, a middle one, the last): the
    release itself is honest, so only the double entry can see it, and it does."""
    found = violations(name, (kind, index, what), monkeypatch)
    assert found and all(finding.startswith("double entry:") for finding in found), found


# ---------------------------------------------- a loss that couples records, on each engine


def clipped_sum_moved(engine: str) -> tuple[float, float]:
    """‖S(D′) − S(D)‖ and the sensitivity S claims, for S the clipped sum (C = 1, replace-one) of
    the batch-centred loss's per-record gradients over all 32 records, D′ = D with record 0
    replaced by the default canary (target −1e6)."""
    X, y = records()
    place = worlds.Neighbours(X, y, worlds.default_canary(X, y), dpa.NeighboringRelation.REPLACE_ONE)
    sums = []
    for present in (False, True):
        oracle = TorchModel(linear(), centred, *place.records(present=present), engine=engine)
        rows = oracle.per_record(oracle.flat_params().double(), torch.arange(len(X)))
        sums.append(clipping.clip_sum([clipping.Term(1.0, rows, 1.0)], place.relation)[0])
    return float((sums[1].value - sums[0].value).norm()), sums[0].sensitivity


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_a_loss_that_couples_records_moves_the_clipped_sum_by_at_most_its_sensitivity(engine):
    moved, sensitivity = clipped_sum_moved(engine)
    assert sensitivity == 2.0 and moved <= sensitivity * (1 + 1e-9)


def test_the_whole_batch_loss_mutant_is_caught(monkeypatch):
    """The ghost engine before its fix (``loss_fn`` on the whole batch): the canary's target
    reaches every record's gradient through the batch mean, and the clipped sum moves by more
    than 10 times the 2C it claims."""
    monkeypatch.setattr(TorchModel, "_per_record", whole_batch_per_record)
    moved, sensitivity = clipped_sum_moved("ghost")
    assert moved > 10 * sensitivity
