"""Accounting: ε against dp_accounting, calibration round trips, the ledger, fallbacks, errors."""

from __future__ import annotations

import math
import pickle

import dp_accounting as dpa
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

import dpopt
from dpopt import accounting
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger, calibrate, canonical, epsilon_of, fast, solve_noise

ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = NeighboringRelation.REPLACE_ONE
DELTA = 1e-5


def poisson_step(rate: float = 0.02, z: float = 1.3) -> dpa.DpEvent:
    return dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(z))


def test_epsilon_matches_dp_accounting_pld_default():
    event = dpa.SelfComposedDpEvent(poisson_step(0.02, 1.3), 1500)
    reference = pld_privacy_accountant.PLDAccountant(ADD_REMOVE)  # default grid 1e-4
    reference.compose(event)
    want = reference.get_epsilon(DELTA)
    got = epsilon_of(event, DELTA, ADD_REMOVE)
    assert got == pytest.approx(want, rel=1e-3)
    assert 2.9 < got < 3.2  # the well-known order of magnitude for these settings


def test_epsilon_rdp_matches_dp_accounting():
    event = dpa.SelfComposedDpEvent(poisson_step(0.02, 1.3), 1500)
    reference = rdp_privacy_accountant.RdpAccountant(neighboring_relation=ADD_REMOVE)
    reference.compose(event)
    assert epsilon_of(event, DELTA, ADD_REMOVE, accountant="rdp") == reference.get_epsilon(DELTA)
    # RDP is looser than PLD (both upper bounds; PLD is nearly tight).
    assert epsilon_of(event, DELTA, ADD_REMOVE, accountant="rdp") > epsilon_of(event, DELTA, ADD_REMOVE)


@pytest.mark.parametrize(("steps", "epsilon", "batch"), [(50, 0.5, 40), (1000, 2.0, 8), (100_000, 8.0, 4)])
def test_calibrate_dpsgd_round_trip(steps, epsilon, batch):
    n = 400
    algo = calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=batch),
                     epsilon=epsilon, delta=DELTA, n=n, steps=steps)
    achieved = epsilon_of(algo.planned_event(n, steps), DELTA, algo.relation())
    assert 0.99 * epsilon <= achieved <= epsilon
    assert algo.lr == 0.1 and algo.clip == 1.0 and algo.batch_size == batch  # only the noise changed


@pytest.mark.parametrize(("steps", "epsilon"), [(200, 1.0), (3000, 4.0)])
def test_solve_noise_round_trip(steps, epsilon):
    scale, achieved = solve_noise(lambda s: dpa.SelfComposedDpEvent(poisson_step(0.05, s), steps),
                                  epsilon=epsilon, delta=DELTA, relation=ADD_REMOVE)
    assert achieved == epsilon_of(dpa.SelfComposedDpEvent(poisson_step(0.05, scale), steps), DELTA, ADD_REMOVE)
    assert 0.99 * epsilon <= achieved <= epsilon


def test_solve_noise_on_a_given_grid_is_checked_on_that_grid():
    """``grid``: every evaluation and the final check on that PLD grid, which may be finer than the
    ledger's (here 1e-3): ε on the ledger's grid is then slightly above the target, never on its
    own; a tighter ``tolerance`` lands closer to the target; ``calibrate`` passes its tolerance on."""
    def event_of(scale: float) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(poisson_step(0.01, scale), 2000)

    scale, achieved = solve_noise(event_of, epsilon=2.0, delta=DELTA, relation=ADD_REMOVE, tolerance=1e-4, grid=1e-4)
    assert achieved == epsilon_of(event_of(scale), DELTA, ADD_REMOVE, "pld", 1e-4)
    assert (1 - 2e-4) * 2.0 <= achieved <= 2.0 < epsilon_of(event_of(scale), DELTA, ADD_REMOVE)
    tight = calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=20), epsilon=1.0, delta=DELTA,
                      n=400, steps=50, tolerance=1e-4)
    assert (1 - 2e-4) <= epsilon_of(tight.planned_event(400, 50), DELTA, ADD_REMOVE) <= 1.0
    with pytest.raises(DpoptError, match=r"tolerance=0.5 must be in \(0, 0.5\)"):
        solve_noise(event_of, epsilon=2.0, delta=DELTA, relation=ADD_REMOVE, tolerance=0.5)
    with pytest.raises(DpoptError, match=r"grid=0.01 must be in \[1e-05, 0.001\]"):
        solve_noise(event_of, epsilon=2.0, delta=DELTA, relation=ADD_REMOVE, grid=0.01)


def test_calibrate_dpsrm_jointly_keeps_the_ratio():
    n, steps, epsilon = 400, 300, 1.0
    base = dpopt.DPSRM(lr=0.1, clip=1.0, clip_diff=0.1, gamma=0.1, noise_multiplier0=1.0, noise_multiplier=1.0,
                       batch_size0=80, batch_size=20)
    algo = calibrate(base, epsilon=epsilon, delta=DELTA, n=n, steps=steps, ratios=(2.0, 1.0))
    assert algo.noise_multiplier0 == pytest.approx(2.0 * algo.noise_multiplier, rel=1e-12)
    achieved = epsilon_of(algo.planned_event(n, steps), DELTA, algo.relation())
    assert 0.99 * epsilon <= achieved <= epsilon


def test_calibrate_with_fixed_size_sampling_uses_rdp():
    n, steps, epsilon = 400, 200, 2.0
    algo = calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=20,
                                 sampling=dpopt.sampling.FixedSize),
                     epsilon=epsilon, delta=DELTA, n=n, steps=steps)
    event = algo.planned_event(n, steps)
    assert accounting.accountant_for(event, REPLACE_ONE, "pld") == "rdp"
    achieved = epsilon_of(event, DELTA, REPLACE_ONE)
    assert 0.99 * epsilon <= achieved <= epsilon


def test_ledger_records_and_is_monotone():
    ledger = Ledger(ADD_REMOVE)
    assert ledger.steps == 0 and ledger.epsilon(DELTA) == 0.0
    step = poisson_step(0.05, 1.0)
    previous = 0.0
    for k in range(1, 9):
        ledger.record(step)
        eps = ledger.epsilon(DELTA)
        assert eps > previous
        assert eps == epsilon_of(dpa.SelfComposedDpEvent(step, k), DELTA, ADD_REMOVE)
        previous = eps
    assert ledger.steps == 8
    assert ledger.event() == dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(step, 8)])
    assert ledger.accountant == "pld" and ledger.neighboring_relation == "add/remove-one"
    # A smaller δ costs more ε.
    assert ledger.epsilon(1e-8) > ledger.epsilon(DELTA)


def test_ledger_merges_runs_and_keeps_order():
    a, b = poisson_step(0.05, 1.0), poisson_step(0.2, 2.0)
    ledger = Ledger(ADD_REMOVE)
    for event in (a, a, dpa.SelfComposedDpEvent(a, 3), b, dpa.ComposedDpEvent([b, a])):
        ledger.record(event)
    assert ledger.event() == dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(a, 5), dpa.SelfComposedDpEvent(b, 2), dpa.SelfComposedDpEvent(a, 1)])
    assert ledger.steps == 8
    assert canonical(dpa.ComposedDpEvent([a, dpa.SelfComposedDpEvent(a, 4), b, b, a])) == ledger.event()
    assert accounting.count_steps(ledger.event()) == 8


def test_a_finished_run_must_have_recorded_the_whole_plan():
    """Finding (issue 39): the double entry accepted any prefix of the plan, so a step that left its
    event out (the same atom every step, or the last step's) went unseen and the run claimed the ε
    of fewer releases. While the run goes on a prefix is right; once it took every step, only the
    whole plan is."""
    step = poisson_step(0.05, 1.0)
    planned = dpa.SelfComposedDpEvent(step, 10)
    short = dpa.SelfComposedDpEvent(step, 9)
    assert accounting.guarantee(short, planned) == short  # mid-run: a prefix is what was spent so far
    assert accounting.guarantee(planned, planned, finished=True) == planned
    with pytest.raises(accounting.PlanMismatch, match="took every planned step but recorded 9 of its plan's 10 "
                                                      "events: a release's event is missing"):
        accounting.guarantee(short, planned, finished=True)


def test_ledger_state_round_trip():
    a, b = poisson_step(0.05, 1.0), poisson_step(0.2, 2.0)
    ledger = Ledger(ADD_REMOVE, "rdp")
    for event in (a, a, b):
        ledger.record(event)
    eps = ledger.epsilon(DELTA)
    state = pickle.loads(pickle.dumps(ledger.state()))
    assert state["relation"] == "ADD_OR_REMOVE_ONE" and state["accountant"] == "rdp"
    restored = Ledger.from_state(state)
    assert restored.event() == ledger.event()
    assert restored.relation == ADD_REMOVE and restored.requested_accountant == "rdp"
    assert restored.epsilon(DELTA) == eps
    # Recording continues where it left off, and the cached ε is invalidated.
    restored.record(b)
    ledger.record(b)
    assert restored.event() == ledger.event()
    assert restored.epsilon(DELTA) == ledger.epsilon(DELTA) > eps


def test_pld_falls_back_to_rdp_for_sampling_without_replacement():
    event = dpa.SampledWithoutReplacementDpEvent(400, 20, dpa.GaussianDpEvent(1.5))
    ledger = Ledger(REPLACE_ONE, "pld")
    for _ in range(100):
        ledger.record(event)
    assert ledger.accountant == "rdp"
    reference = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE_ONE)
    reference.compose(dpa.SelfComposedDpEvent(event, 100))
    assert ledger.epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    assert ledger.neighboring_relation == "replace-one"


def test_non_private_events_cost_infinity():
    ledger = Ledger(ADD_REMOVE)
    ledger.record(poisson_step())
    ledger.record(dpa.NonPrivateDpEvent())
    assert math.isinf(ledger.epsilon(DELTA))


@pytest.mark.parametrize(("event", "relation"), [
    (dpa.GaussianDpEvent(0.0), REPLACE_ONE),
    (dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(0.0)), ADD_REMOVE),
    (dpa.SampledWithoutReplacementDpEvent(400, 40, dpa.GaussianDpEvent(0.0)), REPLACE_ONE),
])
def test_zero_noise_costs_infinity_under_every_sampler(event, relation):
    """Noise multiplier 0 is every algorithm's non-private reference (docs/algorithms.md §5): its ε is
    ∞, whichever accountant the event needs (dp_accounting's RDP divides by σ² for sampling
    without replacement)."""
    ledger = Ledger(relation)
    for _ in range(3):
        ledger.record(event)
    assert math.isinf(ledger.epsilon(DELTA))
    assert math.isinf(epsilon_of(dpa.SelfComposedDpEvent(event, 3), DELTA, relation))


@pytest.mark.parametrize("delta", [0, 1, -0.1, 1.5, math.nan])
def test_bad_delta_is_named(delta):
    ledger = Ledger(ADD_REMOVE)
    ledger.record(poisson_step())
    with pytest.raises(DpoptError, match=r"delta="):
        ledger.epsilon(delta)
    with pytest.raises(DpoptError, match=r"delta="):
        solve_noise(lambda s: poisson_step(0.05, s), epsilon=1.0, delta=delta, relation=ADD_REMOVE)
    with pytest.raises(DpoptError, match=r"delta="):
        calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10), epsilon=1.0, delta=delta,
                  n=400, steps=10)


@pytest.mark.parametrize("delta", [0, 1, 2.0, -1e-5])
def test_epsilon_of_rejects_bad_delta(delta):
    """epsilon_of is public (dpopt.epsilon_of): δ = 2 must not quietly report ε = 0."""
    with pytest.raises(DpoptError, match=rf"delta={delta!r} must be in \(0, 1\)"):
        epsilon_of(dpa.SelfComposedDpEvent(poisson_step(), 10), delta, ADD_REMOVE)


@pytest.mark.parametrize("epsilon", [0, -1, math.inf])
def test_bad_epsilon_is_named(epsilon):
    with pytest.raises(DpoptError, match=rf"epsilon={epsilon!r} must be > 0"):
        solve_noise(lambda s: poisson_step(0.05, s), epsilon=epsilon, delta=DELTA, relation=ADD_REMOVE)
    with pytest.raises(DpoptError, match=rf"epsilon={epsilon!r} must be > 0"):
        calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10), epsilon=epsilon, delta=DELTA,
                  n=400, steps=10)


def test_other_bad_arguments_are_named():
    with pytest.raises(DpoptError, match=r"accountant='moments' must be one of: pld, rdp"):
        Ledger(ADD_REMOVE, "moments")
    with pytest.raises(DpoptError, match=r"accountant='moments' must be one of: pld, rdp"):
        epsilon_of(poisson_step(), DELTA, ADD_REMOVE, accountant="moments")
    with pytest.raises(DpoptError, match=r"steps=0 must be an integer >= 1|steps=0 must be >= 1"):
        calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10), epsilon=1.0, delta=DELTA,
                  n=400, steps=0)
    with pytest.raises(DpoptError, match=r"noise_ratios=\(1.0, 2.0\) must have one entry per field"):
        calibrate(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10), epsilon=1.0, delta=DELTA,
                  n=400, steps=10, ratios=(1.0, 2.0))


def test_pld_discretization_bounds():
    assert accounting.pld_discretization(100.0, 1) == accounting.COARSE_DISCRETIZATION
    assert accounting.pld_discretization(1e-3, 10**6) == accounting.FINEST_DISCRETIZATION
    assert accounting.pld_discretization(0.3, 100) == pytest.approx(0.3 / 300, rel=1e-12)


@pytest.mark.parametrize("relation", [NeighboringRelation.REPLACE_ONE, NeighboringRelation.ADD_OR_REMOVE_ONE])
def test_composed_gaussians_are_one_gaussian_exactly(relation):
    """Σ k_i/z_i² = 1/z²: the closed form agrees with dp_accounting's PLD accountant on the composed
    events (its pessimistic estimate on a fine grid is an upper bound, within 1 %) and is below RDP.
    z is the noise over the distance between neighbouring outputs under both relations, so the
    replace-one value is the add/remove one (dp_accounting's PLD reads z under replace-one against a
    distance of 2: see dpopt.accounting.fast; its RDP reads it as dpopt does)."""
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    event = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(0.8), 3),
                                 dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 50)])
    ours = epsilon_of(event, 1e-5, relation)
    pld = pld_privacy_accountant.PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE,
                                               value_discretization_interval=1e-4)
    pld.compose(event)
    rdp = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    rdp.compose(event)
    assert 0.99 * pld.get_epsilon(1e-5) <= ours <= pld.get_epsilon(1e-5)
    assert ours < rdp.get_epsilon(1e-5)
    single = epsilon_of(dpa.GaussianDpEvent((3 / 0.8**2 + 50 / 2.0**2) ** -0.5), 1e-5, relation)
    assert ours == pytest.approx(single, rel=1e-12)


def test_each_pld_is_built_once_per_grid(monkeypatch):
    """ε on the default grid memoises the answers of both grids it reads (the coarse one that
    picks the grid, and the picked one): a calibration, which evaluates on the picked grid and then
    checks its answer by the default path, builds no PLD twice (it once built two more per call)."""
    built = []
    real = fast.sampled_gaussians_pld
    monkeypatch.setattr(fast, "sampled_gaussians_pld", lambda runs, relation, grid: built.append((repr(runs), grid))
                        or real(runs, relation, grid))
    accounting._EPSILON_CACHE.clear()
    relation = NeighboringRelation.ADD_OR_REMOVE_ONE

    def event_of(z: float) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(z)), 300)

    grid = accounting.ledger_grid(event_of(3.0), 1e-5, relation)
    on_grid = epsilon_of(event_of(3.0), 1e-5, relation, "pld", grid)
    assert grid < accounting.COARSE_DISCRETIZATION and len(built) == 2
    assert epsilon_of(event_of(3.0), 1e-5, relation) == on_grid and len(built) == 2
    solve_noise(event_of, epsilon=0.3, delta=1e-5, relation=relation)
    assert len(built) == len(set(built)) > 2


def test_a_noiseless_gaussian_is_found_inside_every_event_of_dp_accounting_that_wraps_another():
    """ε = ∞ for a release without noise, however it is wrapped: the events looked into are the
    named tuple of wrapping types (no attribute probe), which must list every dp_accounting event
    with an ``event`` field, so a wrapper added by a new dp_accounting is not silently skipped."""
    from dp_accounting import dp_event

    from dpopt.accounting.epsilon import WRAPPING_EVENTS, _has_noiseless_gaussian

    wrapping = {cls for cls in vars(dp_event).values() if isinstance(cls, type) and issubclass(cls, dpa.DpEvent)
                and "event" in {a.name for a in getattr(cls, "__attrs_attrs__", ())}}
    assert wrapping == set(WRAPPING_EVENTS)
    bare = dpa.GaussianDpEvent(0.0)
    wrapped = [dpa.SelfComposedDpEvent(bare, 3), dpa.PoissonSampledDpEvent(0.1, bare),
               dpa.SampledWithReplacementDpEvent(100, 10, bare), dpa.SampledWithoutReplacementDpEvent(100, 10, bare),
               dp_event.RepeatAndSelectDpEvent(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), bare]), 3.0, 1.0)]
    assert [_has_noiseless_gaussian(event) for event in wrapped] == [True] * 5
    assert not _has_noiseless_gaussian(dpa.SelfComposedDpEvent(bare, 0))  # repeated zero times: nothing released
    assert not _has_noiseless_gaussian(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0)))
    assert epsilon_of(dpa.PoissonSampledDpEvent(0.1, bare), 1e-5, NeighboringRelation.ADD_OR_REMOVE_ONE) == math.inf
