"""The ghost engine's fast paths give the results of the plain computations they replace.

* max-pooling of ≥ 16 channels in channels-last layout: the same output, argmax and gradient as
  ``F.max_pool2d`` (ties, NaN, padding, dilation, ceil mode), and hooks or few channels fall
  back to the module itself;
* ``unfold`` by ``index_select``: ``F.unfold``'s patches;
* per-record rows built once (direct form) and reused by the book-keeping sum, by the other
  terms of DP-SRM and by the difference of two points: the same sums as the weight-gradient
  products of a backward pass, records with weight 0 (NaN rows) left out exactly;
* a convolution with a single output position whose kernel does not cover its whole input (or
  with several groups): its rank-one norm is taken on the patch, per group;
* the MNIST CNN (pools on 16 and 32 channels) against a per-record autograd loop, in float64
  and float32, through ``train.step`` of DP-SGD and DP-SRM.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from dp_accounting import NeighboringRelation
from torch import nn

from dpopt.clipping import Dense, Term, clip_sum
from dpopt.models import make_model
from dpopt.oracles import ghost
from dpopt.oracles.torch_model import TorchModel
from test_ghost import loop_reference  # the per-record autograd reference of the engine tests

F64 = torch.float64
RELATION = NeighboringRelation.ADD_OR_REMOVE_ONE


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


def close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> bool:
    scale = float(want.abs().max()) if want.numel() else 0.0
    return got.shape == want.shape and torch.allclose(got.to(want.dtype), want, rtol=rtol, atol=rtol * scale)


# ------------------------------------------------------------------------------ max-pooling


POOLS = [dict(kernel_size=2, stride=1), dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
         dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)), dict(kernel_size=3, stride=2, ceil_mode=True)]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("kwargs", POOLS)
def test_channels_last_pool_equals_the_module(kwargs, dtype):
    gen = torch.Generator().manual_seed(0)
    # few distinct values (ties in most windows), saturated values, a NaN
    x = torch.randint(-2, 3, (3, 16, 9, 8), generator=gen).to(dtype)
    x[0, 3, 2, 2] = float("nan")
    x[1, 5] = 1.0
    pool = nn.MaxPool2d(**kwargs)
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    want, got = pool(a), ghost.run_plain(pool, b)
    assert got.is_contiguous() and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    weights = torch.randn(want.shape, generator=gen, dtype=dtype)
    (ga,), (gb,) = torch.autograd.grad(want, a, weights), torch.autograd.grad(got, b, weights)
    assert gb.is_contiguous() and torch.equal(ga, gb)


def test_pool_falls_back_to_the_module_when_it_must():
    x = torch.randn(2, 16, 6, 6)
    calls = []
    hooked = nn.MaxPool2d(2)
    hooked.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    assert torch.equal(ghost.run_plain(hooked, x), F.max_pool2d(x, 2)) and calls == [(2, 16, 3, 3)]
    few = torch.randn(2, 3, 6, 6)
    assert torch.equal(ghost.run_plain(nn.MaxPool2d(2), few), F.max_pool2d(few, 2))
    with_indices = nn.MaxPool2d(2, return_indices=True)
    out, indices = ghost.run_plain(with_indices, x)
    assert torch.equal(indices, F.max_pool2d(x, 2, return_indices=True)[1])


# ------------------------------------------------------------------------------------ unfold


@pytest.mark.parametrize("conv", [nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Conv2d(16, 32, 4, stride=2),
                                  nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2),
                                  nn.Conv2d(6, 6, (3, 2), stride=(2, 1), padding="valid", groups=3),
                                  nn.Conv2d(3, 5, (2, 3), padding=(1, 0))])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_unfold_equals_torch_unfold(conv, layout):
    x = torch.randn(5, conv.in_channels, 13, 11, generator=torch.Generator().manual_seed(0), dtype=F64)
    padding = ghost.geometry(conv).padding
    want = F.unfold(x, conv.kernel_size, conv.dilation, padding, conv.stride).transpose(1, 2)
    x = x.contiguous(memory_format=layout)
    assert torch.equal(ghost.unfold(x, ghost.geometry(conv)), want)
    assert ghost.unfold(x[:0], ghost.geometry(conv)).shape == (0, *want.shape[1:])


# --------------------------------------------------------------------- rows reused, T = 1 conv


def single_position_model() -> nn.Module:
    """Convolutions with one output position: a kernel that does not cover its input (stride 3
    on 5×5), and two groups; then a direct-form and a Gram-form convolution."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, stride=3), nn.Tanh(), nn.Conv2d(4, 6, 1, groups=2), nn.Flatten(),
                         nn.Unflatten(1, (6, 1, 1)), nn.Upsample(size=(6, 6)), nn.Conv2d(6, 4, 2, padding=1),
                         nn.Tanh(), nn.Conv2d(4, 24, 4, stride=3), nn.Flatten(), nn.Linear(24 * 2 * 2, 3))


def conv_zoo() -> nn.Module:
    """Convolutions of every kind the engine handles, for the channels-last float32 path: padding,
    stride, dilation, groups, one channel in, the direct and the Gram form (also for the
    difference: 2q > 3T), a max-pool on 16 channels, and a GroupNorm block in between."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2, stride=1),
                         nn.Conv2d(16, 8, 3, stride=2, dilation=2, groups=4), nn.GroupNorm(2, 8), nn.ReLU(),
                         nn.Conv2d(8, 32, 2), nn.Tanh(), nn.Conv2d(32, 16, 2, groups=2), nn.Flatten(),
                         nn.Linear(16, 3))


def oracles(build, n=12, shape=(2, 5, 5), dtype=F64):
    torch.manual_seed(0)
    module = build().to(dtype)
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(n, *shape, generator=gen, dtype=F64).to(dtype)
    y = torch.randint(0, 3, (n,), generator=gen)
    return {engine: TorchModel(module, cross_entropy, X, y, engine=engine) for engine in ("ghost", "vmap")}


def test_both_forms_and_single_positions_agree_with_the_loop():
    both = oracles(single_position_model)
    ghost_oracle = both["ghost"]
    theta = ghost_oracle.flat_params()
    theta2 = theta + 1e-3 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    idx = torch.arange(12)
    rows = ghost_oracle.per_record(theta, idx)
    forms = {(layer.shape()[1], ghost.use_gram(*layer.shape()[1:])) for layer in rows.chunks[0]
             if layer.stage.kind == "conv"}
    assert forms == {(1, True), (49, False), (4, True)}  # T = 1 (the rank-one rule), the direct form, the Gram form
    want = loop_reference(ghost_oracle, theta, idx)
    want_diff = want - loop_reference(ghost_oracle, theta2, idx)
    diffs = rows - ghost_oracle.per_record(theta2, idx)
    assert close(rows.norms(), want.norm(dim=1), 1e-9)
    assert close(diffs.norms(), want_diff.norm(dim=1), 1e-9)
    weights = torch.linspace(-1, 2, 12, dtype=F64)
    assert close(rows.weighted_sum(weights), weights @ want, 1e-9)
    assert close(diffs.weighted_sum(weights), weights @ want_diff, 1e-9)
    assert close(both["vmap"].per_record(theta, idx).norms(), want.norm(dim=1), 1e-9)


def test_rows_reused_by_the_sum_equal_the_backward_products():
    """The sum from rows built for the norms equals the sum from (a, w·g) on fresh rows, also
    with some records left out (weight 0)."""
    ghost_oracle = oracles(single_position_model)["ghost"]
    theta, idx = ghost_oracle.flat_params(), torch.arange(12)
    weights = torch.linspace(-1, 2, 12, dtype=F64)
    weights[[2, 7]] = 0.0
    used = ghost_oracle.per_record(theta, idx)
    used.norms()
    assert any("_direct" in layer.__dict__ for layer in used.chunks[0])  # the direct-form layers kept them
    fresh = oracles(single_position_model)["ghost"].per_record(theta, idx)  # another oracle: nothing reused
    assert not any("_direct" in layer.__dict__ for layer in fresh.chunks[0])
    assert close(used.weighted_sum(weights), fresh.weighted_sum(weights), 1e-12)


def test_a_nan_record_is_left_out_of_reused_rows():
    both = oracles(single_position_model)
    for oracle in both.values():
        oracle.X[4, 0, 0, 0] = float("nan")
    theta, idx = both["vmap"].flat_params(), torch.arange(12)
    want = loop_reference(both["vmap"], theta, idx)
    kept = torch.ones(12, dtype=torch.bool)
    kept[4] = False
    reference, _ = clip_sum([Term(1.0, Dense(want[kept]), 0.5)], RELATION)
    bounded, dropped = clip_sum([Term(1.0, both["ghost"].per_record(theta, idx), 0.5)], RELATION)
    assert dropped == 1 and bounded.value.isfinite().all()
    assert close(bounded.value, reference.value, 1e-9)


# ----------------------------------------------------------------------- the MNIST CNN itself


@pytest.mark.parametrize(("dtype", "rtol"), [(F64, 1e-9), (torch.float32, 1e-5)])
def test_mnist_cnn_agrees_with_the_loop(dtype, rtol):
    gen = torch.Generator().manual_seed(0)
    X, y = torch.rand(20, 784, generator=gen, dtype=F64).to(dtype), torch.randint(0, 10, (20,), generator=gen)
    module = make_model("mnist-cnn", seed=0).to(dtype)
    oracle = TorchModel(module, cross_entropy, X, y)
    theta = oracle.flat_params().double()
    theta2 = theta + 1e-2 * torch.randn(theta.shape, generator=gen, dtype=F64)
    idx = torch.arange(3, 20)
    reference = TorchModel(make_model("mnist-cnn", seed=0).double(), cross_entropy, X.double(), y)
    want = loop_reference(reference, theta, idx)
    want_diff = want - loop_reference(reference, theta2, idx)
    rows = oracle.per_record(theta, idx)
    diffs = rows - oracle.per_record(theta2, idx)
    assert close(rows.norms(), want.norm(dim=1), rtol)
    assert close(diffs.norms(), want_diff.norm(dim=1), rtol)
    clip, clip2 = float(want.norm(dim=1).median()), float(want_diff.norm(dim=1).median())
    srm = [Term(0.3, rows, clip), Term(0.7, diffs, clip2)]
    dense = [Term(0.3, Dense(want), clip), Term(0.7, Dense(want_diff), clip2)]
    assert close(clip_sum(srm, RELATION)[0].value, clip_sum(dense, RELATION)[0].value, rtol)


@pytest.mark.parametrize(("build", "shape"), [(conv_zoo, (1, 10, 10)), (single_position_model, (2, 5, 5))])
def test_float32_convolutions_agree_with_a_float64_loop(build, shape):
    """float32 runs the convolutions in channels-last layout: norms, differences and sums of
    every form against the float64 loop."""
    single = oracles(build, shape=shape, dtype=torch.float32)["ghost"]
    double = oracles(build, shape=shape)["ghost"]
    rows = single.per_record(single.flat_params(), torch.arange(12))
    conv = [layer for layer in rows.chunks[0] if getattr(layer, "a", None) is not None and layer.a.ndim == 4]
    assert any(ghost.hwc(layer.g) for layer in conv)
    theta = double.flat_params()
    theta2 = theta + 1e-2 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    idx = torch.arange(12)
    want = loop_reference(double, theta, idx)
    want_diff = want - loop_reference(double, theta2, idx)
    rows = single.per_record(theta.float(), idx)
    diffs = rows - single.per_record(theta2.float(), idx)
    weights = torch.linspace(-1, 2, 12)
    assert close(rows.norms(), want.norm(dim=1), 1e-5)
    assert close(diffs.norms(), want_diff.norm(dim=1), 1e-5)
    assert close(rows.weighted_sum(weights), weights.double() @ want, 1e-5)
    assert close(diffs.weighted_sum(weights), weights.double() @ want_diff, 1e-5)


def test_conv_zoo_in_float64_agrees_with_the_loop():
    ghost_oracle = oracles(conv_zoo, shape=(1, 10, 10))["ghost"]
    theta = ghost_oracle.flat_params()
    theta2 = theta + 1e-3 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    idx = torch.arange(12)
    rows = ghost_oracle.per_record(theta, idx)
    forms = {(layer.shape()[1], ghost.use_gram(*layer.shape()[1:]), layer.direct_difference())
             for layer in rows.chunks[0] if isinstance(layer, ghost.Layer) and layer.stage.kind == "conv"}
    assert forms == {(100, False, True), (9, False, True), (4, True, False), (1, True, False)}
    want = loop_reference(ghost_oracle, theta, idx)
    want_diff = want - loop_reference(ghost_oracle, theta2, idx)
    diffs = rows - ghost_oracle.per_record(theta2, idx)
    weights = torch.linspace(-1, 2, 12, dtype=F64)
    assert close(rows.norms(), want.norm(dim=1), 1e-9)
    assert close(diffs.norms(), want_diff.norm(dim=1), 1e-9)
    assert close(rows.weighted_sum(weights), weights @ want, 1e-9)
    assert close(diffs.weighted_sum(weights), weights @ want_diff, 1e-9)


def test_an_embedding_bound_is_above_its_norm_and_close_with_repeated_indices():
    """A record's Embedding gradient has one row per distinct index, the sum of its positions' g_t
    (summed in float64 for the bound): the bound is at least the norm of the exact rows and within
    1e−5 of it in float32, for records of one repeated index and with padding positions too."""
    gen = torch.Generator().manual_seed(0)
    embedding = nn.Embedding(7, 5, padding_idx=0)
    idx = torch.randint(0, 7, (6, 9), generator=gen)
    idx[0], idx[1, :4] = 3, 0
    g = torch.randn(6, 9, 5, generator=gen)
    layer = ghost.layer_from(ghost.Stage("embedding", embedding, "e", (("weight", "w"),)), idx, g)
    exact = torch.zeros(6, 7, 5, dtype=torch.float64)
    for record in range(6):
        exact[record].index_add_(0, idx[record], g[record].double())
    exact[:, 0] = 0  # the padding row gets no gradient
    want = exact.flatten(1).norm(dim=1)
    bound = layer.sq_bounds().sqrt()
    assert (bound >= want).all() and (bound <= want * (1 + 1e-5)).all()
