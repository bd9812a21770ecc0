"""dpopt.accounting.fast.gaussian_pld builds exactly dp_accounting's Gaussian PLD (vectorised inverse privacy loss)."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpopt.accounting.fast import gaussian_pld

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
    theirs = pld_lib.from_gaussian_mechanism(standard_deviation=z, value_discretization_interval=grid,
                                             sampling_prob=rate, neighboring_relation=relation)
    for (lo_a, p_a, inf_a), (lo_b, p_b, inf_b) in zip(_pmfs(ours), _pmfs(theirs), strict=True):
        assert lo_a == lo_b and p_a.shape == p_b.shape
        np.testing.assert_allclose(p_a, p_b, rtol=1e-9, atol=1e-300)
        assert inf_a == pytest.approx(inf_b, rel=1e-9, abs=1e-300)
    for steps in (1, 300):
        a = ours.self_compose(steps).get_epsilon_for_delta(1e-5)
        b = theirs.self_compose(steps).get_epsilon_for_delta(1e-5)
        assert a == pytest.approx(b, rel=1e-9)
