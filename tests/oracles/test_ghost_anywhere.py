"""The ghost engine on models with their own forward: layers found at any depth.

* A GPT-style model (token and position Embeddings, LayerNorm, Linear on ``[B, T, p]`` inside
  custom blocks, ``scaled_dot_product_attention``, a GELU MLP, Conv1d, GroupNorm) gets ghost
  rules for every layer, and its norms, clipped sums and DP-SRM differences equal the vmap
  engine's and the per-record loop's, on every device present.
* Records are kept apart in a custom forward that mixes them: the block runs under vmap, so
  removing one record moves the clipped sum by at most the clip; the mutant that runs the same
  block on the whole batch with the same hooks moves it by several times the clip.
* float32: no record's contribution exceeds the clip.
* A layer called several times is one layer; a layer whose parameters are used outside its
  call joins the block's vmap; the module keeps no hook.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpopt._validate import DpoptError
from dpopt.oracles.ghost import blocks
from dpopt.oracles.torch_model import TorchModel
from test_ghost import loop_reference  # the per-record autograd reference of the engine tests
from test_ghost_guarantees import contributions, neighbour_distance

F64 = torch.float64
D, HEADS, T, VOCAB = 8, 2, 5, 7


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.ModuleList([nn.Linear(D, D) for _ in range(3)])
        self.proj = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (layer(self.ln1(x)).view(b, t, HEADS, d // HEADS).transpose(1, 2) for layer in self.qkv)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, D, padding_idx=0), nn.Embedding(T, D)
        self.blocks = nn.ModuleList([Attention(), Attention()])
        self.conv, self.norm = nn.Conv1d(D, D, 3, padding=1), nn.GroupNorm(2, D)
        self.head = nn.Linear(D, 3)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.norm(self.conv(x.transpose(1, 2)))
        return self.head(x.mean(2))


def gpt(engine: str, device: str, dtype: torch.dtype = F64, n: int = 12) -> TorchModel:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    X, y = torch.randint(0, VOCAB, (n, T), generator=gen), torch.randint(0, 3, (n,), generator=gen)
    X[0, :2] = 0  # the padding token, whose row gets no gradient
    X[1] = 3      # one token repeated: its row gathers the record's every position
    return TorchModel(GPT().to(device, dtype), cross_entropy, X, y, engine=engine)


def test_every_layer_of_a_custom_forward_gets_a_ghost_rule():
    rules = dict(gpt("ghost", "cpu").rules())
    assert rules.pop("<model>") == "vmap"  # the glue of the model's forward: each record alone
    assert set(rules.values()) == {"ghost"}
    assert {"tokens", "positions", "blocks.0.ln1", "blocks.1.qkv.2", "blocks.1.mlp.2", "conv", "norm",
            "head"} <= set(rules)


def test_a_custom_forward_gives_the_per_record_gradients(device):
    """Norms, clipped sums and the difference at two points (DP-SRM) equal the vmap engine's and
    the per-record autograd loop's to 1e−9 (float64; float32 on mps)."""
    dtype = torch.float32 if device == "mps" else F64
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    oracles = {engine: gpt(engine, device, dtype) for engine in ("ghost", "vmap")}
    theta = oracles["ghost"].flat_params()
    theta2 = theta + 0.05 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(2)).to(theta)
    indices = torch.arange(12)
    want = loop_reference(oracles["vmap"], theta, indices)
    weights = torch.linspace(-1, 2, 12, dtype=dtype, device=device)
    for engine, oracle in oracles.items():
        rows = oracle.per_record(theta, indices)
        assert rows.norms().device.type == device
        torch.testing.assert_close(rows.norms(), want.norm(dim=1).to(rows.norms()), rtol=tol, atol=0)
        torch.testing.assert_close(rows.weighted_sum(weights), weights @ want.to(weights), rtol=tol, atol=tol)
        diff = rows - oracle.per_record(theta2, indices)
        want_diff = want - loop_reference(oracle, theta2, indices)
        torch.testing.assert_close(diff.norms(), want_diff.norm(dim=1).to(diff.norms()), rtol=tol, atol=0)
        torch.testing.assert_close(diff.weighted_sum(weights), weights @ want_diff.to(weights), rtol=tol, atol=tol)


def test_no_float32_contribution_exceeds_the_clip():
    """At one point and for the difference of two close points (DP-SRM), every record clipped."""
    oracle = gpt("ghost", "cpu", torch.float32)
    theta, indices = oracle.flat_params().double(), torch.arange(12)
    theta2 = theta + 1e-4 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    rows = oracle.per_record(theta, indices)
    for per_record in (rows, rows - oracle.per_record(theta2, indices)):
        clip = 0.5 * float(per_record.norms().min())
        assert (contributions(per_record, clip) <= clip).all()


def test_the_module_keeps_no_hook_and_its_parameters():
    oracle = gpt("ghost", "cpu")
    before = {name: p.clone() for name, p in oracle.module.named_parameters()}
    oracle.per_record(oracle.flat_params() + 0.1, torch.arange(12)).norms()
    for m in oracle.module.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks)
    for name, p in oracle.module.named_parameters():
        assert torch.equal(p, before[name]) and isinstance(p, nn.Parameter)


# ------------------------------------------------------------------- records are kept apart


class Centring(nn.Module):
    """A model whose own forward subtracts the batch mean between two Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.first(x)
        return self.second(torch.tanh(h - h.mean(0, keepdim=True)))


def centring(**kwargs) -> TorchModel:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    X, y = torch.randn(20, 5, generator=gen, dtype=F64), torch.randint(0, 3, (20,), generator=gen)
    X[0] *= 300  # an outlier: the record that moves the batch mean most
    return TorchModel(Centring().double(), cross_entropy, X, y, **kwargs)


def whole_batch(stage, params, x, shared=None, tap=None):
    """The mutant of ``ghost.blocks.per_record``: the block called on the whole batch, with the same
    hooks (what an engine that trusts a custom forward does)."""
    every = {**(shared or {}), **{name: p[0] for name, p in params.items()}}
    if tap is None:
        return functional_call(stage.module, every, (x,)), ()
    with tap.recording(tuple(p.reshape(p.shape[0], *p.shape[2:]) for p in tap.probes)):
        return functional_call(stage.module, every, (x,)), tuple(tap.inputs)


def test_a_custom_forward_that_mixes_records_cannot_move_other_records():
    """Its layers are ghost layers, its glue runs per record: removing a record moves the clipped
    sum by at most the clip (add/remove-one sensitivity)."""
    oracle = centring()
    assert oracle.rules() == [("<model>", "vmap"), ("first", "ghost"), ("second", "ghost")]
    distance, sensitivity = neighbour_distance(oracle, clip=0.02)
    assert sensitivity == 0.02 and distance <= sensitivity * (1 + 1e-9)


def test_the_measurement_catches_a_block_run_on_the_whole_batch(monkeypatch):
    """The mutant: the same hooks with the model called on the whole batch, so one record moves
    every other record's gradient; the neighbour distance is then several times the clip."""
    monkeypatch.setattr(blocks, "per_record", whole_batch)
    distance, sensitivity = neighbour_distance(centring(), clip=0.02)
    assert distance > 3 * sensitivity


# ------------------------------------------------------------------- what cannot be tapped


class Reuses(nn.Module):
    """Calls one Linear, one LayerNorm, one Embedding and one Conv1d twice each."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.lin, self.norm = nn.Embedding(5, 4), nn.Linear(4, 4), nn.LayerNorm(4)
        self.conv = nn.Conv1d(4, 4, 2)

    def forward(self, idx):
        x = self.embed(idx) + self.embed(idx.flip(1))
        h = self.norm(torch.tanh(self.lin(self.norm(torch.tanh(self.lin(x))))))
        return self.conv(torch.tanh(self.conv(h.transpose(1, 2)))).mean(2)


class ReadsWeight(nn.Module):
    """Uses a Linear's weight without calling the Linear: its rule would miss that use."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + F.linear(x, self.lin.weight)


def test_a_layer_called_twice_is_one_layer_summed_over_its_calls():
    torch.manual_seed(0)
    X, y = torch.randint(0, 5, (6, 4)), torch.randint(0, 4, (6,))
    oracle = TorchModel(Reuses().double(), cross_entropy, X, y)
    assert {rule for _, rule in oracle.rules()} == {"ghost", "vmap"} and len(oracle.rules()) == 5
    theta, indices = oracle.flat_params(), torch.arange(6)
    rows, want = oracle.per_record(theta, indices), loop_reference(oracle, theta, indices)
    torch.testing.assert_close(rows.norms(), want.norm(dim=1), rtol=1e-9, atol=0)
    torch.testing.assert_close(rows.weighted_sum(torch.ones(6, dtype=F64)), want.sum(0), rtol=1e-9, atol=1e-12)
    diff = rows - oracle.per_record(theta + 0.1, indices)
    want_diff = want - loop_reference(oracle, theta + 0.1, indices)
    torch.testing.assert_close(diff.norms(), want_diff.norm(dim=1), rtol=1e-9, atol=0)


class Attends(nn.Module):
    """nn.MultiheadAttention reads ``out_proj.weight`` without calling ``out_proj``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(4, 8), nn.Linear(8, 4)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        h = self.embed(x.view(len(x), 2, 2).repeat(1, 1, 2))
        return self.head(self.mha(h, h, h)[0].mean(1))


@pytest.mark.parametrize("module", [ReadsWeight(), Attends()], ids=["reads-weight", "multihead-attention"])
def test_a_layer_whose_parameters_are_used_outside_its_call_joins_the_block(module):
    """The layer's rule would miss that use: the layer is run as part of the block's vmap instead,
    and the per-record gradients are exact."""
    torch.manual_seed(0)
    X, y = torch.randn(6, 4, dtype=F64), torch.randint(0, 4, (6,))
    oracle = TorchModel(module.double(), cross_entropy, X, y)
    theta, indices = oracle.flat_params(), torch.arange(6)
    rows, want = oracle.per_record(theta, indices), loop_reference(oracle, theta, indices)
    torch.testing.assert_close(rows.norms(), want.norm(dim=1), rtol=1e-9, atol=0)
    torch.testing.assert_close(rows.weighted_sum(torch.ones(6, dtype=F64)), want.sum(0), rtol=1e-9, atol=1e-12)


def test_a_layer_given_records_across_dim_0_is_refused():
    """A Linear on a 1-D batch (one number per record) would act across the records: refused, not run."""
    oracle = TorchModel(nn.Sequential(nn.Linear(3, 1)).double(), lambda out, y: (out - y).square(),
                        torch.randn(3, dtype=F64), torch.randn(3, dtype=F64))
    with pytest.raises(DpoptError, match=r"layer '0' \(Linear\) .* must have 2 or more dims; it has shape \(3,\)"):
        oracle.per_record(oracle.flat_params(), torch.arange(3))
