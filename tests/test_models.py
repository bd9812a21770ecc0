"""Tests of the model registry: shapes, layer types (no BatchNorm; every parametrised layer of the
CNNs on the ghost fast path), seeding, errors, ghost norms equal to vmap norms on real MNIST
images, the GroupNorm ResNet-18, and the ScatterNet + linear model of mnist-sota (its per-record
gradients under ghost equal vmap's and autograd's, its GroupNorm per record)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpopt._validate import DpoptError
from dpopt.data import read_idx
from dpopt.models import NETWORKS, BasicBlock, make_model
from dpopt.oracles.torch_model import TorchModel
from dpopt.scattering import Scattering2D

SHAPES = {"mnist-cnn": (784, 26_010), "cnn5": (3072, 167_642), "cnn6": (3072, 550_570)}  # the plain CNNs
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


@pytest.mark.parametrize("name", sorted(SHAPES))
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
    with pytest.raises(DpoptError, match=r"^model='resnet' must be one of: mnist-cnn, cnn5, cnn6, resnet18, "
                                         r"scatternet-linear, linear$"):
        make_model("resnet")
    with pytest.raises(DpoptError, match=r"^activation='gelu' must be one of: tanh, relu, softplus$"):
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


RESNET18_PARAMS = 11_173_962  # = the BatchNorm CIFAR ResNet-18's: GroupNorm has the same affine parameters


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    return make_model("resnet18", seed=0)


def test_resnet18_layers_and_parameter_count(resnet18):
    assert sorted(NETWORKS) == ["cnn5", "cnn6", "linear", "mnist-cnn", "resnet18", "scatternet-linear"]
    assert sum(p.numel() for p in resnet18.parameters()) == RESNET18_PARAMS
    assert list(resnet18.buffers()) == []
    assert isinstance(resnet18, nn.Sequential) and isinstance(resnet18[0], nn.Unflatten)
    assert resnet18[0].unflattened_size == (3, 32, 32)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in resnet18.modules())
    norms = [m for m in resnet18.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 8 * 2 + 3 and all(m.num_groups == 32 and m.affine for m in norms)
    stem = resnet18[1]
    assert (stem.in_channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding) == (
        3, 64, (3, 3), (1, 1), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in resnet18.modules())
    blocks = [m for m in resnet18 if isinstance(m, BasicBlock)]
    assert [(b.residual[0].out_channels, b.residual[0].stride[0]) for b in blocks] == [
        (64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]
    shortcuts = [b.shortcut[0] for b in blocks if not isinstance(b.shortcut, nn.Identity)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in shortcuts] == [
        (64, 128, (1, 1), (2, 2)), (128, 256, (1, 1), (2, 2)), (256, 512, (1, 1), (2, 2))]
    assert all(c.bias is None for c in resnet18.modules() if isinstance(c, nn.Conv2d))
    assert isinstance(resnet18[-3], nn.AdaptiveAvgPool2d) and isinstance(resnet18[-1], nn.Linear)
    assert (resnet18[-1].in_features, resnet18[-1].out_features) == (512, 10)
    assert sum(isinstance(m, nn.ReLU) for m in resnet18.modules()) == 1 + 8 * 2
    assert not any(isinstance(m, nn.Tanh) for m in resnet18.modules())
    with torch.no_grad():
        out = resnet18(torch.rand(2, 3072, generator=torch.Generator().manual_seed(0)))
    assert out.shape == (2, 10) and out.dtype == torch.float32 and out.isfinite().all()


def test_resnet18_is_seeded():
    first, second, other = (make_model("resnet18", seed=s) for s in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not torch.equal(first[1].weight, other[1].weight)
    assert any(isinstance(m, nn.Tanh) for m in make_model("resnet18", activation="tanh", seed=0).modules())


def test_resnet18_in_the_torch_oracle(resnet18):
    """TorchModel accepts it (no BatchNorm): both engines give the same per-record gradients."""
    gen = torch.Generator().manual_seed(0)
    X, y = torch.rand(4, 3072, generator=gen), torch.tensor([0, 3, 9, 1])
    oracles = {engine: TorchModel(resnet18, cross_entropy, X, y, engine=engine) for engine in ("vmap", "ghost")}
    assert oracles["vmap"].dim == RESNET18_PARAMS
    rules = dict(oracles["ghost"].rules())
    # every layer has a ghost rule, also inside the 8 residual blocks (whose own forward runs under vmap)
    assert rules["1"] == rules["2"] == rules["4.residual.0"] == rules["14"] == "ghost"
    assert [path for path, rule in rules.items() if rule == "vmap"] == [str(k) for k in range(4, 12)]
    theta, idx = oracles["vmap"].flat_params(), torch.arange(4)
    rows = {engine: oracle.per_record(theta, idx) for engine, oracle in oracles.items()}
    # The rows' norms in float64: Dense.norms() sums 11 M float32 squares in float32 (~1e-3 off).
    exact = rows["vmap"].rows.double().norm(dim=1)
    assert rows["vmap"].rows.shape == (4, RESNET18_PARAMS) and (exact > 0).all()
    assert torch.allclose(rows["ghost"].norms().double(), exact, rtol=1e-4, atol=0)
    weights = torch.tensor([1.0, 0.5, 0.0, 0.25])
    assert relative(rows["ghost"].weighted_sum(weights), rows["vmap"].weighted_sum(weights)) < 1e-4


# ------------------------------------------------------------------- mnist-sota's models


def test_scatternet_linear_layers_options_and_fast_path():
    """GroupNorm without affine parameters on the 81 × 7 × 7 features, then one linear layer; every
    layer with parameters on the ghost fast path (run on the whole batch: full speed)."""
    model = make_model("scatternet-linear", seed=0)
    assert [type(layer) for layer in model] == [nn.Unflatten, nn.GroupNorm, nn.Flatten, nn.Linear]
    assert (model[1].num_groups, model[1].num_channels, model[1].affine) == (27, 81, False)
    assert sum(p.numel() for p in model.parameters()) == 3969 * 10 + 10
    assert make_model("scatternet-linear", groups=9)[1].num_groups == 9
    oracle = TorchModel(model, cross_entropy, torch.rand(2, 3969), torch.arange(2))
    assert oracle.rules() == [("3", "ghost")] and oracle._plan_runs_whole_batch
    with pytest.raises(DpoptError, match=r"^groups=4 must divide the 81 feature channels"):
        make_model("scatternet-linear", groups=4)
    with pytest.raises(DpoptError, match=r"^activation='tanh': model='scatternet-linear' has no activation"):
        make_model("scatternet-linear", activation="tanh")
    with pytest.raises(DpoptError, match=r"^options \['groups'\] are not options of model='mnist-cnn'"):
        make_model("mnist-cnn", groups=3)


def test_linear_is_scatternets_last_layer_alone():
    """``"linear"`` (for features normalised beforehand): one layer on the ghost fast path, with the
    weights of ``"scatternet-linear"``'s layer for the same seed."""
    model = make_model("linear", inputs=3969, seed=0)
    assert [type(layer) for layer in model] == [nn.Linear] and model[0].out_features == 10
    reference = make_model("scatternet-linear", seed=0)[3]
    assert torch.equal(model[0].weight, reference.weight) and torch.equal(model[0].bias, reference.bias)
    oracle = TorchModel(model, cross_entropy, torch.rand(2, 3969), torch.arange(2))
    assert oracle.rules() == [("0", "ghost")] and oracle._plan_runs_whole_batch
    assert make_model("linear", inputs=5, outputs=3)[0].weight.shape == (3, 5)
    with pytest.raises(DpoptError, match=r"^inputs=0 must be"):
        make_model("linear", inputs=0)


def test_scatternet_group_norm_is_per_record():
    """A record's output alone equals its output in a batch whose other records are far off."""
    model = make_model("scatternet-linear", seed=0).double()
    X = torch.rand(5, 3969, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X[1:] *= 1000.0
    with torch.no_grad():
        assert torch.allclose(model(X[:1]), model(X)[:1], rtol=1e-12, atol=1e-12)
        X[2:] = -X[2:]
        assert torch.allclose(model(X[:1]), model(X)[:1], rtol=1e-12, atol=1e-12)


def _record_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇ℓ of one record by autograd on the plain module, flat."""
    model.zero_grad()
    cross_entropy(model(x[None]), y[None]).sum().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("name", ["mnist-cnn", "scatternet-linear"])
def test_per_record_gradients_ghost_equal_vmap_and_autograd(name, mnist8):
    """Each record's gradient (the weighted sum with weight 1 on it alone) under the ghost engine
    equals vmap's and autograd's on the record alone, in float64, on real MNIST images (their
    scattering features for the linear model)."""
    X, y = mnist8
    if name == "scatternet-linear":
        X = Scattering2D((28, 28))(X.reshape(-1, 28, 28)).reshape(len(X), -1)
    model = make_model(name, seed=0).double()
    oracles = {engine: TorchModel(model, cross_entropy, X, y, engine=engine) for engine in ("ghost", "vmap")}
    theta, idx = oracles["vmap"].flat_params(), torch.arange(len(X))
    rows = {engine: oracle.per_record(theta, idx) for engine, oracle in oracles.items()}
    for i in range(len(X)):
        one = torch.zeros(len(X), dtype=torch.float64)
        one[i] = 1.0
        ghost, vmap = (rows[engine].weighted_sum(one) for engine in ("ghost", "vmap"))
        exact = _record_gradient(model, X[i], y[i])
        assert relative(ghost, exact) < 1e-10 and relative(vmap, exact) < 1e-10
        assert rows["ghost"].norms()[i].item() == pytest.approx(float(exact.norm()), rel=1e-10)
