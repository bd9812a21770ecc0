"""DP-SGD with banded correlated noise (``DPSGD(bands=b)``, ``dp-bandmf``): one band is today's
DP-SGD bit for bit, a record takes part only in its group's steps through the real training loop,
the secret group key lives in the state (a sampler without it cannot draw), and the plan is the
amplified banded recipe. (Its ledger against the plan, checkpoints and mutants: the contract
table; its audit: ``tests/test_audit_beyond_dp_sgd.py``; data-parallel: ``tests/test_distributed.py``.)"""

from __future__ import annotations

import dataclasses
import math
import re

import dp_accounting as dpa
import pytest
import torch
from torch import nn

import dpopt
from dpopt import clipping, mechanisms, train
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger, canonical
from dpopt.algorithms import DPSGD
from dpopt.algorithms.registry import build
from dpopt.correlation.events import banded_event
from dpopt.correlation.strategy import BandedToeplitz
from dpopt.plan import Plan
from dpopt.sampling import CyclicPoisson, Poisson

from tests.test_audit_beyond_dp_sgd import EveryRecordEveryStep

N, DIM, BATCH, STEPS, SEED, DELTA = 400, 5, 40, 20, 3, 1e-5


def glm() -> dpopt.oracles.NonconvexLogistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    y = torch.where(X @ torch.randn(DIM, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return dpopt.oracles.NonconvexLogistic(X, y, reg=0.1)


def small_model(engine: str) -> dpopt.oracles.TorchModel:
    """A 5-8-2 tanh network (float32) on the GLM's records."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, 8), nn.Tanh(), nn.Linear(8, 2))
    data = glm()

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y, reduction="none")

    return dpopt.oracles.TorchModel(net, loss, data.X.float(), (data.y > 0).long(), engine=engine)


def todays_dp_sgd(oracle, theta0: torch.Tensor) -> tuple[torch.Tensor, Ledger]:
    """DP-SGD as it was before banded noise, by hand from the primitives: Poisson batches of the
    run's sampling generator, clip, the Gaussian mechanism, θ − η·release/b, the ledger."""
    sample_gen, source, _ = train.randomness(SEED)
    theta, ledger = theta0.clone(), Ledger(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    sampler = Poisson.of(N, BATCH)
    for _ in range(STEPS):
        rows = oracle.per_record(theta, sampler.sample(sample_gen))
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, 1.0)], sampler.relation)
        noised, event = mechanisms.gaussian(clipped, 1.3, source)
        theta = theta.add(noised, alpha=-0.5 / sampler.expected_size)
        ledger.record(sampler.wrap(event))
    return theta, ledger


@pytest.mark.parametrize("engine", ["glm", "ghost", "vmap"])
def test_one_band_is_todays_dp_sgd_bit_for_bit(engine):
    """``dp-sgd`` by name, ``dp-bandmf`` with bands=1 and ``DPSGD(bands=1)``: the same θ (torch.equal)
    and the same ledger as DP-SGD written from the primitives, over 20 steps, seed for seed."""
    oracle = glm() if engine == "glm" else small_model(engine)
    theta0 = (torch.zeros(DIM, dtype=torch.float64) if engine == "glm" else oracle.flat_params().double())
    want_theta, want_ledger = todays_dp_sgd(oracle, theta0)
    made = [build("dp-sgd", n=N, batch_size=BATCH, lr=0.5, clip=1.0), build("dp-bandmf", n=N, batch_size=BATCH,
                                                                            lr=0.5, clip=1.0, bands=1),
            DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=BATCH, bands=1)]
    for algorithm in made:
        algorithm = dataclasses.replace(algorithm, noise_multiplier=1.3)
        stepper = train.Stepper.start(Plan(algorithm, n=N, steps=STEPS, delta=DELTA), oracle, theta0=theta0,
                                      seed=SEED)
        for _ in range(STEPS):
            stepper.step()
        assert torch.equal(stepper.state.theta, want_theta)
        assert stepper.ledger.event() == want_ledger.event()
    assert float((want_theta - theta0).norm()) > 0.01  # it moved


def steps_outside_their_group(algorithm: DPSGD, steps: int) -> int:
    """Run ``algorithm`` through the training loop (``Stepper``) on the GLM, recording the records
    each step computes gradients of; count the (step, record) pairs whose record is not in the group
    of that step, t mod b, under the run's own key (read from its state)."""
    seen: list[torch.Tensor] = []

    class Recording(dpopt.oracles.NonconvexLogistic):
        def per_record(self, theta: torch.Tensor, indices: torch.Tensor):
            seen.append(indices.clone())
            return super().per_record(theta, indices)

    data = glm()
    oracle = Recording(data.X, data.y, reg=0.1)
    stepper = train.Stepper.start(Plan(algorithm, n=N, steps=steps, delta=DELTA), oracle,
                                  theta0=torch.zeros(DIM, dtype=torch.float64), seed=SEED)
    for _ in range(steps):
        stepper.step()
    key = stepper.state.banded.key
    outside = 0
    for t, indices in enumerate(seen):
        group = CyclicPoisson(N, BATCH, algorithm.bands, t, key).group()
        outside += int((~torch.isin(indices, group)).sum())
    assert sum(len(indices) for indices in seen) > 0
    return outside


def test_every_record_takes_part_only_in_its_groups_steps():
    """b = 4 over 40 steps of the training loop: every record computed at step t belongs to group
    t mod 4 of the run's secret assignment. The mutant that samples every record at every step (at
    the group rate, its events still the cyclic ones) has records outside their group: with
    q = 4·40/400 = 0.4, about 3/4 of its ~160 records per step."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=BATCH, bands=4)
    assert steps_outside_their_group(algorithm, 40) == 0
    mutant = EveryRecordEveryStep(**{f.name: getattr(algorithm, f.name) for f in dataclasses.fields(algorithm)})
    assert steps_outside_their_group(mutant, 40) > 40 * 100


def test_the_key_is_drawn_into_the_state_and_a_sampler_without_it_cannot_draw():
    """The loop asks ``batch_sampler(state, …)`` (``train.keyed``); a caller that forgets the state
    gets a refusal, not batches from another distribution. Two seeds draw two keys."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=BATCH, bands=4)
    assert train.keyed(algorithm) and train.keyed(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3))
    keys = [algorithm.init(torch.zeros(DIM), STEPS, train.randomness(seed)[0]).banded.key for seed in (1, 2)]
    assert keys[0] != keys[1]
    sample_gen, source, _ = train.randomness(SEED)
    state = algorithm.init(torch.zeros(DIM, dtype=torch.float64), STEPS, sample_gen)
    with pytest.raises(DpoptError, match=re.escape("bands=4 needs key=CyclicPoisson.secret_key(generator)")):
        train.step(algorithm, glm(), state, 0, Ledger(algorithm.relation()), sample_gen, source)
    state, _ = train.step(algorithm, glm(), state, 0, Ledger(algorithm.relation()), sample_gen, source, keyed=True)
    assert state.banded.noise.step == 1 and len(state.banded.noise.past) == 3


def test_the_plan_is_the_busiest_groups_rounds_and_calibrates_to_the_recipe():
    """The planned event is ``banded_event(z, b·B/n, T, b)``; calibrated through the plan for
    n = 50,000, T = 2,000, B = 500, δ = 1e-5 at ε = 2, b = 4 gives z ≈ 1.981 (the amplified banded
    recipe; to the calibration's 0.5 % tolerance)."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=BATCH, bands=4)
    assert canonical(algorithm.planned_event(N, 30)) == canonical(banded_event(1.3, 0.4, 30, 4))
    plan = Plan(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=500, bands=4), n=50_000, steps=2_000,
                delta=1e-5).calibrated(2.0)
    assert plan.algorithm.noise_multiplier == pytest.approx(1.981, rel=5e-3)
    assert plan.epsilon() <= 2.0


def test_the_ring_is_b_minus_one_vectors_of_the_releases_dtype():
    """(b − 1)·d numbers of extra state, in the dtype of the release (θ's: float64 through
    ``dpopt.run``, whatever the module's dtype), fixed by the strategy optimised for the run's T."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=BATCH, bands=16)
    state = algorithm.init(torch.zeros(DIM, dtype=torch.float64), 64, torch.Generator().manual_seed(0))
    ring = state.banded.noise
    assert len(ring.past) == 15 and all(v.dtype == torch.float64 and v.shape == (DIM,) for v in ring.past)
    assert ring.strategy == BandedToeplitz.optimal(16, 64)
    short = algorithm.init(torch.zeros(DIM), 5, torch.Generator().manual_seed(0)).banded.noise
    assert short.strategy.bands == 5 and short.past[0].dtype == torch.float32  # T < b: min(b, T) bands


@pytest.mark.parametrize(("given", "reason"), [
    ({"sampling": dpopt.sampling.FixedSize}, "its batches are cyclic Poisson"),
    ({"noise": mechanisms.DISCRETE}, "noise=Discrete()"),
    ({"clip_quantile": 0.5}, "correlated noise needs the same sensitivity at every step"),
])
def test_what_banded_noise_refuses_says_why(given, reason):
    with pytest.raises(DpoptError, match=re.escape(reason)):
        DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=BATCH, bands=4, **given)


def test_the_registry_refuses_correlated_noise_where_the_argument_does_not_hold():
    with pytest.raises(DpoptError, match=re.escape("bands=4 (correlated noise) is refused for algorithm='dp-srm': "
                                                   "its first step releases at (σ0, C1)")):
        build("dp-srm", n=N, batch_size=BATCH, bands=4)
    with pytest.raises(DpoptError, match="no groups to cycle through"):
        build("dp-gd", n=N, bands=2)
    aclip = build("aclip", n=N, batch_size=BATCH, bands=4)  # its argument is DP-SGD's: one release of 2λ per step
    assert aclip.bands == 4 and canonical(aclip.planned_event(N, 30)) == canonical(banded_event(1.0, 0.4, 30, 4))
    assert build("dp-bandmf", n=N, batch_size=BATCH).bands == 4 and build("dp-sgd", n=N, batch_size=BATCH).bands == 1
    assert build("dp-sgd", n=N, batch_size=BATCH, bands=3) == build("dp-bandmf", n=N, batch_size=BATCH, bands=3)
    assert math.isclose(build("rrpsgd", n=N, batch_size=BATCH, bands=2).sampler(0, N).rate, 2 * BATCH / N)
