"""Augmentation multiplicity (dpopt.augmentation): the views of an image (shifted copies, zero
filled; mnist-sota's views of scattering features are tested in tests/experiments/test_mnist_sota.py);
one record's loss the mean of its views' losses, whose gradient every engine computes as the mean
of the views' gradients and bounds from above (clipped once per record); and a run on views:
DP-SGD's privacy event for its n records, as without views; counting the views as records (the
mutant) is caught."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpopt import Private
from dpopt.algorithms import registry
from dpopt.augmentation import ONE_PIXEL_SHIFTS, mean_over_views, shift
from dpopt.models import cross_entropy
from dpopt.oracles import TorchModel

F64 = torch.float64


def test_a_shift_moves_pixels_in_as_zeros_and_drops_those_moved_out():
    image = torch.arange(1.0, 10.0).view(1, 3, 3)
    assert shift(image, 1, 0).tolist() == [[[0, 0, 0], [1, 2, 3], [4, 5, 6]]]
    assert shift(image, 0, -1).tolist() == [[[2, 3, 0], [5, 6, 0], [8, 9, 0]]]
    assert shift(image, -1, 1).tolist() == [[[0, 4, 5], [0, 7, 8], [0, 0, 0]]]
    assert torch.equal(shift(image, 0, 0), image) and not shift(image, 3, 0).any()
    assert ONE_PIXEL_SHIFTS == ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1))


def _views(n: int = 6, K: int = 5, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, K, d, generator=gen, dtype=F64), torch.randint(0, 3, (n,), generator=gen)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3)).double()


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_a_records_gradient_is_the_mean_of_its_views_gradients(engine):
    """Record by record, the engine's gradient (as it adds it to a sum) is (1/K) Σ_k ∇ℓ(f(v_k), y)
    by autograd on each view alone, and its norm bound is at least that gradient's norm."""
    X, y = _views()
    model = _model()
    params = list(model.parameters())
    want = torch.stack([torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        cross_entropy(model(X[i, k:k + 1]), y[i:i + 1]).sum(), params)]) for k in range(X.shape[1])]).mean(0)
        for i in range(len(y))])
    oracle = TorchModel(model, mean_over_views(cross_entropy), X, y, engine=engine)
    rows = oracle.per_record(oracle.flat_params(), torch.arange(len(y)))
    got = torch.stack([rows.weighted_sum(torch.eye(len(y), dtype=F64)[i]) for i in range(len(y))])
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert (rows.norms() >= want.norm(dim=1) * (1 - 1e-12)).all()
    assert torch.allclose(rows.norms(), want.norm(dim=1), rtol=1e-9, atol=0)
    # outputs without a views axis (the test images) are scored as by the loss itself
    out = model(X[:, 0])
    assert torch.equal(mean_over_views(cross_entropy)(out, y), cross_entropy(out, y))


def _private(X: torch.Tensor, y: torch.Tensor, loss) -> Private:  # noqa: ANN001
    algorithm = registry.build("dp-sgd", n=len(X), batch_size=20, clip=0.5)
    return Private(_model(), loss, (X, y), algorithm=algorithm, epsilon=2.0, delta=1e-5, steps=15, seed=0)


def test_a_run_on_views_spends_dp_sgds_event_for_its_records_and_counting_views_as_records_is_caught():
    """n images with K views each: the planned event and the ledger are those of DP-SGD on the n
    images seen once; the mutant that flattens the views into n·K records plans another event."""
    X, y = _views(n=120)
    with_views = _private(X, y, mean_over_views(cross_entropy))
    once = _private(X[:, 0], y, cross_entropy)
    assert with_views.plan.run_event == once.plan.run_event
    for private in (with_views, once):
        for _ in private:
            private.backward()
    assert with_views.epsilon() == once.epsilon() <= 2.0
    flattened = _private(X.reshape(-1, X.shape[2]), y.repeat_interleave(X.shape[1]), cross_entropy)
    assert flattened.plan.run_event != with_views.plan.run_event
