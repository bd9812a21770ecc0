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


# ------------------------------------------------------------------------------ cyclic Poisson sampling

def test_cyclic_poisson_with_one_band_is_poisson():
    """b = 1: the same draws from the same generator (state equal after), the same event."""
    n, batch = 997, 40
    plain, cyclic = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for t in range(60):
        sampler = sampling.CyclicPoisson(n, batch, 1, t)
        assert torch.equal(sampler.sample(cyclic), sampling.Poisson.of(n, batch).sample(plain))
        assert sampler.wrap(GAUSS) == sampling.Poisson.of(n, batch).wrap(GAUSS)
    assert torch.equal(plain.get_state(), cyclic.get_state())
    assert sampler.relation == NeighboringRelation.ADD_OR_REMOVE_ONE and sampler.expected_size == 40.0


def residues_seen(sampler_at, n: int, steps: int, bands: int) -> list[set[int]]:
    """For each record, the residues t mod b of the steps whose batch held it."""
    gen, seen = torch.Generator().manual_seed(9), [set() for _ in range(n)]
    for t in range(steps):
        for i in sampler_at(t).sample(gen).tolist():
            seen[i].add(t % bands)
    return seen


N, BATCH, BANDS, KEY = 1000, 50, 4, 123


def test_cyclic_poisson_records_take_part_only_in_their_groups_steps():
    """Over T = 400 steps, b = 4, q = b·B/n = 0.2: every record appears only at steps of one residue
    mod b (its group's), and only when its group is sampled. Each record of a group is included
    Binomial(100, 0.2) times; the total over the n records has mean 20,000 and sd √(1000·16) = 126:
    allowed 5 sd."""
    steps = 400
    seen = residues_seen(lambda t: sampling.CyclicPoisson(N, BATCH, BANDS, t, KEY), N, steps, BANDS)
    assert max(len(residues) for residues in seen) == 1
    for g in range(BANDS):
        assert all(seen[i] <= {g} for i in sampling.CyclicPoisson(N, BATCH, BANDS, g, KEY).group().tolist())
    gen = torch.Generator().manual_seed(10)
    total = sum(len(sampling.CyclicPoisson(N, BATCH, BANDS, t, KEY).sample(gen)) for t in range(steps))
    assert abs(total - N * (steps // BANDS) * 0.2) <= 5 * math.sqrt(N * (steps // BANDS) * 0.2 * 0.8)


class AllRecords(sampling.CyclicPoisson):
    """Mutant: samples all n records at the group rate q while ``wrap`` accounts cyclic Poisson."""

    def sample(self, gen: torch.Generator) -> torch.Tensor:
        return sampling.Poisson(self.n, self.rate).sample(gen)


def test_membership_check_catches_sampling_all_records():
    seen = residues_seen(lambda t: AllRecords(N, BATCH, BANDS, t, KEY), N, 40, BANDS)
    assert max(len(residues) for residues in seen) > 1


def test_cyclic_poisson_groups_are_random_and_fixed_by_the_key():
    """Each record's group is uniform and independent: group sizes ~ Binomial(1000, 1/4), mean 250,
    sd 13.7 (allowed 5 sd); the groups partition the records; the same key gives the same groups,
    another key others; the key is drawn from the run's generator."""
    groups = [sampling.CyclicPoisson(N, BATCH, BANDS, g, KEY).group() for g in range(BANDS)]
    assert torch.equal(torch.cat(groups).sort().values, torch.arange(N))
    assert all(abs(len(group) - 250) <= 5 * math.sqrt(N * 0.25 * 0.75) for group in groups)
    assert torch.equal(sampling.CyclicPoisson(N, BATCH, BANDS, 0, KEY).group(), groups[0])
    assert not torch.equal(sampling.CyclicPoisson(N, BATCH, BANDS, 0, KEY + 1).group(), groups[0])
    gen = torch.Generator().manual_seed(0)
    assert sampling.CyclicPoisson.secret_key(gen) != sampling.CyclicPoisson.secret_key(gen)


def test_cyclic_poisson_ledger_composes_the_busiest_groups_rounds():
    """After t + 1 steps the recorded events compose ⌈(t + 1)/b⌉ rounds of PoissonSampled(q, ·);
    after T they equal the planned banded event (double entry)."""
    from dpopt.accounting import canonical, count_steps
    from dpopt.correlation.events import banded_event

    steps, recorded = 10, []
    for t in range(steps):
        recorded.append(sampling.CyclicPoisson(N, BATCH, BANDS, t, KEY).wrap(GAUSS))
        assert count_steps(dpa.ComposedDpEvent(recorded)) == -(-(t + 1) // BANDS)
    assert canonical(dpa.ComposedDpEvent(recorded)) == canonical(banded_event(1.7, 0.2, steps, BANDS))


def test_cyclic_poisson_refuses_a_group_rate_above_one():
    with pytest.raises(DpoptError, match=re.escape("bands=5 times batch_size=250 must be <= n=1000")):
        sampling.CyclicPoisson(1000, 250, 5, key=KEY)
    assert sampling.CyclicPoisson(1000, 250, 4, key=KEY).rate == 1.0
    with pytest.raises(DpoptError, match=re.escape("step=-1 must be an integer >= 0")):
        sampling.CyclicPoisson(1000, 10, 4, -1, KEY)
    unkeyed = sampling.CyclicPoisson(1000, 10, 4, 4)  # plans: rate, divisor and event need no key
    assert unkeyed.rate == 0.04 and unkeyed.wrap(GAUSS) == sampling.CyclicPoisson(1000, 10, 4, 4, KEY).wrap(GAUSS)
    for draw in (lambda: unkeyed.sample(torch.Generator()), unkeyed.group):  # ... but cannot draw
        with pytest.raises(DpoptError, match=re.escape("bands=4 needs key=CyclicPoisson.secret_key(generator)")):
            draw()


def test_one_band_with_banded_noise_is_dp_sgd_bit_for_bit():
    """DP-SGD's own step against the same loop built from CyclicPoisson(b = 1) and the banded
    mechanism: the same θ (torch.equal) and the same events at every step."""
    from dpopt import clipping
    from dpopt.correlation.noise import banded_gaussian, banded_noise
    from dpopt.correlation.strategy import BandedToeplitz

    oracle, steps = logistic_data(), 12
    algo = dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.1, batch_size=40)
    theta0 = torch.linspace(-1, 1, oracle.dim, dtype=torch.float64)
    state = algo.init(theta0, steps, torch.Generator().manual_seed(0))
    gen_a, gen_b, noise_a, noise_b = (torch.Generator().manual_seed(1), torch.Generator().manual_seed(1),
                                      SeededNoise(2), SeededNoise(2))
    theta, ring = theta0.clone(), banded_noise(theta0, BandedToeplitz.optimal(1, steps))
    for t in range(steps):
        sampler = algo.sampler(t, oracle.n)
        state, event = algo.step(state, Batch(t, sampler.sample(gen_a), sampler), oracle, noise_a)
        cyclic = sampling.CyclicPoisson(oracle.n, 40, 1, t)
        rows = oracle.per_record(theta, cyclic.sample(gen_b))
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, 1.0)], cyclic.relation)
        noised, ring, released = banded_gaussian(clipped, 1.1, ring, noise_b, step=t)
        theta = theta.add(noised, alpha=-0.5 / cyclic.expected_size)
        assert torch.equal(theta, state.theta) and cyclic.wrap(released) == event
