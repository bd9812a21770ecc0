"""DP-O2NC specifics: a single pass costs one period's tree (parallel composition over disjoint
periods), sees every record at most once, counts the clips that bite, and adds exactly the
noise its events describe."""

from __future__ import annotations

import dataclasses

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation

import dpopt
from dpopt import accounting, mechanisms
from dpopt._validate import DpoptError
from dpopt.base import Batch
from dpopt.oracles import zeroth_order as zo
from dpopt.mechanisms import SeededNoise
from tests.contracts.test_algorithms import DELTA, DIM, N, TABLE, oracle, replay

REPLACE_ONE = NeighboringRelation.REPLACE_ONE


def test_single_pass_epsilon_is_one_periods_tree():
    algo = accounting.calibrate(TABLE["o2nc-zeroth-single"].make(1.0, 1.0), epsilon=2.0, delta=DELTA, n=N, steps=35)
    history = dpopt.run(algo, oracle(), steps=35, delta=DELTA, log_every=35)
    one_period = accounting.epsilon_of(mechanisms.tree_event(algo.noise_multiplier, [10]), DELTA, REPLACE_ONE)
    assert history.final["epsilon"] == pytest.approx(one_period, rel=1e-12)
    assert history.final["epsilon"] == pytest.approx(2.0, rel=0.01)
    assert history.neighboring_relation == "replace-one" and history.accountant == "pld"
    # sequential composition of the 4 periods would cost far more
    four = dpa.SelfComposedDpEvent(mechanisms.tree_event(algo.noise_multiplier, [10]), 4)
    assert accounting.epsilon_of(four, DELTA, REPLACE_ONE) > 1.8 * one_period
    assert algo.planned_event(N, 35).events[0] == dpa.SingleEpochTreeAggregationDpEvent(
        algo.noise_multiplier, [10, 10, 10, 5])


def test_single_pass_uses_each_record_at_most_once():
    algo = TABLE["o2nc-first-single"].make(1.0, 1.0)
    seen = torch.cat([algo.sampler(t, N).sample(torch.Generator()) for t in range(30)])
    assert len(seen) == algo.records_used(30) == 3 * 40 + 27 * 4
    assert len(set(seen.tolist())) == len(seen)
    with pytest.raises(DpoptError, match="n=400"):
        algo.planned_event(N, 100)
    with pytest.raises(DpoptError, match="n=400"):
        dpopt.run(algo, oracle(), steps=100)


@pytest.mark.parametrize("name", ["o2nc-zeroth-single", "o2nc-zeroth-multi", "o2nc-first-single"])
def test_clips_that_bite_are_counted(name):
    base = TABLE[name].make(0.0, 1.0)
    never = replay(dataclasses.replace(base, clip0=1e9, clip=1e9), 12).state
    always = replay(dataclasses.replace(base, clip0=1e-9, clip=1e-9), 12).state
    assert never.clipped == 0 and always.clipped == always.records == never.records > 0
    some = replay(base, 12).state
    assert 0 < some.clipped < some.records


def test_multi_pass_noise_is_z_times_twice_the_clip_over_n():
    z0, z, clip0 = 1.3, 0.7, 0.5
    noisy = dataclasses.replace(TABLE["o2nc-zeroth-multi"].make(z, clip0), noise_multiplier0=z0)
    clean = dataclasses.replace(noisy, noise_multiplier0=0.0, noise_multiplier=0.0)
    state = noisy.init(torch.zeros(DIM, dtype=torch.float64), 10, torch.Generator())
    sampler = noisy.sampler(0, N)
    batch = Batch(0, sampler.sample(torch.Generator()), sampler)
    (a, event), (b, _) = (algo.step(state, batch, oracle(), SeededNoise(8)) for algo in (noisy, clean))
    gen = torch.Generator().manual_seed(8)
    torch.rand((), generator=gen, dtype=torch.float64)
    zo.sphere(gen, N, noisy.directions, DIM)
    xi = torch.randn(DIM, generator=gen, dtype=torch.float64)
    assert torch.allclose(a.released - b.released, z0 * 2 * clip0 * xi / N, rtol=1e-10, atol=1e-14)
    assert event == dpa.GaussianDpEvent(z0)
    assert noisy.planned_event(N, 12).events[:2] == [dpa.GaussianDpEvent(z0), dpa.GaussianDpEvent(z)]


def test_single_pass_noise_is_the_trees_with_the_larger_increment_sensitivity():
    """Tree node std z·2·max(C1/B1, C2/B2) (replace-one): here C1/B1 = 1/40 < C2/B2 = (1/4)/4."""
    noisy = TABLE["o2nc-first-single"].make(2.0, 1.0)
    clean = dataclasses.replace(noisy, noise_multiplier=0.0)
    assert noisy.tree_sensitivity() == pytest.approx(2 / 16)
    state = noisy.init(torch.zeros(DIM, dtype=torch.float64), 30, torch.Generator())
    released = []
    for algo in (noisy, clean):
        current = state
        for t in range(1):
            sampler = algo.sampler(t, N)
            batch = Batch(t, sampler.sample(torch.Generator()), sampler)
            current, _ = algo.step(current, batch, oracle(), SeededNoise(8 + t))
        released.append((current.released, current.tree))
    (noisy_g, tree), (clean_g, _) = released
    assert tree.count == 1 and tree.noise_multiplier * tree.sensitivity == pytest.approx(2.0 * 2 / 16)
    # the period's first release is covered by the leaf node [0, 1), whose noise the tree holds
    (level, index, leaf), = tree.live
    assert (level, index) == (0, 0)
    assert torch.allclose(noisy_g - clean_g, leaf, rtol=1e-10, atol=1e-14)
    assert float(leaf.norm()) > 0


@pytest.mark.parametrize(("batch_size0", "clip0"), [(5, 0.1), (7, 0.1), (5, 3.3), (3, 0.7)])
def test_tree_sensitivity_is_the_increments_to_the_last_bit(batch_size0, clip0):
    """C/B and (1/B)·C differ in the last bit for these pairs; the tree must accept the increment
    clip_sum builds (sensitivity (1/B)·C) rather than refuse it as too sensitive."""
    algo = dataclasses.replace(TABLE["o2nc-zeroth-single"].make(1.0, 1.0), batch_size0=batch_size0, clip0=clip0,
                               clip=1e-3)
    assert algo.tree_sensitivity() == ((1.0 / batch_size0) * clip0) * 2.0
    state = algo.init(torch.zeros(DIM, dtype=torch.float64), 30, torch.Generator())
    sampler = algo.sampler(0, N)
    state, _ = algo.step(state, Batch(0, sampler.sample(torch.Generator()), sampler), oracle(), SeededNoise(0))
    assert state.tree.count == 1
