"""Privacy invariants of every gradient-releasing algorithm, as property tests (hypothesis).

For any per-record gradients (huge, tiny, zero, NaN, ±inf), one noiseless step's release
(recovered from the update) is finite, no record contributes more than the clip bound, and
replacing or removing one record moves the release by at most the sensitivity the noise is
scaled to. NaN/inf policy (clipping.py): a record whose gradient is not finite is zeroed
(dropped from every term) and counted, never summed; an aggregate that is not finite (AClip)
is released as 0. An empty batch still releases noise and is still accounted. The ledger's ε
never decreases with steps, nor across a resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation
from hypothesis import given, settings
from hypothesis import strategies as st

import dpopt
from dpopt import clipping, mechanisms, sampling
from dpopt.accounting import epsilon_of
from dpopt.base import Batch
from dpopt.mechanisms import SeededNoise
from dpopt.algorithms.registry import PRIVATE

PROPERTY = settings(derandomize=True, max_examples=40, deadline=None, database=None)
SPECIAL = [0.0, 1e300, -1e300, 1e-300, 5e-324, 1.7e308, math.nan, math.inf, -math.inf]
entries = st.one_of(st.floats(-1e3, 1e3), st.sampled_from(SPECIAL))
DIM, N, C = 3, 8, 0.7


class Table:
    """An oracle whose per-record gradients are a fixed table (whatever θ is)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.n, self.dim = rows.shape

    def per_record(self, theta: torch.Tensor, indices: torch.Tensor) -> clipping.Dense:
        return clipping.Dense(self.rows[indices])

    def gradient_sum(self, theta: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.rows[indices].sum(dim=0)

    def gradients_at(self, points: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.rows[indices][:, None, :].expand(-1, points.shape[1], -1)

    def per_record_loss(self, thetas: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """0 at every point (DPSUR's test then sees no loss change: with β > 0 it keeps the candidate)."""
        return torch.zeros(len(indices), len(thetas), dtype=thetas.dtype)

    def regulariser(self, theta: torch.Tensor) -> torch.Tensor:
        return theta.new_zeros(())


@dataclass(frozen=True)
class Released:
    """How to read one step's release of an algorithm (noise 0) and what bounds it."""

    make: Callable[[float], Any]                 # noise multiplier -> algorithm
    value: Callable[[Any, Any, Any, float], torch.Tensor]   # (algo, state, new state, b) -> release
    per_record: float                            # each record's contribution is at most this
    aggregate: bool = False                      # the release is clip(mean): bounded by λ in total
    whole: bool = False                          # the algorithm picks its own records: all N of them


def sum_of_step(algo, state, new, b):
    return (state.theta - new.theta) * b / algo.lr


CASES: dict[str, Released] = {
    "dp-sgd": Released(lambda z: dpopt.DPSGD(lr=0.5, clip=C, noise_multiplier=z, batch_size=4), sum_of_step, C),
    "dp-sgd-fixed": Released(lambda z: dpopt.DPSGD(lr=0.5, clip=C, noise_multiplier=z, batch_size=4,
                                                   sampling=sampling.FixedSize), sum_of_step, C),
    "dp-gd": Released(lambda z: dpopt.dp_gd(lr=0.5, clip=C, noise_multiplier=z), sum_of_step, C),
    # banded noise: the same clipped sum (of step 0's group; the batch is given), correlated noise
    "dp-bandmf": Released(lambda z: dpopt.DPSGD(lr=0.5, clip=C, noise_multiplier=z, batch_size=4, bands=2),
                          sum_of_step, C),
    "rrpsgd": Released(lambda z: dpopt.rrpsgd(lr=0.5, clip=C, noise_multiplier=z, batch_size=4), sum_of_step, C),
    "dp-srm": Released(lambda z: dpopt.DPSRM(lr=0.5, clip=C, clip_diff=0.2, gamma=0.3, noise_multiplier0=z,
                                             noise_multiplier=z, batch_size0=4, batch_size=4),
                       lambda algo, state, new, b: new.momentum * b, C),
    # DPSUR: the candidate's release, kept by a test that accepts a zero loss change (β = 1)
    "dp-sur": Released(lambda z: dpopt.DPSUR(lr=0.5, clip=C, noise_multiplier=z, val_noise_multiplier=z, batch_size=4,
                                             val_rate=0.5, threshold=1.0), sum_of_step, C),
    "aclip": Released(lambda z: dpopt.AClip(lr=0.5, clip=C, noise_multiplier=z, batch_size=4),
                      lambda algo, state, new, b: (state.theta - new.theta) / algo.lr, C, aggregate=True),
    # DIFF2: the server's estimate in a restart round (BVR's local steps release through the same
    # clip_sum and Gaussian; their event is checked in tests/contracts); 2 clients of 4 records.
    "diff2-gd": Released(lambda z: dpopt.DIFF2(lr=0.5, clip=C, clip_diff=0.2, restart=2, noise_multiplier1=z,
                                               noise_multiplier2=z, clients=sampling.Clients(N, 2)),
                         lambda algo, state, new, b: new.estimate * b, C, whole=True),
    "diff2-bvr": Released(lambda z: dpopt.DIFF2(lr=0.5, clip=C, clip_diff=0.2, restart=2, noise_multiplier1=z,
                                                noise_multiplier2=z, clients=sampling.Clients(N, 2),
                                                local=dpopt.LocalSteps(steps=1, batch=2, clip=0.2),
                                                noise_multiplier3=z),
                          lambda algo, state, new, b: new.estimate * b, C, whole=True),
    # O2NC with the first-order oracle: the period start's increment (clip C1 = C) of the single
    # pass over all N records, released by the tree, and of the multi-pass Gaussian release.
    "o2nc-first": Released(lambda z: dpopt.O2NC(lr=0.5, radius=1.0, window=1, alpha=0.1, period=2, clip0=C, clip=0.2,
                                                noise_multiplier=z, estimator="first", batch_size0=N),
                           lambda algo, state, new, b: new.released * b, C, whole=True),
    "o2nc-multi": Released(lambda z: dpopt.O2NCMulti(lr=0.5, radius=1.0, window=1, alpha=0.1, period=2, clip0=C,
                                                     clip=0.2, noise_multiplier=z, estimator="first"),
                           lambda algo, state, new, b: new.released * b, C),
}


def test_the_cases_cover_every_gradient_releasing_algorithm():
    """DP-AGD (full batch, zCDP filter) has its own clipping tests in tests/algorithms/test_dp_agd.py;
    zeroth-order O2NC's per-record vectors are two-point estimates from function values (a table
    of gradients cannot stand for them), clipped and released by the code o2nc-first runs here."""
    assert set(PRIVATE) - {"dp-agd", "o2nc-zeroth"} <= set(CASES)


def one_step(case: Released, rows: torch.Tensor, indices: torch.Tensor, z: float = 0.0,
             source: SeededNoise | None = None) -> tuple[torch.Tensor, dpa.DpEvent]:
    algo = case.make(z)
    sampler = algo.sampler(0, len(rows))
    state = algo.init(torch.zeros(DIM, dtype=torch.float64), 3, torch.Generator().manual_seed(0))
    new, event = algo.step(state, Batch(0, indices, sampler), Table(rows), source or SeededNoise(1))
    return case.value(algo, state, new, sampler.expected_size), event


@st.composite
def tables(draw):
    return torch.tensor([draw(st.lists(entries, min_size=DIM, max_size=DIM)) for _ in range(N)], dtype=torch.float64)


@pytest.mark.parametrize("name", list(CASES))
@PROPERTY
@given(rows=tables(), replacement=st.lists(entries, min_size=DIM, max_size=DIM), size=st.integers(0, N))
def test_release_is_finite_bounded_and_moves_by_at_most_the_sensitivity(name, rows, replacement, size):
    case = CASES[name]
    size = N if case.whole else size
    indices = torch.arange(size)
    release, _ = one_step(case, rows, indices)
    assert release.isfinite().all()  # non-finite records are never summed
    finite = sum(bool(row.isfinite().all()) for row in rows[:size])
    bound = case.per_record if case.aggregate else case.per_record * finite
    assert float(release.norm()) <= bound * (1 + 1e-9)
    if size == 0:
        return
    # the neighbour: the last record of the batch replaced (replace-one) or removed (add/remove-one)
    relation = case.make(0.0).relation()
    other = rows.clone()
    other[size - 1] = torch.tensor(replacement, dtype=torch.float64)
    neighbour = indices[:-1] if relation == NeighboringRelation.ADD_OR_REMOVE_ONE else indices
    moved, _ = one_step(case, other, neighbour)
    sensitivity = 2 * case.per_record if case.aggregate or relation == NeighboringRelation.REPLACE_ONE \
        else case.per_record
    assert float((release - moved).norm()) <= sensitivity * (1 + 1e-9)


@pytest.mark.parametrize("name", ["dp-sgd", "rrpsgd", "dp-srm", "aclip"])
def test_an_empty_batch_still_releases_noise_and_is_accounted(name):
    case, z = CASES[name], 1.5
    rows = torch.ones(N, DIM, dtype=torch.float64)
    empty = torch.arange(0)
    release, event = one_step(case, rows, empty, z=z, source=SeededNoise(4))
    algo = case.make(z)
    sampler = algo.sampler(0, N)
    assert event == sampler.wrap(mechanisms.CONTINUOUS.event(z))
    assert isinstance(event, dpa.PoissonSampledDpEvent)
    # the noise is N(0, (z·Δ)²) with Δ = C (2λ for AClip's mean): exactly the generator's normals
    xi = torch.randn(DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    sensitivity = 2 * C if case.aggregate else C
    assert torch.allclose(release, z * sensitivity * xi, rtol=1e-12, atol=1e-15)


def test_the_nan_policy_counts_what_it_drops():
    rows = torch.tensor([[1.0, 0.0, 0.0], [math.nan, 0.0, 0.0], [math.inf, 1.0, 0.0], [0.0, 2.0, 0.0]],
                        dtype=torch.float64)
    bounded, dropped = clipping.clip_sum([clipping.Term(1.0, clipping.Dense(rows), 1.0)],
                                         NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert dropped == 2
    assert torch.equal(bounded.value, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))


# ------------------------------------------------------------------------ the ledger over time


@settings(derandomize=True, max_examples=12, deadline=None, database=None)
@given(name=st.sampled_from(sorted(set(PRIVATE) - {"dp-agd"})), steps=st.integers(1, 30))
def test_planned_epsilon_is_monotone_in_steps(name, steps):
    """(DP-AGD is a privacy filter: its plan is the budget whatever the steps; its ledger is
    checked against it step by step in tests/contracts.)"""
    algo = dpopt.algorithms.registry.build(name, n=200, batch_size=20)
    relation = algo.relation()
    before = epsilon_of(algo.planned_event(200, steps), 1e-5, relation)
    after = epsilon_of(algo.planned_event(200, steps + 1), 1e-5, relation)
    assert after >= before > 0


def _problem() -> dpopt.oracles.Logistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(120, DIM, generator=gen, dtype=torch.float64)
    return dpopt.oracles.Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0))


class Crash(Exception):
    """Stands for the process dying mid-run (after a step, before that step's checkpoint)."""


@settings(derandomize=True, max_examples=8, deadline=None, database=None)
@given(stop=st.integers(1, 11), every=st.integers(1, 4))
def test_ledger_never_decreases_across_a_resume(tmp_path_factory, stop, every):
    """Crash after step ``stop`` (checkpoints every ``every`` steps), resume to 12: the logged ε is
    non-decreasing and equal, step for step, to the uninterrupted run's; so is θ."""
    algo, oracle = dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=12), _problem()
    path = Path(tmp_path_factory.mktemp("resume")) / "ckpt.pt"
    whole = dpopt.run(algo, oracle, steps=12, seed=5, log_every=1, test_error=lambda theta: 0.0)
    calls = iter(range(12))

    def crash_at_stop(theta: torch.Tensor) -> float:
        if next(calls) + 1 == stop:
            raise Crash
        return 0.0

    with pytest.raises(Crash):
        dpopt.run(algo, oracle, steps=12, seed=5, log_every=1, test_error=crash_at_stop, checkpoint_path=path,
                  checkpoint_every=every)
    assert path.exists() == (stop > every)
    resumed = dpopt.run(algo, oracle, steps=12, seed=5, log_every=1, test_error=lambda theta: 0.0,
                        checkpoint_path=path, checkpoint_every=every)
    epsilons = [record["epsilon"] for record in resumed.records]
    assert epsilons == sorted(epsilons)
    assert resumed.records == whole.records
    assert epsilons == [record["epsilon"] for record in whole.records]
    assert torch.equal(resumed.theta, whole.theta)
