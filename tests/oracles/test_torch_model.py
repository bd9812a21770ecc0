"""The TorchModel oracle: construction checks, θ ↔ module, loss/gradient/error against autograd,
dtypes, and end-to-end runs: DP-SGD and DP-SRM without noise or clipping on a tiny CNN
reproduce SGD (computed here with autograd on the same batches) and STORM.

Engine agreement over layer types and shapes is in test_ghost.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpopt
from dpopt import sampling, train
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger, canonical
from dpopt.oracles.torch_model import TorchModel

F64 = torch.float64
N = 48
ENGINES = ("vmap", "ghost")


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


def tiny_cnn(dtype=F64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 4, 3, stride=2), nn.GroupNorm(2, 4),
                         nn.Tanh(), nn.Flatten(), nn.Linear(4 * 2 * 2, 3)).to(dtype)


def data(dtype=F64, n=N):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 6, 6, generator=gen, dtype=F64).to(dtype), torch.randint(0, 3, (n,), generator=gen)


def oracle(engine="ghost", dtype=F64, **kwargs) -> TorchModel:
    return TorchModel(tiny_cnn(dtype), cross_entropy, *data(dtype), engine=engine, **kwargs)


def module_at(o: TorchModel, theta: torch.Tensor) -> nn.Module:
    """A copy of the module holding θ, set through torch's own vector_to_parameters."""
    module = copy.deepcopy(o.module)
    torch.nn.utils.vector_to_parameters(theta.to(o.dtype), [p for p in module.parameters() if p.requires_grad])
    return module


# ---------------------------------------------------------------------------- construction


def refusal(norm: nn.Module) -> str:
    """The message of each engine's refusal of a module with ``norm`` inside (the same for both)."""
    module = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Identity(), norm), nn.Linear(4, 2))
    messages = set()
    for engine in ENGINES:
        with pytest.raises(DpoptError) as error:
            TorchModel(module, cross_entropy, torch.randn(5, 3), torch.zeros(5, dtype=torch.long), engine=engine)
        messages.add(str(error.value))
    (message,) = messages
    return message


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.SyncBatchNorm(4)])
def test_batch_norm_is_refused_with_the_reason_and_the_fix(norm):
    message = refusal(norm)
    assert f"module='1.1' is {type(norm).__name__}" in message
    assert "one record's gradient depends on the other records" in message
    assert "no longer bounds its influence (the sensitivity)" in message
    assert "nn.GroupNorm" in message


@pytest.mark.parametrize("norm", [nn.InstanceNorm1d(4, track_running_stats=True),
                                  nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
                                  nn.LazyInstanceNorm3d(track_running_stats=True)])
def test_running_statistics_are_refused_with_the_reason_and_the_fix(norm):
    """Before, AClip's whole-batch forward left an un-noised running mean of the training inputs
    in the module's buffers, and the vmap engine failed with a raw RuntimeError."""
    message = refusal(norm)
    assert f"module='1.1' is {type(norm).__name__} with track_running_stats=True" in message
    assert "writes a running mean and variance of the training inputs into the module's buffers" in message
    assert "Use track_running_stats=False" in message and "nn.GroupNorm" in message


class RunningMean(nn.Module):
    """Keeps a running mean of its inputs in a buffer, as a layer with running statistics does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return x


class Calls(nn.Module):
    """Counts its calls in a buffer: nothing of the records' values, but the count follows the batches."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return x


class Constant(nn.Module):
    """Scales by a buffer it only reads (and holds one it never uses, with a NaN)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        self.register_buffer("unused", torch.tensor([1.0, math.nan]))

    def forward(self, x):
        return x * self.scale


def buffered(layer: type[nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), layer(8), nn.Tanh(), nn.Linear(8, 2))


def two_classes(n: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(n, 6, generator=gen)
    return X, (X[:, 0] > 0).long()


@pytest.mark.parametrize("layer", [RunningMean, Calls])
@pytest.mark.parametrize("algorithm", ["dp-sgd", "aclip", "dp-agd"])
@pytest.mark.parametrize("engine", ENGINES)
def test_training_leaves_no_buffer_changed(engine, algorithm, layer):
    """A forward that writes a buffer is refused at the first computation that runs it (under
    vmap: in-place writes into buffers fail there; else the buffers are compared with a copy
    taken before), and the buffers are as they were. Before, AClip and DP-AGD left the running
    mean of the training inputs in the module, and every engine the count of calls."""
    net = buffered(layer)
    before = {name: b.clone() for name, b in net.named_buffers()}
    private = dpopt.Private(net, cross_entropy, two_classes(), algorithm=algorithm, epsilon=1.0, delta=1e-5, steps=3,
                            batch_size=20, seed=0, engine=engine)
    with pytest.raises(DpoptError,
                       match=r"changed its buffer '1\.(mean|calls)'|no in-place writes to (buffers|tensors)"):
        for _ in private:
            private.step()
    assert before.keys() == dict(net.named_buffers()).keys()
    assert all(torch.equal(b, before[name]) for name, b in net.named_buffers())


@pytest.mark.parametrize("engine", ENGINES)
def test_every_computation_that_runs_the_module_refuses_a_buffer_change(engine):
    """Each leaves the count of calls at 0: the whole-batch ones by the comparison of the buffers,
    the per-record ones by it or by torch.func's refusal of an in-place write under grad."""
    o = TorchModel(buffered(Calls), cross_entropy, *two_classes(), engine=engine)
    theta, every = o.flat_params(), torch.arange(60)
    X, y = two_classes()
    whole_batch = {"loss": lambda: o.loss(theta), "gradient_sum": lambda: o.gradient_sum(theta, every),
                   "error": lambda: o.error(theta, X, y)}
    per_record = {"per_record": lambda: o.per_record(theta, every),
                  "per_record_loss": lambda: o.per_record_loss(theta[None], every),
                  "losses_at": lambda: o.losses_at(theta.expand(60, 2, -1), every),
                  "gradients_at": lambda: o.gradients_at(theta.expand(60, 2, -1), every)}
    for name, computation in {**whole_batch, **per_record}.items():
        with pytest.raises(DpoptError) as error:
            computation()
        message = str(error.value)
        refused = message.startswith("module='1' (Calls) changed its buffer '1.calls' in a forward pass on the "
                                     "training data") and "no ε accounts for. The buffers were restored" in message
        assert refused or (name in per_record and "no in-place writes to buffers" in message), name
        assert int(o.module[1].calls) == 0, name


def test_a_buffer_replaced_or_added_in_forward_is_put_back():
    class Replaces(Constant):
        def forward(self, x):
            self.scale = self.scale * 2
            self.register_buffer("seen", x.detach().clone())
            return x

    net = buffered(Replaces)
    scale = net[1].scale
    o = TorchModel(net, cross_entropy, *two_classes())
    with pytest.raises(DpoptError, match=r"changed its buffer '1\.scale'"):
        o.loss(o.flat_params())
    assert net[1].scale is scale and torch.equal(scale, torch.linspace(0.5, 1.5, 8))
    assert dict(net.named_buffers()).keys() == {"1.scale", "1.unused"}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_module_that_only_reads_its_buffers_trains(engine):
    """Buffers read in forward (a fixed scale; an unused one holding a NaN) are not a change."""
    o = TorchModel(buffered(Constant), cross_entropy, *two_classes(), engine=engine)
    theta, every = o.flat_params(), torch.arange(60)
    assert torch.isfinite(o.per_record(theta, every).norms()).all() and math.isfinite(float(o.loss(theta)))



@pytest.mark.parametrize(("kwargs", "match"), [
    ({"engine": "opacus"}, r"engine='opacus' must be one of: vmap, ghost"),
    ({"microbatch_size": 0}, r"microbatch_size=0 must be >= 1"),
    ({"microbatch_size": 2.5}, r"microbatch_size=2.5 must be an integer"),
    ({"y": torch.zeros(3, dtype=torch.long)}, r"X.shape=\(48, 1, 6, 6\) and y.shape=\(3,\) must hold the same number"),
    ({"X": torch.zeros(0, 1, 6, 6), "y": torch.zeros(0)}, r"must hold the same number n >= 1"),
    ({"module": "cnn"}, r"module=str must be a torch.nn.Module"),
    ({"module": nn.Sequential(nn.ReLU())}, r"module has no trainable parameters"),
])
def test_bad_arguments_are_named(kwargs, match):
    X, y = data()
    args = {"module": tiny_cnn(), "loss_fn": cross_entropy, "X": X, "y": y} | kwargs
    with pytest.raises(DpoptError, match=match):
        TorchModel(**args)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_loss_that_is_not_per_record_is_refused(engine):
    o = TorchModel(tiny_cnn(), lambda out, y: F.cross_entropy(out, y), *data(), engine=engine)
    match = r"loss_fn returned shape \(\) for .* one loss per record \(reduction='none'\)"
    with pytest.raises(DpoptError, match=match):
        o.per_record(o.flat_params(), torch.arange(4))


def test_theta_has_the_module_layout():
    o = oracle()
    params = [p for p in o.module.parameters()]
    assert o.n == N and o.dim == sum(p.numel() for p in params) == len(o.flat_params())
    assert torch.equal(o.flat_params(), torch.nn.utils.parameters_to_vector(params))
    with pytest.raises(DpoptError, match=rf"theta.shape=\(3,\) must be \({o.dim},\)"):
        o.loss(torch.zeros(3, dtype=F64))
    theta = torch.linspace(-1, 1, o.dim, dtype=F64)
    assert o.load(theta) is o.module
    assert torch.equal(o.flat_params(), theta)


def test_frozen_parameters_stay_out_of_theta():
    module = tiny_cnn()
    module[0].requires_grad_(False)
    o = TorchModel(module, cross_entropy, *data())
    assert o.dim == sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert o.layout.names[0] == "2.weight"


# ------------------------------------------------------------------ loss, gradient, error


@pytest.mark.parametrize("engine", ENGINES)
def test_loss_and_gradient_match_autograd_on_the_mean_loss(engine):
    o = oracle(engine, microbatch_size=10)  # 48 records in 5 chunks
    theta = o.flat_params() + 0.05 * torch.randn(o.dim, generator=torch.Generator().manual_seed(0), dtype=F64)
    module = module_at(o, theta)
    X, y = data()
    mean = cross_entropy(module(X), y).mean()
    grads = torch.autograd.grad(mean, list(module.parameters()))
    want = torch.cat([g.reshape(-1) for g in grads])
    assert torch.allclose(o.loss(theta), mean, rtol=1e-12)
    assert torch.allclose(o.gradient(theta), want, rtol=1e-10, atol=1e-14)
    subset = torch.tensor([5, 0, 17, 33])
    assert torch.allclose(o.loss(theta, subset), cross_entropy(module(X[subset]), y[subset]).mean(), rtol=1e-12)
    assert math.isnan(float(o.loss(theta, torch.zeros(0, dtype=torch.long))))
    # loss is differentiable in θ (the contract tests' SGD reference differentiates it)
    point = theta.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(o.loss(point), point)
    assert torch.allclose(g, want, rtol=1e-10, atol=1e-14)
    # the mean of the per-record gradients is the gradient
    rows = o.per_record(theta, torch.arange(N))
    assert torch.allclose(rows.weighted_sum(torch.full((N,), 1 / N, dtype=F64)), want, rtol=1e-10, atol=1e-14)


def test_float32_loss_and_gradient_of_a_cnn_run_in_channels_last_layout_match_the_module():
    """The ghost engine's loss and gradient take its forward (convolutions and max-pools in
    channels-last layout) for a Sequential it runs on the whole batch: the module's own loss and
    gradient within float32 rounding."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2), nn.Conv2d(16, 4, 3),
                           nn.Flatten(), nn.Linear(4, 3))
    X, y = data(torch.float32)
    o = TorchModel(module, cross_entropy, X, y)
    theta = o.flat_params()
    mean = cross_entropy(module(X), y).mean()
    want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(mean, list(module.parameters()))])
    torch.testing.assert_close(o.loss(theta), mean.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(o.gradient(theta), want, rtol=1e-5, atol=1e-7)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        return x + self.conv(x)


@pytest.mark.parametrize(("module", "engine_forward"), [
    (tiny_cnn(), True),  # every stage on the whole batch
    (nn.Sequential(Residual(), nn.Flatten(), nn.Linear(36, 3)).double(), False),  # a block, run per record
])
def test_loss_gradient_and_error_run_the_engines_forward_where_it_runs_the_whole_batch(monkeypatch, module,
                                                                                     engine_forward):
    from dpopt.oracles import ghost

    calls = []
    forward = ghost.forward
    monkeypatch.setattr(ghost, "forward", lambda *args, **kwargs: calls.append(kwargs) or forward(*args, **kwargs))
    o = TorchModel(module, cross_entropy, *data())
    o.gradient(o.flat_params())
    o.loss(o.flat_params())
    o.error(o.flat_params(), *data())
    assert calls == ([{"taps": False}] * 3 if engine_forward else [])


@pytest.mark.parametrize("engine", ENGINES)
def test_recent_per_record_results_are_reused_only_for_the_same_point_and_records(engine):
    o = oracle(engine, microbatch_size=20)
    theta = o.flat_params()
    later = theta + 0.01
    records = torch.tensor([3, 1, 4, 15, 9, 26, 5, 35, 8, 47, 7])
    first = o.per_record(theta, records)
    assert o.per_record(theta.clone(), records.clone()) is first  # equal values, not the same tensors
    assert o.per_record(later, records) is not first
    assert o.per_record(theta, records) is first  # the last two results are kept (a difference's two points)
    assert o.per_record(theta, records[:-1]) is not first
    o.per_record(later + 0.01, records)
    fresh = o.per_record(theta, records)  # pushed out by two other points: computed again, the same values
    assert fresh is not first and torch.equal(fresh.norms(), first.norms())


def test_a_difference_of_a_first_layer_on_the_same_records_is_one_layer_and_exact():
    """The first layer's input is the data, the same tensor at both points: its difference is the
    one layer (a, g − g′); it matches the per-record autograd loop at both points."""
    ghost, vmap = oracle("ghost"), oracle("vmap")
    theta = ghost.flat_params()
    other = theta + 1e-3 * torch.randn(ghost.dim, generator=torch.Generator().manual_seed(3), dtype=F64)
    records = torch.arange(0, N, 2)
    difference = ghost.per_record(theta, records) - ghost.per_record(other, records)
    first = difference.chunks[0][0]
    assert type(first).__name__ == "Layer" and type(difference.chunks[0][-1]).__name__ == "Stacked"
    want = vmap.per_record(theta, records).rows - vmap.per_record(other, records).rows
    assert torch.allclose(difference.norms(), want.norm(dim=1), rtol=1e-10)
    weights = torch.linspace(-1, 1, len(records), dtype=F64)
    assert torch.allclose(difference.weighted_sum(weights), weights @ want, rtol=1e-10, atol=1e-14)


def test_a_full_batch_input_that_comes_back_is_transposed_once_and_gives_the_same_sums():
    """A full-batch method asks for the same records every round: from the second call on, the
    first layer's input is kept transposed for the book-keeping product (built once, handed on);
    a call on other records builds nothing. The tall input (more records than the first weight
    has entries) also takes the contiguous-weight forward. Both agree with the vmap engine."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 3), nn.Softplus(), nn.Linear(3, 1)).to(F64)
    X = torch.randn(200, 5, generator=torch.Generator().manual_seed(4), dtype=F64)
    y = torch.randn(200, generator=torch.Generator().manual_seed(5), dtype=F64)
    squared = lambda out, target: (out.reshape(-1) - target) ** 2  # noqa: E731
    ghost, vmap = TorchModel(mlp, squared, X, y), TorchModel(copy.deepcopy(mlp), squared, X, y, engine="vmap")
    records, weights = torch.arange(200), torch.linspace(-1, 1, 200, dtype=F64)
    points = [ghost.flat_params() + 0.1 * k for k in range(3)]
    rows = [ghost.per_record(points[0], records)]
    assert "input_t" not in rows[0].chunks[0][0].__dict__
    for theta in points[1:]:
        rows.append(ghost.per_record(theta, records))
    transposed = rows[1].chunks[0][0].__dict__["input_t"]
    assert rows[2].chunks[0][0].__dict__["input_t"] is transposed and torch.equal(transposed, X.T)
    assert "input_t" not in ghost.per_record(points[0], records[1:]).chunks[0][0].__dict__
    difference = rows[2] - rows[1]
    assert difference.chunks[0][0].__dict__["input_t"] is transposed
    dense = [vmap.per_record(theta, records).rows for theta in points]
    assert torch.allclose(rows[2].norms(), dense[2].norm(dim=1), rtol=1e-10)
    assert torch.allclose(rows[2].weighted_sum(weights), weights @ dense[2], rtol=1e-10, atol=1e-14)
    assert torch.allclose(difference.weighted_sum(weights), weights @ (dense[2] - dense[1]), rtol=1e-10, atol=1e-14)


def test_per_record_loss_and_error():
    o = oracle()
    theta = o.flat_params()
    thetas = torch.stack([theta, theta + 0.1, theta - 0.2])
    indices = torch.tensor([3, 9, 40])
    X, y = data()
    got = o.per_record_loss(thetas, indices)
    assert got.shape == (3, 3)
    for k in range(3):
        assert torch.allclose(got[:, k], cross_entropy(module_at(o, thetas[k])(X[indices]), y[indices]), rtol=1e-12)
    assert float(o.regulariser(theta)) == 0.0
    predicted = module_at(o, theta)(X).argmax(1)
    assert o.error(theta, X, y) == pytest.approx(float((predicted != y).double().mean()))
    assert o.error(theta, X, predicted) == 0.0
    # one output per record: sign against labels in {0, 1} or {−1, +1}
    torch.manual_seed(0)
    binary = TorchModel(nn.Sequential(nn.Flatten(), nn.Linear(36, 1)).double(),
                        lambda out, t: F.binary_cross_entropy_with_logits(out[:, 0], t, reduction="none"),
                        X, (y > 0).double())
    b_theta = binary.flat_params()
    positive = (binary.module(X)[:, 0] > 0).double()
    assert binary.error(b_theta, X, positive) == 0.0
    assert binary.error(b_theta, X, 2 * positive - 1) == 0.0
    assert binary.error(b_theta, X, 1 - positive) == 1.0


@pytest.mark.parametrize("engine", ENGINES)
def test_results_come_back_in_thetas_dtype(engine):
    """A float32 module driven by a float64 θ (what dpopt.run passes): the work is float32, the
    results are float64, so STORM's float64 weights and θ updates just work."""
    o = oracle(engine, dtype=torch.float32)
    theta = o.flat_params().double()
    rows = o.per_record(theta, torch.arange(6))
    ones = torch.ones(6, dtype=F64)
    assert rows.norms().dtype == F64 and rows.weighted_sum(ones).dtype == F64
    assert (rows - o.per_record(theta + 1e-3, torch.arange(6))).weighted_sum(ones).dtype == F64
    assert o.gradient(theta).dtype == F64 and o.loss(theta).dtype == F64
    reference = oracle(engine).per_record(theta, torch.arange(6))
    assert torch.allclose(rows.norms(), reference.norms(), rtol=1e-4)


# -------------------------------------------------------------------- end-to-end with algorithms


def sgd_reference(o: TorchModel, lr: float, batch_size: int, steps: int, seed: int) -> torch.Tensor:
    """Plain minibatch SGD with autograd through the module on the batches dpopt.run draws:
    θ ← θ − η·Σ_{i∈B} ∇ℓ_i(θ)/b, b the sampler's expected batch size."""
    sample_gen, _, _ = train.randomness(seed)
    sampler = sampling.Poisson.of(o.n, batch_size)
    module = copy.deepcopy(o.module)
    params = list(module.parameters())
    X, y = o.X, o.y
    sizes = []
    for _ in range(steps):
        indices = sampler.sample(sample_gen)
        sizes.append(len(indices))
        if len(indices):
            grads = torch.autograd.grad(cross_entropy(module(X[indices]), y[indices]).sum(), params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g / sampler.expected_size
    assert 0 in sizes or min(sizes) < batch_size < max(sizes)  # variable Poisson batches
    return torch.nn.utils.parameters_to_vector(params).detach()


@pytest.mark.parametrize("engine", ENGINES)
def test_dpsgd_without_noise_or_clipping_is_sgd(engine):
    o = oracle(engine, microbatch_size=5)
    algo = dpopt.DPSGD(lr=0.5, clip=math.inf, noise_multiplier=0.0, batch_size=6)
    history = dpopt.run(algo, o, steps=12, seed=4, theta0=o.flat_params(), log_every=12)
    want = sgd_reference(o, 0.5, 6, 12, seed=4)
    assert torch.allclose(history.theta, want, rtol=0, atol=1e-10)
    assert float((want - o.flat_params()).norm()) > 0.1  # the run went somewhere
    assert math.isinf(history.final["epsilon"])


def test_dpsrm_without_noise_or_clipping_is_storm():
    o = oracle("ghost")
    theta0 = o.flat_params()
    srm = dpopt.DPSRM(lr=0.3, clip=math.inf, clip_diff=math.inf, gamma=0.4, noise_multiplier0=0.0,
                      noise_multiplier=0.0, batch_size0=12, batch_size=6)
    storm = dpopt.Storm(lr=0.3, momentum=0.4, step_rule="constant", batch_size0=12, batch_size=6)
    got = dpopt.run(srm, o, steps=10, seed=2, theta0=theta0, log_every=10).theta
    want = dpopt.run(storm, oracle("vmap"), steps=10, seed=2, theta0=theta0, log_every=10).theta
    assert torch.allclose(got, want, rtol=0, atol=1e-10)
    assert float((want - theta0).norm()) > 0.1


def test_clipped_dpsrm_runs_the_same_on_both_engines():
    """With clipping that bites (C1, C2 below the typical norms) and no noise, the ghost engine's
    norms of gradient differences and book-keeping sums give vmap's trajectory."""
    srm = dpopt.DPSRM(lr=0.3, clip=0.3, clip_diff=0.01, gamma=0.3, noise_multiplier0=0.0, noise_multiplier=0.0,
                      batch_size0=12, batch_size=6)
    thetas = {engine: dpopt.run(srm, oracle(engine), steps=10, seed=3, theta0=oracle().flat_params(),
                                log_every=10).theta for engine in ENGINES}
    assert torch.allclose(thetas["ghost"], thetas["vmap"], rtol=0, atol=1e-10)
    rows = oracle().per_record(thetas["ghost"], torch.arange(N))
    assert float(rows.norms().median()) > 0.3  # clipping was active


PRIVATE = {
    "dp-sgd": dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.1, batch_size=8),
    "dp-srm": dpopt.DPSRM(lr=0.1, clip=1.0, clip_diff=0.5, gamma=0.3, noise_multiplier0=2.0, noise_multiplier=1.1,
                          batch_size0=12, batch_size=8),
}


@pytest.mark.parametrize("name", PRIVATE)
def test_private_run_with_the_torch_oracle_records_its_plan(name):
    """Double entry with the torch oracle: the ledger of a run equals the algorithm's plan, event
    for event, and the run reports the plan's ε."""
    o, algo, steps = oracle("ghost"), PRIVATE[name], 5
    history = dpopt.run(algo, o, steps=steps, seed=0, theta0=o.flat_params(), log_every=steps)
    sample_gen, noise_gen, _ = train.randomness(0)
    state, ledger = algo.init(o.flat_params(), steps, sample_gen), Ledger(algo.relation())
    for t in range(steps):
        state, _ = train.step(algo, o, state, t, ledger, sample_gen, noise_gen)
    assert torch.equal(algo.output(state), history.theta)  # the replay is the run
    assert canonical(ledger.event()) == canonical(algo.planned_event(N, steps))
    want = dpopt.epsilon_of(algo.planned_event(N, steps), 1e-5, algo.relation())
    assert history.final["epsilon"] == pytest.approx(want, rel=1e-9)
    assert history.theta.isfinite().all()
