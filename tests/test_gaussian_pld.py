"""dpopt.gaussian_pld builds exactly dp_accounting's Gaussian PLD (vectorised inverse privacy loss)."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import optimize, special

from dpopt.gaussian_pld import gaussian_pld

ADD_REMOVE, REPLACE = NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE
CASES = [  # (noise multiplier, sampling rate, relation, grid)
    (0.5, 0.02, ADD_REMOVE, 1e-3), (0.8, 0.02, ADD_REMOVE, 1e-3), (1.3, 0.3, ADD_REMOVE, 1e-3),
    (4.0, 0.001, ADD_REMOVE, 1e-4), (30.0, 0.02, ADD_REMOVE, 1e-5), (1.0, 1.0, ADD_REMOVE, 1e-3),
    (2.0, 0.5, NeighboringRelation.REPLACE_SPECIAL, 1e-3), (1.5, 1.0, REPLACE, 1e-3), (5.0, 1.0, REPLACE, 1e-3),
]


def _pmfs(pld: pld_lib.PrivacyLossDistribution) -> list[tuple[int, np.ndarray, float]]:
    out = []
    for pmf in {id(p): p for p in (pld._pmf_remove, pld._pmf_add)}.values():
        dense = pmf.to_dense_pmf()
        out.append((dense._lower_loss, np.asarray(dense._probs), dense._infinity_mass))
    return out


@pytest.mark.parametrize("z, rate, relation, grid", CASES)
def test_same_pmf_and_epsilon_as_dp_accounting(z: float, rate: float, relation: NeighboringRelation,
                                               grid: float) -> None:
    ours = gaussian_pld(z, grid, relation, sampling_prob=rate)
    std = 2 * z if relation == REPLACE else z  # dp_accounting's REPLACE shifts by ±std·z: distance 2
    theirs = pld_lib.from_gaussian_mechanism(standard_deviation=std, value_discretization_interval=grid,
                                             sampling_prob=rate, neighboring_relation=relation)
    for (lo_a, p_a, inf_a), (lo_b, p_b, inf_b) in zip(_pmfs(ours), _pmfs(theirs), strict=True):
        assert lo_a == lo_b and p_a.shape == p_b.shape
        np.testing.assert_allclose(p_a, p_b, rtol=1e-9, atol=1e-300)
        assert inf_a == pytest.approx(inf_b, rel=1e-9, abs=1e-300)
    for steps in (1, 300):
        a = ours.self_compose(steps).get_epsilon_for_delta(1e-5)
        b = theirs.self_compose(steps).get_epsilon_for_delta(1e-5)
        assert a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize("z", [0.7, 2.0, 6.0])
def test_replace_one_is_accounted_at_the_distance_between_neighbouring_outputs(z: float) -> None:
    """Under replace-one, z = std / Δ with Δ the distance between neighbouring sums, so one step is
    the pair N(0, z²Δ²), N(Δ, z²Δ²): exactly the add/remove Gaussian of the same z, whose ε(δ)
    is the analytic Gaussian mechanism's (Balle and Wang 2018), which RDP bounds from above."""
    replace = gaussian_pld(z, 1e-4, REPLACE).get_epsilon_for_delta(1e-5)
    add_remove = gaussian_pld(z, 1e-4, ADD_REMOVE).get_epsilon_for_delta(1e-5)
    assert replace == pytest.approx(add_remove, rel=1e-9)
    mu = 1 / z  # analytic: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)
    exact = optimize.brentq(lambda e: special.ndtr(-e / mu + mu / 2) - math.exp(e) * special.ndtr(-e / mu - mu / 2)
                            - 1e-5, 1e-9, 100)
    assert exact <= replace <= exact * 1.01 + 2e-4  # pessimistic discretisation: an upper bound, and tight
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=REPLACE).compose(dpa.GaussianDpEvent(z)).get_epsilon(1e-5)
    assert replace <= rdp
