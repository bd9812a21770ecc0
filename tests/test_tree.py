"""The binary-tree mechanism (Algorithm 1): exact prefix sums without noise, the variance of each
released prefix equal to (number of covering nodes)·σ², the covariance of two prefixes equal to
(shared nodes)·σ², and its event as dp_accounting accounts it (library and command line)."""

from __future__ import annotations

import dataclasses
import json
import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, special, stats

from dpopt import clipping, mechanisms
from dpopt.mechanisms import SeededNoise
from dpopt.accounting import epsilon_of
from dpopt.cli import main

SPECIAL = NeighboringRelation.REPLACE_SPECIAL


def increment(rows: torch.Tensor, clip: float) -> mechanisms.Bounded:
    bounded, _ = clipping.clip_sum([clipping.Term(1.0, clipping.Dense(rows), clip)], SPECIAL)
    return bounded


def test_prefix_sums_are_exact_without_noise():
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(11)]
    tree = mechanisms.TreeAggregator((11,), 0.0, 2.0)
    running = torch.zeros(4, dtype=torch.float64)
    for batch in rows:
        bounded = increment(batch, 1.0)
        tree, released, _ = tree.add(bounded, SeededNoise(0))
        running += bounded.value
        assert torch.allclose(released, running, rtol=0, atol=1e-12)
    assert tree.count == 11


def test_trees_restart_from_zero_and_the_first_release_carries_the_whole_passs_event():
    """Two trees of lengths (3, 2): the fourth increment starts the second tree from zero; the
    first release returns the event of both trees, the others no-ops."""
    tree = mechanisms.TreeAggregator((3, 2), 0.0, 2.0)
    ones = increment(torch.full((1, 2), 0.5, dtype=torch.float64), 1.0)
    events, released = [], []
    for _ in range(5):
        tree, value, event = tree.add(ones, SeededNoise(0))
        events.append(event)
        released.append(float(value[0]))
    assert released == [0.5, 1.0, 1.5, 0.5, 1.0]
    assert events[0] == dpa.SingleEpochTreeAggregationDpEvent(0.0, [3, 2])
    assert all(event == dpa.NoOpDpEvent() for event in events[1:])


def nodes_covering(t: int) -> int:
    """Algorithm 1's NODE(t): one dyadic node per set bit of t."""
    return bin(t).count("1")


def test_released_prefix_variance_is_covering_nodes_times_sigma_squared():
    """Zero increments, d = 20,000 coordinates: Σ_k (released_k)² / (cσ²) is χ²_d for c the nodes
    covering t (two-sided 1e-6 bounds, Bonferroni over the 13 positions); c ± 1 is rejected."""
    length, dim, z, clip = 13, 20_000, 1.7, 0.6
    sigma2 = (z * clip) ** 2
    tree, source = mechanisms.TreeAggregator((length,), z, 2 * clip), SeededNoise(5)
    sigma2 = (z * 2 * clip) ** 2
    zero = torch.zeros(1, dim, dtype=torch.float64)
    lo, hi = stats.chi2.ppf([1e-6 / 26, 1 - 1e-6 / 26], dim)
    released = []
    for t in range(1, length + 1):
        tree, noised, _ = tree.add(increment(zero, clip), source)
        released.append(noised)
        assert len(tree.live) == nodes_covering(t) <= t.bit_length()  # O(log Σ) live nodes
        squares = float(noised.square().sum())
        count = nodes_covering(t)
        assert lo <= squares / (count * sigma2) <= hi, t
        for wrong in (count - 1, count + 1):
            if wrong > 0:
                assert not lo <= squares / (wrong * sigma2) <= hi, (t, wrong)
    # Cov(prefix_s, prefix_t) = (shared nodes)·σ²: 4 = [0,4); 5 = [0,4)+[4,5); 7 = [0,4)+[4,6)+[6,7); 8 = [0,8)
    for s, t, shared in ((4, 5, 1), (4, 7, 1), (5, 7, 1), (6, 7, 2), (7, 8, 0), (3, 4, 0)):
        mean_product = float((released[s - 1] * released[t - 1]).mean()) / sigma2
        std = (nodes_covering(s) * nodes_covering(t) + shared**2) ** 0.5 / dim**0.5
        assert abs(mean_product - shared) < 5.5 * std, (s, t, mean_product)


def test_node_noise_comes_from_the_source_once_per_node():
    """Equal sources give equal releases, other sources other ones; a live node keeps its noise:
    with zero increments, prefix 4 is node [0,4)'s noise and prefix 5 adds node [4,5)'s."""
    zero = torch.zeros(1, 6, dtype=torch.float64)
    a, b, c = (mechanisms.TreeAggregator((8,), 1.0, 2.0) for _ in range(3))
    sa, sb, sc = SeededNoise(3), SeededNoise(3), SeededNoise(4)
    outs, lives = [], []
    for _ in range(8):
        a, x, _ = a.add(increment(zero, 1.0), sa)
        b, y, _ = b.add(increment(zero, 1.0), sb)
        c, w, _ = c.add(increment(zero, 1.0), sc)
        assert torch.equal(x, y) and not torch.equal(x, w)
        outs.append(x)
        lives.append({(level, index): noise for level, index, noise in a.live})
    assert set(lives[3]) == {(2, 0)} and torch.equal(outs[3], lives[3][(2, 0)])
    assert set(lives[4]) == {(2, 0), (0, 4)} and lives[4][(2, 0)] is lives[3][(2, 0)]
    assert torch.equal(outs[4], lives[4][(2, 0)] + lives[4][(0, 4)])


def test_a_release_with_other_settings_than_the_recorded_event_is_refused():
    """The whole pass's event is recorded with the first release: a later release with another
    noise multiplier (or sensitivity) would not be covered by it."""
    tree, _, _ = mechanisms.TreeAggregator((4,), 1.0, 2.0).add(increment(torch.ones(1, 2, dtype=torch.float64), 1.0),
                                                                 SeededNoise(0))
    with pytest.raises(ValueError, match="an increment cannot be released with"):
        dataclasses.replace(tree, noise_multiplier=0.5).add(increment(torch.ones(1, 2, dtype=torch.float64), 1.0),
                                                            SeededNoise(0))


def test_tree_refuses_too_sensitive_or_too_many_increments():
    tree = mechanisms.TreeAggregator((1,), 1.0, 0.5)
    with pytest.raises(ValueError, match="exceeds the tree's 0.5"):
        tree.add(increment(torch.ones(1, 2, dtype=torch.float64), 1.0), SeededNoise(0))
    tree, _, _ = tree.add(increment(torch.ones(1, 2, dtype=torch.float64), 0.5), SeededNoise(0))
    with pytest.raises(ValueError, match=r"lengths=\(1,\) increments; they are full"):
        tree.add(increment(torch.ones(1, 2, dtype=torch.float64), 0.5), SeededNoise(0))
    with pytest.raises(ValueError, match="finite sensitivity"):
        mechanisms.TreeAggregator((4,), 1.0, float("inf"))


def rdp_epsilon(event: dpa.DpEvent, delta: float) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=SPECIAL)
    return accountant.compose(event).get_epsilon(delta)


def analytic_epsilon(z: float, delta: float) -> float:
    """ε(δ) of the Gaussian mechanism with noise z over a distance of 1 (Balle & Wang 2018)."""
    mu = 1 / z
    return optimize.brentq(lambda e: special.ndtr(-e / mu + mu / 2) - math.exp(e) * special.ndtr(-e / mu - mu / 2)
                           - delta, 0.0, 500.0, xtol=1e-13, rtol=1e-13)


def test_tree_event_is_one_gaussian_of_its_depth_and_disjoint_trees_cost_one_tree():
    """A record enters ⌈log₂(16 + 1)⌉ = 5 nodes: exactly the Gaussian of z/√5 (PLD), below RDP."""
    one = mechanisms.TreeAggregator((16,), 2.0, 1.0).add(increment(torch.ones(1, 2, dtype=torch.float64), 0.5),
                                                          SeededNoise(0))[2]
    assert one == dpa.SingleEpochTreeAggregationDpEvent(2.0, [16])
    eps = epsilon_of(one, 1e-5, SPECIAL)
    assert eps == pytest.approx(analytic_epsilon(2.0 / math.sqrt(5), 1e-5), rel=1e-9)
    assert eps < rdp_epsilon(dpa.SingleEpochTreeAggregationDpEvent(2.0, 16), 1e-5)
    assert epsilon_of(one, 1e-5, SPECIAL, "rdp") == pytest.approx(
        rdp_epsilon(dpa.SingleEpochTreeAggregationDpEvent(2.0, 16), 1e-5), rel=1e-12)
    # trees on disjoint records (one pass): the deepest tree's ε, not a composition
    assert epsilon_of(mechanisms.tree_event(2.0, [16, 16, 16, 5]), 1e-5, SPECIAL) == pytest.approx(eps, rel=1e-12)
    assert epsilon_of(dpa.SelfComposedDpEvent(one, 4), 1e-5, SPECIAL) > 1.5 * eps


def test_cli_accounts_the_tree(capsys: pytest.CaptureFixture[str]):
    argv = ["account", "--mechanism", "tree", "--noise-multiplier", "3.0", "--steps", "100", "--delta", "1e-6",
            "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["epsilon"] == pytest.approx(analytic_epsilon(3.0 / math.sqrt(7), 1e-6), rel=1e-9)
    assert result["accountant"] == "pld"
    assert result["neighboring_relation"] == "replace-special"
