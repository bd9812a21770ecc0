"""Tests of the model registry: shapes, layer types (no BatchNorm; every parametrised layer on the
ghost fast path), seeding, errors, and ghost norms equal to vmap norms on real MNIST images."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpopt._validate import DpoptError
from dpopt.data import read_idx
from dpopt.models import MODELS, make_model
from dpopt.oracles.torch_model import TorchModel

SHAPES = {"mnist-cnn": (784, 26_010), "cnn5": (3072, 167_642), "cnn6": (3072, 550_570)}
ALLOWED = (nn.Unflatten, nn.Conv2d, nn.Tanh, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear)


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def mnist8(shared_data_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The first 8 test images as float64 rows in [0, 1] and their labels."""
    folder = shared_data_dir / "mnist"
    images = read_idx(folder / "t10k-images-idx3-ubyte.gz")[:8]
    labels = read_idx(folder / "t10k-labels-idx1-ubyte.gz")[:8]
    X = torch.from_numpy(images.reshape(8, 784)).double() / 255
    return X, torch.from_numpy(labels).long()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_shapes_layers_and_fast_path(name, activation):
    model = make_model(name, activation=activation, seed=0)
    width, n_params = SHAPES[name]
    assert isinstance(model, nn.Sequential) and isinstance(model[0], nn.Unflatten)
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert all(isinstance(layer, ALLOWED) for layer in model)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    act = nn.Tanh if activation == "tanh" else nn.ReLU
    assert any(isinstance(layer, act) for layer in model)
    with torch.no_grad():
        assert model(torch.rand(3, width)).shape == (3, 10)
    oracle = TorchModel(model, cross_entropy, torch.rand(2, width), torch.arange(2))
    assert {rule for _, rule in oracle.rules()} == {"ghost"}


def test_seed_is_reproducible_and_leaves_the_global_generator_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    first, second = make_model("mnist-cnn", seed=1), make_model("mnist-cnn", seed=1)
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    other = make_model("mnist-cnn", seed=2)
    assert not torch.equal(first[1].weight, other[1].weight)


def test_unknown_names_are_refused():
    with pytest.raises(DpoptError, match=r"^model='resnet' must be one of: mnist-cnn, cnn5, cnn6$"):
        make_model("resnet")
    with pytest.raises(DpoptError, match=r"^activation='gelu' must be one of: tanh, relu$"):
        make_model("cnn5", activation="gelu")


def test_ghost_norms_match_vmap_on_mnist_images(mnist8):
    X, y = mnist8
    model = make_model("mnist-cnn", seed=0).double()
    oracles = {engine: TorchModel(model, cross_entropy, X, y, engine=engine) for engine in ("ghost", "vmap")}
    theta = oracles["vmap"].flat_params()
    other = theta + 0.01 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(0), dtype=theta.dtype)
    idx = torch.arange(8)
    rows = {engine: oracle.per_record(theta, idx) for engine, oracle in oracles.items()}
    norms = {engine: r.norms() for engine, r in rows.items()}
    assert norms["vmap"].shape == (8,) and (norms["vmap"] > 0).all()
    assert relative(norms["ghost"], norms["vmap"]) < 1e-5
    assert torch.allclose(norms["ghost"], norms["vmap"], rtol=1e-5, atol=0)
    weights = torch.linspace(0.1, 1.0, 8, dtype=torch.float64)
    assert relative(rows["ghost"].weighted_sum(weights), rows["vmap"].weighted_sum(weights)) < 1e-5
    # DP-SRM's per-record gradient differences between two points, on the same records
    diffs = {engine: (oracle.per_record(theta, idx) - oracle.per_record(other, idx)).norms()
             for engine, oracle in oracles.items()}
    assert torch.allclose(diffs["ghost"], diffs["vmap"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", ["cnn5", "cnn6"])
def test_ghost_norms_match_vmap_on_cifar_shaped_inputs(name):
    gen = torch.Generator().manual_seed(0)
    X, y = torch.rand(3, 3072, generator=gen, dtype=torch.float64), torch.tensor([0, 3, 9])
    model = make_model(name, seed=0).double()
    norms = {engine: TorchModel(model, cross_entropy, X, y, engine=engine).per_record(
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]), torch.arange(3)).norms()
        for engine in ("ghost", "vmap")}
    assert torch.allclose(norms["ghost"], norms["vmap"], rtol=1e-5, atol=0)
