"""A per-record layer rule added by a user, end to end (docs/design.md's recipe): a parameter-free
layer of one's own, registered with ``ghost.KNOWN_LAYERS.with_per_record``, is called on the whole
batch instead of on each record under vmap, and a private run trained through a plan releases what
the run with the layer run record by record releases, with the ledger of the plan."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from dpopt import train
from dpopt.algorithms import registry
from dpopt.oracles import ghost
from dpopt.oracles.torch_model import TorchModel
from dpopt.plan import Plan

N, WIDTH, STEPS, DELTA = 64, 5, 6, 1e-5


class HalfTanh(nn.Module):
    """2·tanh(x/2), elementwise: acts on each record on its own. Records the shapes it is called on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append(tuple(x.shape))
        return 2 * torch.tanh(x / 2)


def oracle(engine: str, known: ghost.Registry = ghost.KNOWN_LAYERS) -> TorchModel:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(WIDTH, 8), HalfTanh(), nn.Linear(8, 1)).double()
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(N, WIDTH, generator=gen, dtype=torch.float64)
    y = torch.sin(X.sum(1))
    return TorchModel(module, lambda out, target: (out.squeeze(-1) - target).square(), X, y, engine=engine,
                      known_layers=known)


def run(plan: Plan, model: TorchModel) -> train.History:
    return train.train(plan, model, train.Options(seed=5, log_every=STEPS), theta0=model.flat_params())


def test_a_layer_registered_as_per_record_runs_on_the_whole_batch_and_trains_as_when_run_per_record():
    unregistered = oracle("ghost")
    assert unregistered.rules() == [("0", "ghost"), ("1", "vmap"), ("2", "ghost")]
    registered = oracle("ghost", ghost.KNOWN_LAYERS.with_per_record(HalfTanh))
    assert registered.rules() == [("0", "ghost"), ("2", "ghost")]

    plan = Plan(registry.build("dp-sgd", n=N, lr=0.5, clip=0.5, batch_size=16), n=N, steps=STEPS,
                delta=DELTA).calibrated(3.0)
    histories = {}
    for name, model in (("unregistered", unregistered), ("registered", registered)):
        model.module[1].seen.clear()
        histories[name] = run(plan, model)
        shapes = set(model.module[1].seen)
        if name == "registered":  # called on whole batches of records, [B, 8]
            assert max(batch for batch, _ in shapes) > 1, shapes
        else:                     # called on each record alone under vmap, as a batch of one
            assert shapes == {(1, 8)}, shapes
        assert histories[name].final["epsilon"] == pytest.approx(plan.epsilon(), rel=1e-9)
        assert histories[name].steps_done == STEPS

    # Where the layer runs changes nothing that is released: the same batches, clip weights and noise.
    want = histories["unregistered"].theta
    assert not torch.allclose(want, registered.flat_params(), atol=1e-3)  # the run moved θ
    assert torch.allclose(histories["registered"].theta, want, rtol=1e-9, atol=1e-12)
