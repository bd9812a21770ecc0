"""The algorithm registry, used as docs/design.md's recipe says: an algorithm written outside the
library (a frozen dataclass, a ``from_knobs`` builder) and one registry :class:`Entry` are enough
to build it by name and train it through :func:`dpopt.train.train` with a plan, whose double
entry then holds for it like for every shipped algorithm.

The registry has no public call that adds an entry (it is one tuple of entries, read at import),
so the test registers the toy for its own duration with ``monkeypatch`` on ``registry.REGISTRY``
and the name tuples derived from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation
from torch import Tensor

from dpopt import clipping, mechanisms, sampling, train
from dpopt._validate import DpoptError
from dpopt.accounting import PlanMismatch, canonical
from dpopt.algorithms import registry
from dpopt.algorithms.registry import Entry, Knobs
from dpopt.base import Algorithm, Batch, Directed, NoiseSource, Oracle
from dpopt.oracles import Logistic
from dpopt.plan import Plan

N, DIM, STEPS, DELTA, EPSILON = 300, 4, 12, 1e-5, 1.0


class ToyState(NamedTuple):
    theta: Tensor
    velocity: Tensor  # the heavy-ball direction g̃_t of the last step (zero before the first)


@dataclass(frozen=True)
class ToyHeavyBall:
    """Private heavy ball: on a Poisson batch of expected size b,
    g̃_t = (Σ_i clip(∇f_i(θ_t), C) + N(0, (zC)² I)) / b,  v_t = β·v_{t−1} + g̃_t,  θ_{t+1} = θ_t − η·v_t.
    One release per step, ``PoissonSampled(b/n, Gaussian(z))``; the momentum is post-processing."""

    lr: float
    clip: float
    momentum: float
    noise_multiplier: float
    batch_size: int

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def relation(self) -> NeighboringRelation:
        return sampling.Poisson.relation

    def sampler(self, t: int, n: int) -> sampling.Poisson:
        return sampling.Poisson.of(n, self.batch_size)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> ToyState:
        return ToyState(theta0.clone(), torch.zeros_like(theta0))

    def step(self, state: ToyState, batch: Batch, oracle: Oracle, source: NoiseSource) -> tuple[ToyState, dpa.DpEvent]:
        rows = oracle.per_record(state.theta, batch.indices)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], batch.sampler.relation)
        noised, event = mechanisms.gaussian(clipped, self.noise_multiplier, source)
        velocity = self.momentum * state.velocity + noised / batch.sampler.expected_size
        return ToyState(state.theta - self.lr * velocity, velocity), batch.sampler.wrap(event)

    def direction(self, state: ToyState) -> Tensor:
        return state.velocity

    def moved(self, state: ToyState, theta: Tensor) -> ToyState:
        return state._replace(theta=theta)

    def output(self, state: ToyState) -> Tensor:
        return state.theta

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(self.sampler(0, n).wrap(dpa.GaussianDpEvent(self.noise_multiplier)), steps)


@dataclass(frozen=True)
class UnderPlanned(ToyHeavyBall):
    """The mutant: its plan claims 1.5 times the noise its steps add (calibration then sets too little)."""

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        claimed = dataclasses.replace(self, noise_multiplier=1.5 * self.noise_multiplier)
        return ToyHeavyBall.planned_event(claimed, n, steps)


def toy_from_knobs(knobs: Knobs) -> ToyHeavyBall:
    """``toy`` by name: ``lr``, ``clip``, ``gamma`` (the momentum β), ``batch_size``; noise at 1."""
    return ToyHeavyBall(lr=knobs.lr, clip=knobs.clip, momentum=knobs.gamma, noise_multiplier=1.0,
                        batch_size=knobs.batch_size)


def under_planned_from_knobs(knobs: Knobs) -> UnderPlanned:
    return UnderPlanned(**dataclasses.asdict(toy_from_knobs(knobs)))


def register(monkeypatch: pytest.MonkeyPatch, entry: Entry) -> None:
    """``entry`` in the registry for the duration of the test (the one line a new algorithm adds
    to ``registry.ENTRIES``)."""
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    monkeypatch.setattr(registry, "NAMES", (*registry.NAMES, entry.name))
    monkeypatch.setattr(registry, "PRIVATE", (*registry.PRIVATE, entry.name))


def glm() -> Logistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    y = torch.where(X @ torch.ones(DIM, dtype=torch.float64) >= 0, 1.0, -1.0)
    return Logistic(X, y)


def train_watching_the_ledger(plan: Plan, oracle: Oracle, monkeypatch: pytest.MonkeyPatch) -> tuple[train.History,
                                                                                                     train.Stepper]:
    """``train.train(plan, oracle, ...)`` with seed 1, and the stepper it drove (whose ledger the run recorded)."""
    seen: list[train.Stepper] = []
    drive = train.drive

    def watched(stepper: train.Stepper, options: train.Options, theta0: Tensor) -> train.History:
        seen.append(stepper)
        return drive(stepper, options, theta0)

    monkeypatch.setattr(train, "drive", watched)
    history = train.train(plan, oracle, train.Options(seed=1, log_every=4))
    return history, seen[0]


def test_a_toy_algorithm_registered_in_a_test_runs(monkeypatch):
    with pytest.raises(DpoptError, match="algorithm='toy' must be one of"):
        registry.entry("toy")
    register(monkeypatch, Entry("toy", f"{__name__}:toy_from_knobs", "Toy: private heavy ball"))

    algorithm = registry.entry("toy").build(Knobs.of(N, lr=0.5, clip=1.0, gamma=0.5, batch_size=30))
    assert algorithm == ToyHeavyBall(lr=0.5, clip=1.0, momentum=0.5, noise_multiplier=1.0, batch_size=30)
    assert isinstance(algorithm, Algorithm) and isinstance(algorithm, Directed)
    assert registry.build("toy", n=N, lr=0.5, clip=1.0, gamma=0.5, batch_size=30) == algorithm

    oracle = glm()
    plan = Plan(algorithm, n=N, steps=STEPS, delta=DELTA).calibrated(EPSILON)
    assert plan.algorithm.noise_multiplier > 1.0  # 12 steps at rate 0.1 need more noise than z = 1 for ε = 1
    history, stepper = train_watching_the_ledger(plan, oracle, monkeypatch)

    # The double entry: what the run's mechanisms returned is the plan, step for step.
    assert stepper.ledger.steps == STEPS
    assert stepper.ledger.event() == canonical(plan.run_event)
    assert 0.99 * EPSILON <= history.final["epsilon"] <= EPSILON
    assert history.final["epsilon"] == pytest.approx(plan.epsilon(), rel=1e-9)
    assert history.neighboring_relation == "add/remove-one" and history.steps_done == STEPS
    # The run trained: the logistic loss fell from log 2 at θ = 0.
    assert float(oracle.loss(history.theta)) < 0.9 * float(oracle.loss(torch.zeros(DIM, dtype=torch.float64)))


def test_a_registered_algorithm_whose_plan_claims_more_noise_than_it_adds_is_stopped(monkeypatch):
    """The mutant of the test above: the same toy whose ``planned_event`` says 1.5·z. Calibrated on
    that plan, it would spend more than ε; the run's ledger differs from the plan at the first
    check and the run stops as a privacy bug."""
    register(monkeypatch, Entry("toy-under-planned", f"{__name__}:under_planned_from_knobs", "Toy: wrong plan"))
    algorithm = registry.build("toy-under-planned", n=N, lr=0.5, clip=1.0, gamma=0.5, batch_size=30)
    plan = Plan(algorithm, n=N, steps=STEPS, delta=DELTA).calibrated(EPSILON)
    with pytest.raises(PlanMismatch, match=r"the run recorded 4 x PoissonSampledDpEvent\(sampling_probability=0\.1, .*"
                                           r"the ledger is not a prefix of the planned event \(a privacy bug\)"):
        train_watching_the_ledger(plan, glm(), monkeypatch)
