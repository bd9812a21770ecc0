"""Samplers: batch-size distributions, index sets, events, relations, and input validation."""

from __future__ import annotations

import math
import re

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation

import dpopt
from dpopt import sampling
from dpopt._validate import DpoptError
from dpopt.base import Batch, Sampler
from dpopt.oracles import Logistic
from dpopt.mechanisms import SeededNoise

GAUSS = dpa.GaussianDpEvent(1.7)


def logistic_data(n: int = 400, d: int = 5, seed: int = 0) -> Logistic:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    y = torch.where(X @ w + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return Logistic(X, y)


def test_poisson_sizes_are_binomial():
    n, q, draws = 1000, 0.1, 2000
    sampler = sampling.Poisson(n, q)
    gen = torch.Generator().manual_seed(0)
    sizes = torch.empty(draws, dtype=torch.float64)
    counts = torch.zeros(n, dtype=torch.float64)
    for k in range(draws):
        idx = sampler.sample(gen)
        assert idx.dtype == torch.int64
        assert torch.all(idx[1:] > idx[:-1]) and (len(idx) == 0 or (idx[0] >= 0 and idx[-1] < n))
        sizes[k] = len(idx)
        counts[idx] += 1
    mean, var = n * q, n * q * (1 - q)  # Binomial(n, q): 100 and 90
    # Sample mean of K draws: standard error √(var/K) = 0.21; allow 5 s.e.
    assert abs(float(sizes.mean()) - mean) <= 5 * math.sqrt(var / draws)
    # Sample variance: s.e. ≈ var·√(2/(K−1)) (the binomial's excess kurtosis (1−6q(1−q))/var ≈ 0.005
    # is negligible) = 2.85; allow 5 s.e.
    assert abs(float(sizes.var()) - var) <= 5 * var * math.sqrt(2 / (draws - 1))
    # Each record is included Binomial(K, q) times (mean 200, sd 13.4); 5.5 sd per record, union
    # over 1000 records: P(any outside) ≤ 1000 · 3.8e-8.
    sd = math.sqrt(draws * q * (1 - q))
    assert float((counts - draws * q).abs().max()) <= 5.5 * sd


def test_poisson_empty_batches_at_tiny_rate():
    n, q, draws = 400, 1e-4, 500
    sampler = sampling.Poisson(n, q)
    gen = torch.Generator().manual_seed(1)
    empty = sum(len(sampler.sample(gen)) == 0 for _ in range(draws))
    p = (1 - q) ** n  # P(empty) = 0.9608; count ~ Binomial(500, p): mean 480.4, sd 4.35
    assert abs(empty - draws * p) <= 5 * math.sqrt(draws * p * (1 - p))


def empty_poisson_batch(sampler: sampling.Poisson) -> torch.Tensor:
    """The first seed whose draw is empty (deterministic)."""
    for seed in range(1000):
        idx = sampler.sample(torch.Generator().manual_seed(seed))
        if len(idx) == 0:
            return idx
    raise AssertionError("no empty batch in 1000 seeds")


def test_dpsgd_step_on_empty_batch_adds_noise_and_is_accounted():
    oracle = logistic_data()
    algo = dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=2.0, batch_size=1)
    sampler = algo.sampler(0, oracle.n)
    assert isinstance(sampler, sampling.Poisson) and sampler.rate == 1 / 400
    idx = empty_poisson_batch(sampler)
    theta0 = torch.linspace(-1, 1, oracle.dim, dtype=torch.float64)
    state = algo.init(theta0, 10, torch.Generator().manual_seed(0))
    new, event = algo.step(state, Batch(0, idx, sampler), oracle, SeededNoise(5))
    # Sum over no records is 0; noise N(0, (z·C)²) from the noise generator; divided by b = 1.
    noise = 2.0 * 1.0 * torch.randn(oracle.dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.allclose(new.theta, theta0 - 0.5 * noise / 1.0, rtol=0, atol=1e-15)
    assert float((new.theta - theta0).norm()) > 0
    assert event == dpa.PoissonSampledDpEvent(1 / 400, dpa.GaussianDpEvent(2.0))


def test_dpsrm_step_on_empty_batch_adds_noise_and_is_accounted():
    oracle = logistic_data()
    algo = dpopt.DPSRM(lr=0.1, clip=1.0, clip_diff=0.1, gamma=0.1, noise_multiplier0=1.5, noise_multiplier=3.0,
                       batch_size0=2, batch_size=1)
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64)
    state = algo.init(theta0, 10, torch.Generator().manual_seed(0))
    gen = SeededNoise(9)
    replay = torch.Generator().manual_seed(9)
    for t, (z, sens, b) in enumerate([(1.5, 1.0, 2.0), (3.0, 0.1 * 1.0 + 0.9 * 0.1, 1.0)]):
        sampler = algo.sampler(t, oracle.n)
        idx = empty_poisson_batch(sampler)
        momentum_before = state.momentum
        state, event = algo.step(state, Batch(t, idx, sampler), oracle, gen)
        noise = z * sens * torch.randn(oracle.dim, generator=replay, dtype=torch.float64)
        carried = 0.0 if t == 0 else (1 - 0.1) * momentum_before
        assert torch.allclose(state.momentum, noise / b + carried, rtol=0, atol=1e-14)
        assert event == dpa.PoissonSampledDpEvent(b / 400, dpa.GaussianDpEvent(z))


def test_fixed_size_exact_distinct_and_uniform():
    n, size, draws = 50, 7, 3000
    sampler = sampling.FixedSize(n, size)
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(n, dtype=torch.float64)
    for _ in range(draws):
        idx = sampler.sample(gen)
        assert len(idx) == size and len(set(idx.tolist())) == size
        assert int(idx.min()) >= 0 and int(idx.max()) < n
        counts[idx] += 1
    p = size / n  # each record in a batch w.p. size/n; count ~ Binomial(3000, 0.14): mean 420, sd 19.0
    sd = math.sqrt(draws * p * (1 - p))
    assert float((counts - draws * p).abs().max()) <= 5 * sd  # union over 50: ≤ 50·5.7e-7


def test_full_batch_is_everything():
    sampler = sampling.FullBatch(13)
    assert sampler.sample(torch.Generator().manual_seed(0)).tolist() == list(range(13))
    assert sampler.expected_size == 13.0


def test_samplers_use_only_their_generator():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for sampler in (sampling.Poisson(100, 0.3), sampling.FixedSize(100, 10)):
        a = sampler.sample(torch.Generator().manual_seed(4))
        torch.manual_seed(123)
        b = sampler.sample(torch.Generator().manual_seed(4))
        assert torch.equal(a, b)
    torch.manual_seed(0)
    assert torch.equal(torch.get_rng_state(), state)


def test_wrap_events_relations_and_divisors():
    poisson, fixed, full = sampling.Poisson(400, 0.05), sampling.FixedSize(400, 20), sampling.FullBatch(400)
    assert poisson.wrap(GAUSS) == dpa.PoissonSampledDpEvent(0.05, GAUSS)
    assert fixed.wrap(GAUSS) == dpa.SampledWithoutReplacementDpEvent(400, 20, GAUSS)
    assert sampling.FixedSize(400, 400).wrap(GAUSS) == GAUSS
    assert full.wrap(GAUSS) == GAUSS
    assert poisson.relation == NeighboringRelation.ADD_OR_REMOVE_ONE
    assert fixed.relation == NeighboringRelation.REPLACE_ONE
    assert full.relation == NeighboringRelation.REPLACE_ONE
    assert sampling.by_name("poisson").relation == NeighboringRelation.ADD_OR_REMOVE_ONE
    assert sampling.by_name("fixed").relation == sampling.by_name("full").relation == NeighboringRelation.REPLACE_ONE
    assert sampling.SinglePass.relation == NeighboringRelation.REPLACE_ONE
    assert poisson.expected_size == pytest.approx(20.0, rel=1e-15)
    assert fixed.expected_size == 20.0 and full.expected_size == 400.0
    assert sampling.Poisson.of(400, 20) == poisson
    assert sampling.FixedSize.of(400, 20) == fixed
    assert sampling.FullBatch.of(400, 20) == full
    assert all(isinstance(s, Sampler) for s in (poisson, fixed, full, sampling.SinglePass(400, 0, 20),
                                                         sampling.Clients(400, 4)))


@pytest.mark.parametrize("make", [
    lambda: sampling.Poisson.of(400, 401),
    lambda: sampling.FixedSize(400, 401),
    lambda: sampling.FixedSize.of(400, 401),
])
def test_batch_size_above_n_names_batch_size_and_n(make):
    with pytest.raises(DpoptError, match=r"batch_size=401 must be >= 1 and <= n=400"):
        make()


def test_run_with_batch_size_above_n_raises():
    oracle = logistic_data()
    with pytest.raises(DpoptError, match=r"batch_size=500 .*n=400"):
        dpopt.run(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=500), oracle, steps=3)
    with pytest.raises(DpoptError, match=r"batch_size=500 .*n=400"):
        dpopt.run(dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=500, sampling=sampling.FixedSize),
                  oracle, steps=3)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: sampling.FixedSize(400, 0), r"batch_size=0 must be >= 1"),
    (lambda: sampling.Poisson.of(400, 0), r"batch_size=0 must be >= 1"),
    (lambda: sampling.Poisson(400, 0.0), r"sampling_rate=0.0 must be in \(0, 1\]"),
    (lambda: sampling.Poisson(400, 1.5), r"sampling_rate=1.5 must be in \(0, 1\]"),
    (lambda: sampling.by_name("bogus"), r"sampling='bogus' must be one of: poisson, fixed, full"),
    (lambda: dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, sampling="poisson"),
     r"sampling='poisson' must be one of: dpopt.sampling.Poisson, dpopt.sampling.FixedSize, dpopt.sampling.FullBatch"),
])
def test_bad_sampler_arguments(make, message):
    with pytest.raises(DpoptError, match=message):
        make()


def test_clients_iid_split_is_an_equal_partition_fixed_by_the_seed():
    clients = sampling.Clients(103, 10, seed=4)
    shards = clients.shards
    assert clients.size == 10 and clients.expected_size == 100.0 and len(shards) == 10
    used = torch.cat(shards)
    assert len(used.unique()) == 100 and all(len(shard) == 10 for shard in shards)
    assert torch.equal(clients.sample(torch.Generator()), used)
    assert all(torch.equal(a, b) for a, b in zip(shards, sampling.Clients(103, 10, seed=4).shards))
    assert not torch.equal(used, sampling.Clients(103, 10, seed=5).records(range(10)))
    assert clients.relation == dpa.NeighboringRelation.REPLACE_ONE
    assert clients.wrap(dpa.GaussianDpEvent(1.0)) == dpa.GaussianDpEvent(1.0)


def test_clients_label_split_gives_each_client_one_label_when_labels_are_balanced():
    labels = torch.arange(100) % 5  # 20 records of each of 5 labels; 10 clients of 10
    clients = sampling.Clients(100, 10, split="label", labels=labels)
    for shard in clients.shards:
        assert len(labels[shard].unique()) == 1
    iid = sampling.Clients(100, 10, labels=labels)
    assert max(len(labels[shard].unique()) for shard in iid.shards) > 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 5, "count": 6}, "clients=6 must be >= 1 and <= n=5"),
    ({"n": 5, "count": 2, "split": "dirichlet"}, "split='dirichlet' must be one of: iid, label"),
    ({"n": 5, "count": 2, "split": "label"}, "split='label' needs labels of length n=5"),
])
def test_clients_refuse_bad_arguments(kwargs, message):
    with pytest.raises(DpoptError, match=re.escape(message)):
        sampling.Clients(**kwargs)
