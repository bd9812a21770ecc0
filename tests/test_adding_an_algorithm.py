"""How to add an algorithm, done for a toy one: the algorithm and its builder from
:class:`~dpopt.algorithms.registry.Knobs` (in dpopt, its own file under ``dpopt/algorithms/``; here,
this module), and one registry entry (in dpopt, a line of ``ENTRIES``; here, ``register``). The
command line then calibrates, runs and audits it by name like every other algorithm, and the run's
ledger is checked against its planned event. A shipped algorithm also gets its row in the contract
table (tests/contracts/test_algorithms.py checks that every registered algorithm has one)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import dp_accounting as dpa
import pytest
import torch
from torch import Tensor

from dpopt import _validate, data
from dpopt.algorithms import registry
from dpopt.algorithms.dp_sgd import DPSGD, DPSGDState
from dpopt.base import Batch, NoiseSource, Oracle, Sampler
from dpopt.cli import main
from dpopt.oracles import make
from dpopt.plan import plan_for
from dpopt.train import Options, train


@dataclass(frozen=True)
class DecayingSGD:
    """DP-SGD whose step size decays: θ_{t+1} = θ_t − η/√(t+1) · (Σ_{i∈B_t} clip(∇f_i(θ_t), C) +
    N(0, (zC)² I)) / b on a Poisson batch of expected size b; step t is DP-SGD's step at step size
    η/√(t+1), so its event is DP-SGD's (the Poisson-sampled Gaussian of multiplier z) and so is its
    state (a checkpoint holds only dpopt's records)."""

    lr: float
    clip: float
    noise_multiplier: float
    batch_size: int

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def at(self, t: int) -> DPSGD:
        """DP-SGD at step t's step size."""
        return DPSGD(lr=self.lr / math.sqrt(t + 1), clip=self.clip, noise_multiplier=self.noise_multiplier,
                     batch_size=self.batch_size)

    def relation(self) -> dpa.NeighboringRelation:
        return self.at(0).relation()

    def sampler(self, t: int, n: int) -> Sampler:
        return self.at(t).sampler(t, n)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DPSGDState:
        return self.at(0).init(theta0, steps, gen)

    def step(self, state: DPSGDState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DPSGDState, dpa.DpEvent]:
        return self.at(batch.t).step(state, batch, oracle, source)

    def output(self, state: DPSGDState) -> Tensor:
        return self.at(0).output(state)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return self.at(0).planned_event(n, steps)


def decaying_from_knobs(knobs: registry.Knobs) -> DecayingSGD:
    """``decaying-sgd`` by name: ``lr``, ``clip``, ``batch_size`` (its noise multiplier at 1, for the plan
    to calibrate)."""
    _validate.positive_int("batch_size", knobs.batch_size, maximum=knobs.n, maximum_name="n (training records)")
    return DecayingSGD(lr=knobs.lr, clip=knobs.clip, noise_multiplier=1.0, batch_size=knobs.batch_size)


ENTRY = registry.Entry("decaying-sgd", f"{__name__}:decaying_from_knobs", "DP-SGD with step size η/√(t+1)",
                       noises=("torch", "secure"))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> registry.Entry:
    """The toy algorithm in the registry for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    return registry.register(ENTRY)


def test_a_registered_algorithm_runs_through_dpopt_run(registered, tmp_path, capsys):
    """`dpopt run --algorithm decaying-sgd` calibrates it to ε = 1, checks its ledger, and gives
    exactly the θ of the same plan run in Python."""
    argv = ["run", "--algorithm", "decaying-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "20",
            "--lr", "0.3", "--seed", "4", "--json", "--out", str(tmp_path)]
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["algorithm"] == "decaying-sgd" and shown["steps_done"] == 20
    assert 0.99 <= shown["final"]["epsilon"] <= 1.0
    adult = data.load("adult")  # its declared preparation leaves it as given
    oracle = make("logistic", torch.as_tensor(adult.X_train), torch.as_tensor(adult.y_train), reg=1e-3)
    plan = plan_for(registry.build("decaying-sgd", n=oracle.n, lr=0.3), n=oracle.n, steps=20, delta=1e-5,
                    epsilon=1.0)
    assert json.loads((tmp_path / "history.json").read_text())["theta"] == train(plan, oracle,
                                                                                 Options(seed=4)).theta.tolist()


def test_a_registered_algorithm_is_audited_by_name(registered, capsys):
    assert main(["audit", "--algorithm", "decaying-sgd", "--epsilon", "2", "--runs", "50", "--steps", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["algorithm"] == "decaying-sgd" and 1.98 <= result["claimed_epsilon"] <= 2.0
    assert result["epsilon_lower_bound"] <= result["claimed_epsilon"]


def test_a_name_is_registered_once():
    with pytest.raises(_validate.DpoptError, match=r"^algorithm='dp-sgd' is registered already$"):
        registry.register(registry.REGISTRY["dp-sgd"])
