"""How to add an algorithm, done for a toy one with a hyper-parameter of its own (the exponent p of
its decaying step size): the algorithm, its parameter dataclass and its builder (in dpopt, its own
file under ``dpopt/algorithms/``; here, this module), and one registry entry (in dpopt, a line of
``ENTRIES``; here, :meth:`~dpopt.algorithms.registry.Registry.register`). The command line then
offers ``--decay`` (run, audit; tune's grids), calibrates, runs, tunes and audits it by name like
every other algorithm, and the run's ledger is checked against its planned event. A shipped
algorithm also gets its row in the contract table (tests/contracts/test_algorithms.py checks that
every registered algorithm has one)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import dp_accounting as dpa
import pytest
import torch
from torch import Tensor

from dpopt import _validate, data
from dpopt import plan as plan_module
from dpopt import train as train_module
from dpopt.algorithms import registry
from dpopt.algorithms.dp_sgd import DPSGD, DPSGDState
from dpopt.algorithms.params import Params, knob
from dpopt.base import Batch, NoiseSource, Oracle, Sampler
from dpopt.cli import main
from dpopt.cli.common import algorithm_help
from dpopt.cli.tune import space_of
from dpopt.oracles import make
from dpopt.plan import plan_for
from dpopt.train import Options, train


@dataclass(frozen=True)
class DecayingSGD:
    """DP-SGD whose step size decays: θ_{t+1} = θ_t − η/(t+1)^p · (Σ_{i∈B_t} clip(∇f_i(θ_t), C) +
    N(0, (zC)² I)) / b on a Poisson batch of expected size b; step t is DP-SGD's step at step size
    η/(t+1)^p, so its event is DP-SGD's (the Poisson-sampled Gaussian of multiplier z) and so is its
    state (a checkpoint holds only dpopt's records)."""

    lr: float
    clip: float
    noise_multiplier: float
    batch_size: int
    decay: float = 0.5

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def at(self, t: int) -> DPSGD:
        """DP-SGD at step t's step size."""
        return DPSGD(lr=self.lr / (t + 1) ** self.decay, clip=self.clip, noise_multiplier=self.noise_multiplier,
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


@dataclass(frozen=True)
class DecayingParams(Params):
    """The toy algorithm's parameters: the common ones, and its own ``decay`` p."""

    decay: float = knob(0.5, "decaying-sgd's exponent p > 0 of its step size η/(t+1)^p", check=_validate.positive,
                        tunable=True)


def decaying_from_params(params: DecayingParams) -> DecayingSGD:
    """``decaying-sgd`` by name: ``lr``, ``clip``, ``batch_size``, ``decay`` (its noise multiplier at 1,
    for the plan to calibrate)."""
    _validate.positive_int("batch_size", params.batch_size, maximum=params.n, maximum_name="n (training records)")
    return DecayingSGD(lr=params.lr, clip=params.clip, noise_multiplier=1.0, batch_size=params.batch_size,
                       decay=params.decay)


ENTRY = registry.Entry("decaying-sgd", f"{__name__}:decaying_from_params", "DP-SGD with step size η/(t+1)^p",
                       DecayingParams, noises=("torch", "secure"))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> registry.Entry:
    """The toy algorithm in the registry in use for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "REGISTRY", registry.REGISTRY.register(ENTRY))
    return ENTRY


def test_a_registered_algorithm_runs_through_dpopt_run(registered, tmp_path, capsys):
    """`dpopt run --algorithm decaying-sgd --decay 0.25` calibrates it to ε = 1, checks its ledger,
    and gives exactly the θ of the same plan run in Python (at p = 0.25: the flag reached it)."""
    argv = ["run", "--algorithm", "decaying-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "20",
            "--lr", "0.3", "--decay", "0.25", "--seed", "4", "--json", "--out", str(tmp_path)]
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["algorithm"] == "decaying-sgd" and shown["steps_done"] == 20
    assert 0.99 <= shown["final"]["epsilon"] <= 1.0
    adult = data.load("adult")  # its declared preparation leaves it as given
    oracle = make("logistic", torch.as_tensor(adult.X_train), torch.as_tensor(adult.y_train), reg=1e-3)
    plan = plan_for(registry.build("decaying-sgd", n=oracle.n, lr=0.3, decay=0.25), n=oracle.n, steps=20, delta=1e-5,
                    epsilon=1.0)
    assert json.loads((tmp_path / "history.json").read_text())["theta"] == train(plan, oracle,
                                                                                 Options(seed=4)).theta.tolist()


def test_a_registered_algorithm_is_audited_by_name(registered, capsys, monkeypatch):
    """`dpopt audit --algorithm decaying-sgd --decay 0.75` audits the algorithm at p = 0.75."""
    planned = []
    real = plan_module.plan_for
    monkeypatch.setattr(plan_module, "plan_for", lambda algorithm, **kw: planned.append(algorithm) or real(algorithm,
                                                                                                             **kw))
    assert main(["audit", "--algorithm", "decaying-sgd", "--epsilon", "2", "--runs", "50", "--steps", "2",
                 "--decay", "0.75", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["algorithm"] == "decaying-sgd" and 1.98 <= result["claimed_epsilon"] <= 2.0
    assert result["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert [algorithm.decay for algorithm in planned] == [0.75]


@pytest.mark.parametrize("command", ["run", "tune", "audit"])
def test_a_new_hyper_parameter_is_a_flag_once_its_algorithm_is_registered(command, monkeypatch, capsys):
    """The flag comes from the registered entry's parameter dataclass: absent before, present (with
    its help and default) after one registry line; tune offers it as a grid name, not a fixed flag
    (its declaration names every command)."""
    def shown() -> str:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        return " ".join(capsys.readouterr().out.split())

    assert "decay" not in shown()
    monkeypatch.setattr(registry, "REGISTRY", registry.REGISTRY.register(ENTRY))
    text = shown()
    assert "--decay DECAY decaying-sgd's exponent p > 0 of its step size η/(t+1)^p (default: 0.5)" in text
    if command == "tune":
        assert "gamma, clip_diff, obj_clip, decay;" in text  # --grid's names


def test_a_new_hyper_parameter_is_checked_naming_its_flag(registered, capsys, tmp_path):
    assert main(["run", "--algorithm", "decaying-sgd", "--epsilon", "1", "--decay", "0", "--out",
                 str(tmp_path)]) == 2
    assert "--decay=0.0 must be > 0 and finite" in capsys.readouterr().err


def test_a_registered_algorithm_is_tuned_over_its_own_hyper_parameter(registered, tmp_path, capsys, monkeypatch):
    """`dpopt tune --grid decay=0.25,0.5`: every trial's algorithm has one of the grid's p."""
    decays = []
    real = train_module.train
    monkeypatch.setattr(train_module, "train", lambda plan, *args: decays.append(plan.algorithm.decay)
                        or real(plan, *args))
    assert main(["tune", "--algorithm", "decaying-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5",
                 "--grid", "decay=0.25,0.5", "--trials-mean", "3", "--seed", "2", "--json", "--out",
                 str(tmp_path)]) == 0
    tuned = json.loads(capsys.readouterr().out)
    assert decays and set(decays) <= {0.25, 0.5}
    assert tuned["hyperparameters"]["decay"] in (0.25, 0.5)
    with pytest.raises(_validate.DpoptError, match=r"^range decay='1' must be two numbers LOW,HIGH$"):
        space_of([], ["decay=1"])


def test_the_registry_is_an_immutable_value(monkeypatch):
    """register returns a new registry, the one it extends unchanged; the names (NAMES, FEDERATED,
    the command line's list) are those of the registry in use, additions included."""
    before = registry.REGISTRY
    extended = before.register(ENTRY)
    assert "decaying-sgd" in extended and "decaying-sgd" not in before and registry.REGISTRY is before
    assert "decaying-sgd" not in registry.NAMES
    monkeypatch.setattr(registry, "REGISTRY", extended)
    assert registry.NAMES[-1] == "decaying-sgd" and registry.PRIVATE[-1] == "decaying-sgd"
    assert registry.FEDERATED == ("diff2-gd", "diff2-bvr")
    assert "decaying-sgd" in algorithm_help()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.entries = ()  # type: ignore[misc]


def test_a_hyper_parameter_name_has_one_declaration():
    """Two parameter classes declaring one name differently would give two flags of one name: refused."""
    @dataclass(frozen=True)
    class OtherGamma(Params):
        gamma: float = knob(0.5, "another γ")

    clash = registry.Entry("other", f"{__name__}:decaying_from_params", "a clash", OtherGamma)
    with pytest.raises(_validate.DpoptError, match=r"^hyper-parameter 'gamma' of algorithm='other' is declared "):
        registry.REGISTRY.register(clash)


def test_the_shipped_flags_are_those_the_commands_always_had():
    """The flags generated from the shipped parameter classes are exactly the former lists."""
    assert set(registry.REGISTRY.flags("run")) == {
        "batch_size", "sampling", "lr", "clip", "clip_diff", "clients", "restart", "local_steps", "gamma",
        "noise_ratio", "obj_clip", "noise", "bands", "clip_quantile", "clip_lr", "count_noise", "optimizer",
        "adam_gamma", "val_rate", "threshold"}
    assert set(registry.REGISTRY.flags("tune")) == {
        "batch_size", "sampling", "lr", "clip", "clip_diff", "gamma", "bands", "clip_quantile", "clip_lr",
        "count_noise", "optimizer", "adam_gamma"}
    assert set(registry.REGISTRY.flags("audit")) == {
        "batch_size", "sampling", "lr", "clip", "noise", "bands", "clip_quantile", "clip_lr", "count_noise",
        "optimizer", "adam_gamma"}
    assert set(registry.REGISTRY.tunable()) == {"lr", "clip", "clip_diff", "gamma", "obj_clip", "bands",
                                                "clip_quantile", "clip_lr", "optimizer", "adam_gamma"}


def test_a_name_is_registered_once():
    with pytest.raises(_validate.DpoptError, match=r"^algorithm='dp-sgd' is registered already$"):
        registry.register(registry.REGISTRY["dp-sgd"])
