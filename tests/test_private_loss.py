"""A loss to watch: ``Private.diagnostics()`` gives the last step's mean training loss, labelled NOT
PRIVATE, from the forward its gradients already ran: exact, free, and changing nothing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

import dpopt
from dpopt.algorithms.registry import build
from dpopt.outputs import NOT_PRIVATE, unclassified
from tests.test_private import Counting
from tests.test_private_loader import DELTA, N, data, loss

class Counted(nn.Module):
    """A small network that counts its forward calls (a Python attribute, not a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2)).double()
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.net(x)


def private_run(algorithm: str, engine: str, records: Dataset | tuple[Tensor, Tensor], **options) -> dpopt.Private:
    plan = build(algorithm, n=N, batch_size=20, **options)
    return dpopt.Private(Counted(), loss, records, algorithm=plan, epsilon=None, delta=DELTA, steps=3, seed=3,
                         engine=engine)


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
@pytest.mark.parametrize("algorithm, options", [("dp-sgd", {}), ("dp-srm", {"clip_diff": 0.5, "gamma": 0.3}),
                                                ("aclip", {})])
def test_the_loss_to_watch_is_the_mean_loss_of_the_batch_at_the_point_of_its_gradients(engine, algorithm, options):
    """Exact: the mean of loss_fn over the records the step read (its realised batch), at the
    parameters the step's gradients were taken at, to rounding (float64). DP-SRM takes gradients
    at two points (the loss is the current one's); AClip takes a batch gradient, not per-record ones."""
    X, y = data()
    records = Counting(X, y)
    private = private_run(algorithm, engine, records, **options)
    assert math.isnan(private.diagnostics()["train_loss"])  # no step yet
    sgd = torch.optim.SGD(private.module.parameters(), lr=0.5)
    for t in private:
        with torch.no_grad():
            at_theta_t = loss(private.module(X), y)  # every record's loss at the step's parameters
        records.read.clear()
        private.backward()
        batch = torch.tensor(records.read)
        diagnostics = private.diagnostics()
        assert diagnostics["label"] == NOT_PRIVATE and diagnostics["step"] == t + 1
        assert len(batch) > 0 and diagnostics["train_loss"] == pytest.approx(float(at_theta_t[batch].mean()),
                                                                              rel=1e-12)
        sgd.step()


@pytest.mark.parametrize("engine, first", [("ghost", 2), ("vmap", 1)])
def test_reading_the_loss_costs_no_forward_and_changes_no_release(engine, first):
    """The same seeded run with and without reading the loss every step: the same θ, bit for bit,
    and the same forwards of the module: one per step, the one the gradients take (the ghost
    engine's first step runs one more, on one record, to find the layers inside the module)."""
    X, y = data()
    outputs, calls = [], []
    for read in (True, False):
        private = private_run("dp-sgd", engine, (X, y))
        private.module.calls, per_step = 0, []
        sgd = torch.optim.SGD(private.module.parameters(), lr=0.5)
        for _ in private:
            private.backward()
            if read:
                assert math.isfinite(private.diagnostics()["train_loss"])
            sgd.step()
            per_step.append(private.module.calls)
            private.module.calls = 0
        outputs.append(private.output())
        calls.append(per_step)
    assert torch.equal(outputs[0], outputs[1])
    assert calls == [[first, 1, 1]] * 2


def test_an_algorithm_without_a_gradient_at_its_iterate_has_no_loss_to_watch():
    """O2NC takes its gradients at random points between iterates: no loss at the iterate (NaN)."""
    X, y = data()
    o2nc = build("o2nc-first", n=N, batch_size=10, window=4, directions=2)
    private = dpopt.Private(Counted(), loss, (X, y), algorithm=o2nc, epsilon=None, delta=DELTA, steps=4, seed=0)
    private.step()
    assert math.isnan(private.diagnostics()["train_loss"])


def test_fit_writes_the_loss_only_as_a_labelled_diagnostic():
    """dpopt.fit's history has no train_loss unless diagnostics=True; then every log point's
    diagnostics hold the loss of the step just taken, classified and under the NOT PRIVATE label."""
    X, y = data()
    settings = {"epsilon": 2.0, "delta": DELTA, "epochs": 2, "batch_size": 20, "seed": 0}
    plain = dpopt.fit(Counted(), loss, (X, y), **settings)
    assert plain.diagnostics is None and "train_loss" not in str(plain.to_dict())
    watched = dpopt.fit(Counted(), loss, (X, y), diagnostics=True, **settings)
    assert watched.diagnostics["label"] == NOT_PRIVATE
    assert [record["step"] for record in watched.diagnostics["records"]] == [3, 6]
    assert all(0 < record["train_loss"] < 5 for record in watched.diagnostics["records"])
    assert unclassified(watched.to_dict()) == []
    assert torch.equal(watched.theta, plain.theta)
