"""Engine agreement: the ghost engine and the vmap engine against a per-record autograd loop.

Over layer types and shapes (MLP, convolutions of several kernels/strides/paddings/groups, a
Linear on sequences [B, T, p] in both the Gram and the direct form, GroupNorm/LayerNorm and a
custom module on the vmap fallback, frozen parameters, nested Sequentials) and batch sizes
0, 1, 7, 33: per-record norms, clipped sums (``clip_sum``), and the DP-SRM combination of a
clipped gradient and a clipped gradient difference at two parameter points.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from dp_accounting import NeighboringRelation
from torch import nn

from dpopt._validate import DpoptError
from dpopt.clipping import Dense, Term, clip_sum
from dpopt.oracles import ghost
from dpopt.oracles.torch_model import TorchModel

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap of weight_norm

RELATION = NeighboringRelation.ADD_OR_REMOVE_ONE
F64 = torch.float64


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


def squared(out, y):
    return (out.reshape(len(y), -1).sum(1) - y).square()


def sequence_loss(out, y):
    """out [B, T, q]: a per-record loss mixing all positions."""
    return F.cross_entropy(out.mean(1), y, reduction="none") + out.square().mean((1, 2))


class Custom(nn.Module):
    """A module with its own forward: the ghost engine runs it as one vmap block, its Linear tapped."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.scale = nn.Linear(6, 4), nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 1.5]))

    def forward(self, x):
        return torch.tanh(self.inner(x)) * self.scale


class Twice(nn.Module):
    """Reuses one submodule (one owner of its parameters, used twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


class TiedInside(nn.Module):
    """Two submodules holding one weight (two owners)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def parametrized() -> nn.Module:
    """Weight normalisation by a parametrization: the Linear holds ``original0/1``, not ``weight``."""
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    torch.nn.utils.parametrizations.weight_norm(model[0])
    return model


def frozen_bias() -> nn.Module:
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    model[0].bias.requires_grad_(False)
    return model


def frozen_layer() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    model[0].requires_grad_(False)
    return model


#: name → (model builder, input shape of one record, loss, target kind: classes or "real")
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Callable, int | str]] = {
    "mlp-relu": (lambda: nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), (5,), cross_entropy, 3),
    "mlp-tanh": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6, bias=False), nn.Tanh(),
                                       nn.Linear(6, 1)), (4,), squared, "real"),
    "cnn-pad-stride": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                             nn.Conv2d(4, 5, (3, 2), stride=2), nn.Flatten(), nn.Linear(5 * 3 * 3, 3)),
                       (2, 8, 7), cross_entropy, 3),
    "cnn-pool-nobias": (lambda: nn.Sequential(nn.Conv2d(3, 6, 5, stride=2, padding=2, bias=False), nn.Tanh(),
                                              nn.MaxPool2d(2), nn.Conv2d(6, 4, 1), nn.Flatten(),
                                              nn.Linear(4 * 2 * 2, 2)),
                        (3, 9, 9), cross_entropy, 2),
    "cnn-groups-dilation": (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2), nn.ReLU(),
                                                  nn.Conv2d(6, 6, 2, stride=(2, 1), padding="valid", groups=3),
                                                  nn.Flatten(), nn.Linear(6 * 2 * 4, 3)), (4, 5, 5), cross_entropy, 3),
    # Few positions, many channels: the Gram form (2T² < p·q) for the convolutions.
    "cnn-gram": (lambda: nn.Sequential(nn.Conv2d(8, 12, 3, padding=1), nn.Tanh(), nn.Conv2d(12, 6, 2),
                                       nn.Flatten(), nn.Linear(6 * 2 * 2, 3)), (8, 3, 3), cross_entropy, 3),
    "groupnorm": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(),
                                        nn.Linear(4 * 3 * 3, 5), nn.LayerNorm(5), nn.Linear(5, 3)),
                  (2, 5, 5), cross_entropy, 3),
    # Convolutions without a ghost rule here ("same" padding, reflect padding): vmap blocks.
    "cnn-fallback": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding="same"), nn.ReLU(),
                                           nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"), nn.Flatten(),
                                           nn.Linear(3 * 4 * 4, 3)), (2, 4, 4), cross_entropy, 3),
    "seq-gram": (lambda: nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4)), (3, 6), sequence_loss, 4),
    "seq-direct": (lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), (7, 3), sequence_loss, 2),
    "nested-custom": (lambda: nn.Sequential(nn.Sequential(nn.Linear(5, 6), nn.ReLU()), Custom(),
                                            nn.Sequential(nn.Linear(4, 3))), (5,), cross_entropy, 3),
    "custom-shared": (lambda: nn.Sequential(nn.Linear(5, 4), Twice(), TiedInside(), nn.Linear(4, 3)),
                      (5,), cross_entropy, 3),
    "parametrized": (parametrized, (5,), cross_entropy, 3),
    "frozen-bias": (frozen_bias, (5,), cross_entropy, 3),
    "frozen-layer": (frozen_layer, (2, 6, 6), cross_entropy, 3),
}


def make(name: str, n: int = 40, dtype: torch.dtype = F64, seed: int = 0, device: str = "cpu",
         **kwargs) -> dict[str, TorchModel]:
    """The same model and data under both engines (the module on ``device``, the data on the CPU)."""
    build, shape, loss, target = MODELS[name]
    torch.manual_seed(seed)
    module = build().to(device, dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(n, *shape, generator=gen, dtype=F64).to(dtype)
    y = (torch.randn(n, generator=gen, dtype=F64).to(dtype) if target == "real"
         else torch.randint(0, target, (n,), generator=gen))
    return {engine: TorchModel(module, loss, X, y, engine=engine, **kwargs) for engine in ("vmap", "ghost")}


def loop_reference(oracle: TorchModel, theta: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``[B, d]``: each record's gradient by autograd on that record alone, through a copy of the
    module whose trainable parameters are set from θ (in ``named_parameters`` order)."""
    module = copy.deepcopy(oracle.module)
    params = [p for p in module.parameters() if p.requires_grad]
    torch.nn.utils.vector_to_parameters(theta.to(params[0].dtype), params)
    rows = []
    for i in indices.tolist():
        x, y = oracle.X[i:i + 1].to(params[0].device), oracle.y[i:i + 1].to(params[0].device)
        x = x.to(params[0].dtype) if x.is_floating_point() else x  # token indices stay integers
        grads = torch.autograd.grad(oracle.loss_fn(module(x), y).sum(), params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows) if rows else theta.new_zeros(0, len(theta))


def theta_pair(oracle: TorchModel, step: float = 1e-3, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """θ = the module's parameters, θ′ = θ + a small step (like consecutive DP-SRM iterates)."""
    theta = oracle.flat_params()
    gen = torch.Generator().manual_seed(seed)
    return theta, theta + step * torch.randn(theta.shape, generator=gen, dtype=theta.dtype).to(theta.device)


def clipped(terms: list[Term]) -> torch.Tensor:
    return clip_sum(terms, RELATION)[0].value


def assert_close(got, want, rtol=1e-9):
    scale = want.abs().max() if want.numel() else 0.0
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=rtol, atol=rtol * float(scale) + 1e-300), (got, want)


# ---------------------------------------------------------------------------- agreement


CASES = [(name, 7) for name in MODELS] + [("mlp-relu", 1), ("cnn-pad-stride", 1), ("seq-gram", 1),
                                           ("groupnorm", 33), ("cnn-groups-dilation", 33), ("seq-direct", 33)]


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_engines_agree_with_the_loop(name, batch, device):
    if device == "mps":
        pytest.skip("the agreement is checked in float64, which MPS lacks (float32 there: test_ghost_anywhere)")
    oracles = make(name, device=device)
    theta, theta2 = theta_pair(oracles["vmap"])
    indices = torch.randperm(40, generator=torch.Generator().manual_seed(batch))[:batch]
    want = loop_reference(oracles["vmap"], theta, indices)
    want_diff = want - loop_reference(oracles["vmap"], theta2, indices)
    norms, diff_norms = want.norm(dim=1), want_diff.norm(dim=1)
    clip, clip2 = float(norms.median()), float(diff_norms.median())  # some records clipped, some not
    assert float(diff_norms.min()) > 0
    own = [(name, p, p.detach().clone()) for name, p in oracles["vmap"].module.named_parameters()]
    for engine, oracle in oracles.items():
        rows = oracle.per_record(theta, indices)
        diffs = rows - oracle.per_record(theta2, indices)
        assert isinstance(rows, Dense if engine == "vmap" else ghost.GhostRows)
        assert_close(rows.norms(), norms)
        assert_close(diffs.norms(), diff_norms)
        assert_close(clipped([Term(1.0, rows, clip)]), clipped([Term(1.0, Dense(want), clip)]))
        srm = [Term(0.3, rows, clip), Term(0.7, diffs, clip2)]
        assert_close(clipped(srm), clipped([Term(0.3, Dense(want), clip), Term(0.7, Dense(want_diff), clip2)]))
        weights = torch.linspace(-1, 2, batch, dtype=F64, device=device)
        assert_close(rows.weighted_sum(weights), weights @ want)
        assert_close(diffs.weighted_sum(weights), weights @ want_diff)
    # the module is untouched: the same Parameter objects, the same values
    for (name, p, value), (name2, p2) in zip(own, oracles["vmap"].module.named_parameters()):
        assert name == name2 and p is p2 and isinstance(p2, nn.Parameter) and torch.equal(p2, value)


def test_rules_say_which_layers_use_ghost_norms():
    assert make("groupnorm")["ghost"].rules() == [
        ("0", "ghost"), ("1", "ghost"), ("4", "ghost"), ("5", "ghost"), ("6", "ghost")]
    assert make("nested-custom")["ghost"].rules() == [("0.0", "ghost"), ("1", "vmap"), ("1.inner", "ghost"),
                                                      ("2.0", "ghost")]
    assert make("frozen-layer")["ghost"].rules() == [("3", "ghost")]
    assert make("cnn-fallback")["ghost"].rules() == [("0", "vmap"), ("2", "vmap"), ("4", "ghost")]
    assert make("parametrized")["ghost"].rules() == [("0", "vmap"), ("2", "ghost")]


def test_the_shapes_exercise_both_forms():
    """The table covers the Gram form and the direct form for Linear (T > 1) and Conv2d."""
    seen = set()
    for name in ("seq-gram", "seq-direct", "cnn-gram", "cnn-pad-stride"):
        oracle = make(name)["ghost"]
        rows = oracle.per_record(oracle.flat_params(), torch.arange(3))
        for layer in rows.chunks[0]:
            groups, T, p, q = layer.shape()
            if T > 1:
                seen.add((layer.stage.kind, ghost.use_gram(T, p, q)))
    assert seen == {("linear", True), ("linear", False), ("conv", True), ("conv", False)}


@pytest.mark.parametrize("name", ["mlp-relu", "cnn-groups-dilation", "groupnorm"])
def test_empty_batch(name):
    for oracle in make(name).values():
        theta = oracle.flat_params()
        empty = torch.zeros(0, dtype=torch.long)
        rows = oracle.per_record(theta, empty)
        diffs = rows - oracle.per_record(theta + 0.1, empty)
        for per_record in (rows, diffs):
            assert per_record.norms().shape == (0,)
            assert torch.equal(per_record.weighted_sum(torch.zeros(0, dtype=F64)), torch.zeros(oracle.dim, dtype=F64))
        assert torch.equal(clipped([Term(1.0, rows, 1.0)]), torch.zeros(oracle.dim, dtype=F64))


@pytest.mark.parametrize("name", ["cnn-pool-nobias", "groupnorm", "seq-gram"])
def test_chunking_does_not_change_results(name):
    small, large = make(name, microbatch_size=4), make(name, microbatch_size=64)
    theta, theta2 = theta_pair(small["vmap"])
    indices = torch.arange(33)
    weights = torch.rand(33, generator=torch.Generator().manual_seed(0), dtype=F64)
    for engine in ("vmap", "ghost"):
        a, b = small[engine], large[engine]
        rows_a, rows_b = a.per_record(theta, indices), b.per_record(theta, indices)
        if engine == "ghost":
            assert len(rows_a.chunks) == 9 and len(rows_b.chunks) == 1
        diff_a, diff_b = rows_a - a.per_record(theta2, indices), rows_b - b.per_record(theta2, indices)
        assert_close(rows_a.norms(), rows_b.norms(), 1e-12)
        assert_close(diff_a.norms(), diff_b.norms(), 1e-12)
        assert_close(rows_a.weighted_sum(weights), rows_b.weighted_sum(weights), 1e-12)
        assert_close(diff_a.weighted_sum(weights), diff_b.weighted_sum(weights), 1e-12)


def test_a_record_with_nan_gradient_is_dropped_exactly():
    """A record whose input is ∞ has a NaN gradient: clip_sum gives it weight 0, and the ghost
    sum leaves it out exactly instead of multiplying NaN by 0."""
    oracles = make("cnn-pad-stride")
    for oracle in oracles.values():
        oracle.X[3, 0, 0, 0] = math.inf
    theta, indices = oracles["vmap"].flat_params(), torch.arange(8)
    want = loop_reference(oracles["vmap"], theta, indices)
    assert not want[3].isfinite().all() and want[[0, 1, 2, 4, 5, 6, 7]].isfinite().all()
    kept = torch.tensor([True, True, True, False, True, True, True, True])
    for oracle in oracles.values():
        bounded, dropped = clip_sum([Term(1.0, oracle.per_record(theta, indices), 0.5)], RELATION)
        reference, _ = clip_sum([Term(1.0, Dense(want[kept]), 0.5)], RELATION)
        assert dropped == 1
        assert_close(bounded.value, reference.value)


def reused_module() -> nn.Module:
    shared = nn.Linear(4, 4)
    return nn.Sequential(shared, nn.Tanh(), shared)


def tied_weight() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Tanh(), nn.Linear(4, 4))
    model[2].weight = model[0].weight
    return model


@pytest.mark.parametrize(("build", "shared"), [(reused_module, r"0\.bias, 0\.weight"), (tied_weight, r"0\.weight")])
def test_shared_parameters_are_refused_by_ghost_and_handled_by_vmap(build, shared):
    torch.manual_seed(0)
    module = build().double()
    X, y = torch.randn(5, 4, dtype=F64), torch.randint(0, 4, (5,))
    with pytest.raises(DpoptError, match=shared + r" is used by several.*engine='vmap'"):
        TorchModel(module, cross_entropy, X, y, engine="ghost")
    oracle = TorchModel(module, cross_entropy, X, y, engine="vmap")
    before = [p for p in module.parameters()]
    theta = oracle.flat_params() + 0.1
    indices = torch.arange(5)
    want = loop_reference(oracle, theta, indices)
    assert_close(oracle.per_record(theta, indices).norms(), want.norm(dim=1))
    assert_close(oracle.gradient(theta), want.mean(0))
    # functional calls leave the module's own parameters in place
    assert all(a is b for a, b in zip(module.parameters(), before))
    assert all(isinstance(p, nn.Parameter) for p in module.parameters())


# ------------------------------------------------------------------------ the Linear rule


def test_gram_and_direct_forms_agree():
    gen = torch.Generator().manual_seed(0)
    for T, p, q in [(1, 3, 4), (1, 10, 1), (2, 5, 3), (6, 2, 7), (9, 8, 8)]:
        A, G = torch.randn(11, T, p, generator=gen, dtype=F64), torch.randn(11, T, q, generator=gen, dtype=F64)
        direct = torch.einsum("btq,btp->bqp", G, A).square().sum((1, 2))
        gram, bound = ghost.gram_sq_norms([(A, G)])
        assert_close(gram, direct, 1e-12)
        assert_close(bound, (A.norm(dim=2) * G.norm(dim=2)).sum(1).square(), 1e-12)
        assert (bound * (1 + 1e-12) >= gram).all()
        A2, G2 = torch.randn(A.shape, generator=gen, dtype=F64), torch.randn(G.shape, generator=gen, dtype=F64)
        difference = torch.einsum("btq,btp->bqp", G, A) - torch.einsum("btq,btp->bqp", G2, A2)
        assert_close(ghost.gram_sq_norms([(A, G - G2), (A - A2, G2)])[0], difference.square().sum((1, 2)), 1e-12)


def test_the_difference_rule_is_exact_where_the_naive_one_cancels():
    """‖A − A′‖ from the stacked form stays accurate in float32 when A′ ≈ A, where
    ‖A‖² + ‖A′‖² − 2⟨A, A′⟩ loses every digit."""
    gen = torch.Generator().manual_seed(1)
    a, g = torch.randn(64, 1, 30, generator=gen), torch.randn(64, 1, 20, generator=gen)
    a2, g2 = a + 1e-4 * torch.randn(a.shape, generator=gen), g + 1e-4 * torch.randn(g.shape, generator=gen)
    outer = lambda a, g: torch.einsum("btq,btp->bqp", g.double(), a.double())  # noqa: E731
    want = (outer(a, g) - outer(a2, g2)).square().sum((1, 2))
    stacked, _ = ghost.gram_sq_norms([(a, g - g2), (a - a2, g2)])
    naive = (ghost.gram_sq_norms([(a, g)])[0] + ghost.gram_sq_norms([(a2, g2)])[0]
             - 2 * ((a * a2).sum((1, 2)) * (g * g2).sum((1, 2))))
    assert torch.allclose(stacked.double().sqrt(), want.sqrt(), rtol=1e-4)
    assert not torch.allclose(naive.double().clamp(min=0).sqrt(), want.sqrt(), rtol=1e-1)


def test_where_the_gram_terms_cancel_the_norm_keeps_its_digits():
    """Positions whose terms g_t a_tᵀ nearly cancel (a_2 ≈ a_1, g_2 = −g_1): a float32 Gram form
    would be rounding noise; the Gram matrices are formed in float64, so the norm keeps its
    digits, and the layer's bound (which adds the float32 sum's own rounding, γ_5·Σ_t ‖a_t‖‖g_t‖,
    here 6e−4 of the cancelled norm) stays above it and close."""
    torch.manual_seed(0)
    layer = nn.Linear(40, 40)
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(5, 1, 40, generator=gen).repeat(1, 2, 1)
    a[:, 1] += 1e-3 * torch.randn(5, 40, generator=gen)
    g = torch.randn(5, 1, 40, generator=gen).repeat(1, 2, 1)
    g[:, 1] *= -1
    want = torch.einsum("btq,btp->bqp", g.double(), a.double()).square().sum((1, 2)).sqrt()
    assert ghost.use_gram(2, 40, 40)
    sq, _ = ghost.gram_sq_norms([(a, g)])
    assert sq.dtype == F64 and torch.allclose(sq.sqrt(), want, rtol=1e-9)
    stage = ghost.Stage("linear", layer, "0", (("weight", "w"),))
    bounds = ghost.Layer(stage, a, g).sq_bounds().sqrt()
    assert (bounds >= want).all() and (bounds <= want * (1 + 1e-3)).all()


# --------------------------------------------------------------------------------- float32


def test_float32_engines_agree_with_a_float64_loop():
    oracles = make("groupnorm", dtype=torch.float32)
    theta, theta2 = theta_pair(oracles["vmap"], step=1e-2)
    indices = torch.arange(9)
    double = make("groupnorm")["vmap"]  # same seed: the same module in float64
    want = loop_reference(double, theta.double(), indices)
    want_diff = want - loop_reference(double, theta2.double(), indices)
    weights = torch.rand(9, generator=torch.Generator().manual_seed(0))
    for oracle in oracles.values():
        rows = oracle.per_record(theta, indices)
        diffs = rows - oracle.per_record(theta2, indices)
        # both engines measure float32 gradients in float64 (clipping.Dense; ghost norms are float64 bounds)
        assert rows.norms().dtype == torch.float64
        assert_close(rows.norms().double(), want.norm(dim=1), 1e-4)
        assert_close(diffs.norms().double(), want_diff.norm(dim=1), 1e-4)
        assert_close(rows.weighted_sum(weights).double(), weights.double() @ want, 1e-4)
        assert_close(diffs.weighted_sum(weights).double(), weights.double() @ want_diff, 1e-4)


# ------------------------------------------------------------------------ stochastic layers


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_dropout_norms_and_sums_come_from_the_same_forward(engine):
    """With dropout active, each record's summed contribution has exactly the norm its clipping
    weight was computed from, so the bound C holds (ghost: one forward feeds both)."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 16), nn.GroupNorm(4, 16),
                           nn.Dropout(0.3), nn.Linear(16, 3)).double().train()
    X, y = torch.randn(12, 5, dtype=F64), torch.randint(0, 3, (12,))
    oracle = TorchModel(module, cross_entropy, X, y, engine=engine)
    rows = oracle.per_record(oracle.flat_params(), torch.arange(12))
    norms = rows.norms()
    for i in range(12):
        alone = rows.weighted_sum(torch.eye(12, dtype=F64)[i])
        assert torch.allclose(alone.norm(), norms[i], rtol=1e-12)
    clip = float(norms.median())
    total = clipped([Term(1.0, rows, clip)])
    weights = (clip / norms).clamp(max=1.0)
    assert torch.allclose(total, sum(rows.weighted_sum(torch.eye(12, dtype=F64)[i] * weights[i]) for i in range(12)))


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_per_record_works_under_no_grad(engine):
    oracle = make("groupnorm")[engine]
    theta = oracle.flat_params()
    want = loop_reference(oracle, theta, torch.arange(4))
    with torch.no_grad():
        rows = oracle.per_record(theta, torch.arange(4))
        gradient = oracle.gradient(theta)
    assert_close(rows.norms(), want.norm(dim=1))
    assert gradient.norm() > 0
