"""One meaning per event: ε does not depend on how events are grouped, PLD ≤ RDP, closed forms.

dpopt's convention: a noise multiplier z is (noise std) / (L2 distance between neighbouring
outputs) under every relation. ``accounting.in_accountant_terms`` is the one place that turns it
into each accountant's reading; these properties are checked over every event shape the library
emits (Gaussian, Poisson- and without-replacement-sampled Gaussian, binary trees, zCDP, no-ops).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from dpopt.accounting import Ledger, epsilon_of, in_accountant_terms

ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = NeighboringRelation.REPLACE_ONE
REPLACE_SPECIAL = NeighboringRelation.REPLACE_SPECIAL
DELTA = 1e-5


def analytic_gaussian_epsilon(z: float, delta: float) -> float:
    """ε(δ) of the Gaussian mechanism with noise z over a distance of 1 (Balle & Wang 2018):
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), μ = 1/z."""
    mu = 1 / z
    return optimize.brentq(lambda e: special.ndtr(-e / mu + mu / 2) - math.exp(e) * special.ndtr(-e / mu - mu / 2)
                           - delta, 0.0, 500.0, xtol=1e-13, rtol=1e-13)


def test_a_no_op_does_not_change_a_replace_one_composition():
    """Finding: 50 × Gaussian(2.0) under replace-one gave ε = 20.68 on the fast path and 54.38 once
    a NoOpDpEvent was composed in (the fallback read z against a distance of 2). Both are now
    the analytic Gaussian of z = 2/√50 (dpopt's z is the noise over the distance)."""
    gaussians = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 50)
    with_no_op = dpa.ComposedDpEvent([gaussians, dpa.NoOpDpEvent()])
    plain = epsilon_of(gaussians, DELTA, REPLACE_ONE)
    assert epsilon_of(with_no_op, DELTA, REPLACE_ONE) == plain
    assert plain == pytest.approx(analytic_gaussian_epsilon(2.0 / math.sqrt(50), DELTA), rel=1e-9)
    assert plain == pytest.approx(20.6755, abs=1e-3)
    ledger = Ledger(REPLACE_ONE)
    for _ in range(50):
        ledger.record(dpa.GaussianDpEvent(2.0))
        ledger.record(dpa.NoOpDpEvent())
    assert ledger.epsilon(DELTA) == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("relation", [ADD_REMOVE, REPLACE_ONE])
def test_translation_is_the_only_difference_between_relations_for_an_unsampled_gaussian(relation):
    """PLD reads replace-one z against ±1: the translation doubles it; RDP reads it as dpopt does."""
    event = dpa.GaussianDpEvent(1.5)
    pld = in_accountant_terms(event, relation, "pld")
    assert pld == dpa.GaussianDpEvent(3.0 if relation == REPLACE_ONE else 1.5)
    assert in_accountant_terms(event, relation, "rdp") == event
    reference = pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=1e-4)
    reference.compose(pld)
    exact = analytic_gaussian_epsilon(1.5, DELTA)
    assert exact <= reference.get_epsilon(DELTA) <= exact * 1.01  # dp_accounting agrees once translated
    assert epsilon_of(event, DELTA, relation) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("relation", [REPLACE_SPECIAL, REPLACE_ONE])
@pytest.mark.parametrize(("z", "lengths"), [(3.0, [100, 100, 37]), (0.9, [7]), (10.0, [1])])
def test_a_tree_is_exactly_one_gaussian_of_its_depth(relation, z, lengths):
    """A record moves the ⌈log₂(L+1)⌉ nodes above its increment: the Gaussian of z/√depth, exactly
    (PLD); RDP gives dp_accounting's tree RDP, an upper bound."""
    depth = math.ceil(math.log2(max(lengths) + 1))
    tree = dpa.SingleEpochTreeAggregationDpEvent(z, lengths)
    exact = analytic_gaussian_epsilon(z / math.sqrt(depth), DELTA)
    assert epsilon_of(tree, DELTA, relation) == pytest.approx(exact, rel=1e-9)
    rdp = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE_SPECIAL)
    rdp.compose(tree)
    assert epsilon_of(tree, DELTA, relation, "rdp") == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-12)
    assert exact <= rdp.get_epsilon(DELTA)


# ------------------------------------------------------------------------------ property tests

def atoms(relation: NeighboringRelation) -> st.SearchStrategy[dpa.DpEvent]:
    """The atomic events dpopt emits under ``relation``."""
    z = st.floats(0.6, 6.0)
    if relation == ADD_REMOVE:
        return st.builds(lambda q, s: dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)),
                         st.floats(0.005, 0.2), z)
    gaussian = st.builds(dpa.GaussianDpEvent, z)
    tree = st.builds(lambda s, lengths: dpa.SingleEpochTreeAggregationDpEvent(s, lengths), z,
                     st.lists(st.integers(1, 64), min_size=1, max_size=3))
    if relation == REPLACE_SPECIAL:
        return tree
    wor = st.builds(lambda b, s: dpa.SampledWithoutReplacementDpEvent(400, b, dpa.GaussianDpEvent(s)),
                    st.integers(4, 40), z)
    zcdp = st.builds(dpa.ZCDpEvent, st.floats(0.001, 0.3))
    return st.one_of(gaussian, tree, wor, zcdp)


@st.composite
def regrouped(draw: st.DrawFn, relation: NeighboringRelation) -> tuple[dpa.DpEvent, dpa.DpEvent]:
    """An event as runs ``Composed([SelfComposed(a_i, k_i)])``, and the same multiset of atoms
    grouped otherwise: runs split in two, shuffled, nested, with no-ops in between."""
    runs = draw(st.lists(st.tuples(atoms(relation), st.integers(1, 30)), min_size=1, max_size=3))
    plain = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(atom, k) for atom, k in runs])
    pieces: list[dpa.DpEvent] = []
    for atom, k in runs:
        cut = draw(st.integers(0, k))
        pieces += [dpa.SelfComposedDpEvent(atom, cut), dpa.NoOpDpEvent(), dpa.SelfComposedDpEvent(atom, k - cut)]
    pieces = draw(st.permutations(pieces))
    middle = draw(st.integers(0, len(pieces)))
    other = dpa.ComposedDpEvent([dpa.ComposedDpEvent(pieces[:middle]), dpa.NoOpDpEvent(),
                                 dpa.SelfComposedDpEvent(dpa.ComposedDpEvent(pieces[middle:]), 1)])
    return plain, other


@pytest.mark.parametrize("relation", [ADD_REMOVE, REPLACE_ONE, REPLACE_SPECIAL])
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_epsilon_does_not_depend_on_grouping_and_pld_is_at_most_rdp(relation, data):
    plain, other = data.draw(regrouped(relation))
    for accountant in ("pld", "rdp"):
        assert epsilon_of(other, DELTA, relation, accountant) == pytest.approx(
            epsilon_of(plain, DELTA, relation, accountant), rel=1e-9)
    assert epsilon_of(plain, DELTA, relation, "pld") <= epsilon_of(plain, DELTA, relation, "rdp") * (1 + 1e-9)


@pytest.mark.parametrize("relation", [ADD_REMOVE, REPLACE_ONE])
@settings(max_examples=10, deadline=None, derandomize=True)
@given(zs=st.lists(st.tuples(st.floats(1.0, 8.0), st.integers(1, 50)), min_size=1, max_size=4))
def test_composed_gaussians_are_the_analytic_gaussian(relation, zs):
    event = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), k) for z, k in zs])
    z = math.fsum(k / z**2 for z, k in zs) ** -0.5
    assert epsilon_of(event, DELTA, relation) == pytest.approx(analytic_gaussian_epsilon(z, DELTA), rel=1e-9)
