"""``dpopt.fit``: one call from a torch module and Dataset to a calibrated private run."""

from __future__ import annotations


import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import dpopt
from dpopt._validate import DpoptError
from dpopt.algorithms.registry import build
from dpopt.plan import steps_for_epochs
from dpopt.oracles import TorchModel


def data(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(n, 6, generator=gen)
    y = (X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 1.0, -1.0]) > 0).long()
    return X, y


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


class Pairs(Dataset):
    """A map-style Dataset that is not a TensorDataset."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.X[i], self.y[i]


@pytest.mark.parametrize(("algorithm", "options"), [
    ("dp-sgd", {}), ("dp-srm", {}), ("aclip", {"lr": 0.05}), ("dp-bandmf", {}), ("dp-sgd", {"clip_quantile": 0.5}),
    ("dp-sgd", {"optimizer": "adambc", "lr": 0.01, "adam_gamma": 1e-6})],
    ids=["dp-sgd", "dp-srm", "aclip", "dp-bandmf", "clip_quantile", "adambc"])
def test_fit_spends_the_budget_trains_and_writes_the_output_back(algorithm, options):
    X, y = data()
    net = model()
    before = TorchModel(net, loss, X, y).loss(TorchModel(net, loss, X, y).flat_params().double())
    history = dpopt.fit(net, loss, TensorDataset(X, y), algorithm=algorithm, epsilon=4.0, delta=1e-5, epochs=20,
                        batch_size=50, clip=1.0, test_data=(X, y), seed=0, **({"lr": 0.5} | options))
    assert 0.99 * 4.0 <= history.final["epsilon"] <= 4.0
    assert history.neighboring_relation == "add/remove-one"
    oracle = TorchModel(net, loss, X, y)
    assert torch.allclose(oracle.flat_params().double(), history.theta.to(torch.float32).double())
    assert float(oracle.loss(oracle.flat_params().double())) < float(before)  # it learnt something
    assert history.final["test_error"] < 0.5
    assert history.final["expected_passes"] == pytest.approx(20, rel=0.02)  # DP-SRM's first batch is 2b


def test_a_dataset_and_a_tensor_pair_give_the_same_run():
    X, y = data()
    a = dpopt.fit(model(), loss, Pairs(X, y), epsilon=2.0, delta=1e-5, epochs=2, batch_size=40, seed=1)
    b = dpopt.fit(model(), loss, (X, y), epsilon=2.0, delta=1e-5, epochs=2, batch_size=40, seed=1)
    assert torch.equal(a.theta, b.theta) and a.final["epsilon"] == b.final["epsilon"]


def test_tiny_poisson_batches_with_empty_ones_are_accounted():
    """Expected batch 1 of n = 30: about e⁻¹ of the steps draw an empty batch; every step still
    releases noise and is recorded (ε equals the planned ε of all steps)."""
    X, y = data(30)
    algo = build("dp-sgd", n=30, batch_size=1)
    steps = steps_for_epochs(algo, 30, 3)
    history = dpopt.fit(model(), loss, (X, y), epsilon=1.0, delta=1e-5, epochs=3, batch_size=1)
    assert history.steps_done == steps == 90
    calibrated = dpopt.calibrate(algo, epsilon=1.0, delta=1e-5, n=30, steps=steps)
    planned = dpopt.epsilon_of(calibrated.planned_event(30, steps), 1e-5, calibrated.relation())
    assert history.final["epsilon"] == pytest.approx(planned, rel=1e-9)
    assert bool(history.theta.isfinite().all())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epsilon": 0.0}, "epsilon=0.0 must be > 0"),
    ({"delta": 1.0}, "delta=1.0 must be in (0, 1)"),
    ({"delta": 0.01}, "delta=0.01 must be < 1/n = 0.005 for n=200 records"),
    ({"epochs": -1.0}, "epochs=-1.0 must be > 0"),
    ({"algorithm": "adam"}, "algorithm='adam' must be one of"),
    ({"batch_size": 500}, "batch_size=500 must be >= 1 and <= n (training records)=200"),
])
def test_bad_arguments_are_named(kwargs, message):
    X, y = data()
    settings = {"epsilon": 1.0, "delta": 1e-5, "epochs": 1.0, "batch_size": 40} | kwargs
    with pytest.raises(DpoptError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dpopt.fit(model(), loss, (X, y), **settings)


def test_bad_data_and_losses_are_explained():
    X, y = data()
    with pytest.raises(DpoptError, match="train_data must be a map-style torch Dataset"):
        dpopt.fit(model(), loss, [X, y], epsilon=1.0, delta=1e-5, epochs=1)
    with pytest.raises(DpoptError, match="one loss per record"):
        dpopt.fit(model(), lambda out, t: nn.functional.cross_entropy(out, t), (X, y), epsilon=1.0, delta=1e-5,
                  epochs=1, batch_size=40)


def test_a_delta_of_at_least_one_over_n_runs_when_allowed():
    X, y = data()
    history = dpopt.fit(model(), loss, (X, y), epsilon=1.0, delta=0.01, epochs=1.0, batch_size=40,
                        allow_large_delta=True)
    assert history.delta == 0.01 and history.final["epsilon"] <= 1.0
