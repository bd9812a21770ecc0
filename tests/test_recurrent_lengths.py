"""``dpopt.nn``'s recurrent layers on padded batches of variable-length records, given each
record's length (``lengths=``, right or left padding) or a ``PackedSequence``: torch's outputs and
final states on the packed records; per-record gradients that are autograd's on each record alone,
unpadded; and, where a DataLoader's ``collate_fn`` pads each chunk to its longest record, a
clipped sum that one record (however long) moves by at most 2C, under both engines. The layer that
ignores the lengths (as before they existed: the reverse direction from the padded end, the
forward one through left padding, the final state after the padding) is the mutant that
measurement catches; without ``lengths=`` such chunks are refused."""

from __future__ import annotations

import itertools

import dp_accounting as dpa
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset

import dpopt
import dpopt.nn as dnn
from dpopt import clipping
from dpopt._validate import DpoptError
from dpopt.algorithms.registry import build
from dpopt.nn import padding
from dpopt.oracles import TorchModel
from dpopt.oracles.loaded import Loaded
from tests.test_recurrent import ENGINES, F64, OURS, TORCH, engine_rows, flat

CLIP = 0.01
N = 32
VOCABULARY = 12


# ------------------------------------------------------------------ torch's packed sequences


def left_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` ``[B, T, p]`` with each record's real steps (its first ``lengths[b]``) moved to the end."""
    out = torch.zeros_like(x)
    for b, L in enumerate(lengths.tolist()):
        out[b, x.shape[1] - L:] = x[b, :L]
    return out


def states(h) -> Tensor:
    return torch.stack(h) if isinstance(h, tuple) else h


@pytest.mark.parametrize(("kind", "settings"), [
    (kind, dict(settings)) for kind, settings in itertools.product(
        ["LSTM", "GRU", "RNN"], [{}, {"num_layers": 2, "bidirectional": True}, {"batch_first": True},
                                 {"bidirectional": True, "batch_first": True, "bias": False}])
] + [("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True})])
def test_outputs_and_final_states_are_torchs_on_the_packed_records(kind, settings):
    """Padded input with lengths= (right padding), the same records padded on the left
    (padding_side="left"), and the PackedSequence itself (a PackedSequence back, packed as
    torch packs it): the outputs (zero at the padding) and h_n (c_n) of torch's module on
    pack_padded_sequence(..., enforce_sorted=False), to 1e-12 in float64; one unbatched
    record with a 0-d length too."""
    torch.manual_seed(0)
    theirs = TORCH[kind](3, 5, **settings, dtype=F64).eval()
    ours = dnn.from_torch(theirs)
    batch_first, directions = settings.get("batch_first", False), 2 if settings.get("bidirectional") else 1
    lengths = torch.tensor([4, 7, 1, 7, 3])
    x = torch.randn(5, 7, 3, dtype=F64)  # [B, T, p]
    as_input = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))
    h0 = torch.randn(settings.get("num_layers", 1) * directions, 5, 5, dtype=F64)
    hx = (h0, torch.randn_like(h0)) if kind == "LSTM" else h0
    packed = pack_padded_sequence(as_input(x), lengths, batch_first=batch_first, enforce_sorted=False)
    out_packed, h_want = theirs(packed, hx)
    want = as_input(pad_packed_sequence(out_packed, batch_first=batch_first)[0])  # [B, T, D·H], zero at the padding

    out, h = ours(as_input(x), hx, lengths=lengths)
    assert torch.allclose(as_input(out), want, rtol=0, atol=1e-12)
    assert torch.allclose(states(h), states(h_want), rtol=0, atol=1e-12)

    out, h = ours(as_input(left_padded(x, lengths)), hx, lengths=lengths, padding_side="left")
    assert torch.allclose(as_input(out), left_padded(want, lengths), rtol=0, atol=1e-12)
    assert torch.allclose(states(h), states(h_want), rtol=0, atol=1e-12)

    out, h = ours(packed, hx)
    assert isinstance(out, type(packed))
    assert torch.equal(out.batch_sizes, out_packed.batch_sizes) and torch.equal(out.sorted_indices,
                                                                                out_packed.sorted_indices)
    assert torch.allclose(out.data, out_packed.data, rtol=0, atol=1e-12)
    assert torch.allclose(states(h), states(h_want), rtol=0, atol=1e-12)

    one = (hx[0][:, 3], hx[1][:, 3]) if kind == "LSTM" else hx[:, 3]
    out, h = ours(x[3, :6] if batch_first else x[3, :6], one, lengths=torch.tensor(3))
    alone_out, alone_h = ours(x[3:4, :3] if batch_first else x[3:4, :3].transpose(0, 1),
                              tuple(s.unsqueeze(1) for s in one) if kind == "LSTM" else one.unsqueeze(1))
    alone_out = alone_out[0] if batch_first else alone_out[:, 0]
    assert torch.allclose(out[:3], alone_out, rtol=0, atol=1e-12) and (out[3:] == 0).all()
    assert torch.allclose(states(h), states(alone_h).squeeze(-2), rtol=0, atol=1e-12)


def test_lengths_and_packed_sequences_are_refused_where_they_cannot_be_read():
    lstm = dnn.LSTM(3, 4, batch_first=True)
    x = torch.randn(2, 5, 3)
    with pytest.raises(DpoptError, match=r"lengths must be an integer tensor of shape \(2,\) \(each record's number "
                                         r"of real steps\), got torch.float32 of shape \(2,\)"):
        lstm(x, lengths=torch.tensor([5.0, 3.0]))
    with pytest.raises(DpoptError, match=r"lengths must be an integer tensor of shape \(2,\).*shape \(3,\)"):
        lstm(x, lengths=torch.tensor([5, 3, 1]))
    with pytest.raises(DpoptError, match=r"lengths must lie in \[1, 5\] \(the padded length\), got values from 0 to 3"):
        lstm(x, lengths=torch.tensor([0, 3]))
    with pytest.raises(DpoptError, match=r"lengths must lie in \[1, 5\].*from 3 to 6"):
        lstm(x, lengths=[6, 3])
    with pytest.raises(DpoptError, match="padding_side='top' must be one of: right, left"):
        lstm(x, lengths=[5, 3], padding_side="top")
    packed = pack_padded_sequence(x, torch.tensor([5, 3]), batch_first=True)
    with pytest.raises(DpoptError, match="lengths= and padding_side= describe a padded tensor input; a PackedSequence "
                                         "holds its own lengths"):
        lstm(packed, lengths=torch.tensor([5, 3]))
    with pytest.raises(DpoptError, match=r"input is a PackedSequence, which dpopt.nn.LSTMCell \(one step, as torch's "
                                         r"LSTMCell\) does not take: .* use dpopt.nn.LSTM with lengths="):
        dnn.LSTMCell(3, 4)(packed)


# --------------------------------------------------- records of their own lengths, chunk-padded


class Sequences(Dataset):
    """32 records of tokens 1..11 (0 is the padding) of lengths 2 to 5, the first of length 3 (or
    ``first``, a record of length 12: the neighbouring data set), each labelled 0: the other
    records' gradients move together where they move with the padding."""

    def __init__(self, first: Tensor | None = None) -> None:
        gen = torch.Generator().manual_seed(0)
        self.tokens = [torch.randint(1, VOCABULARY, (3 if i == 0 else 2 + i % 4,), generator=gen) for i in range(N)]
        if first is not None:
            self.tokens[0] = first
        self.labels = torch.zeros(N, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.tokens[i], self.labels[i]


LONG = torch.randint(1, VOCABULARY, (12,), generator=torch.Generator().manual_seed(5))


def right_padded(records: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Pads each chunk to its longest record, with 0 after each record's tokens."""
    return (pad_sequence([tokens for tokens, _ in records], batch_first=True),
            torch.stack([label for _, label in records]))


def left_padded_tokens(records: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Pads each chunk to its longest record, with 0 before each record's tokens."""
    return (pad_sequence([tokens.flip(0) for tokens, _ in records], batch_first=True).flip(1),
            torch.stack([label for _, label in records]))


COLLATE = {"right": right_padded, "left": left_padded_tokens}


class Reader(nn.Module):
    """Tokens → Embedding → the recurrent layer, given each record's length (its non-zero
    tokens; none if not ``given``) and padding side → Linear on its final states (every
    direction) and the sum of its outputs over the steps."""

    def __init__(self, kind: str, side: str = "right", given: bool = True, **settings: object) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.side, self.given, self.embed = side, given, nn.Embedding(VOCABULARY, 3)
        self.rnn = OURS[kind](3, 4, batch_first=True, **settings)
        directions = 2 if self.rnn.bidirectional else 1
        self.head = nn.Linear(2 * directions * 4, 2)
        self.double()

    def forward(self, tokens: Tensor) -> Tensor:
        lengths = (tokens != 0).sum(1) if self.given else None
        out, h = self.rnn(self.embed(tokens), lengths=lengths, padding_side=self.side)
        directions = 2 if self.rnn.bidirectional else 1
        final = (h[0] if isinstance(h, tuple) else h)[-directions:]  # the last layer's h_n, [D, B, H]
        return self.head(torch.cat([*final, out.sum(1)], -1))


def ignoring_lengths(model: Reader) -> Reader:
    """The mutant: its layer runs every direction over the whole padded length and keeps the state
    after the last padded step, as the layers did before lengths existed (the lengths are ignored)."""
    direction = model.rnn._direction
    model.rnn._direction = lambda suffix, x, initial, steps, reverse: direction(suffix, x, initial, padding.Full(),
                                                                                reverse)
    return model


def cross_entropy(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def oracle_on(model: nn.Module, side: str, engine: str, first: Tensor | None = None) -> TorchModel:
    """The oracle reading the records through a DataLoader whose collate_fn pads every chunk (one
    chunk here) to its longest record, as dpopt.Private reads them."""
    loader = DataLoader(Sequences(first=first), collate_fn=COLLATE[side])
    return TorchModel(model, cross_entropy, Loaded(loader, None, 64), engine=engine, microbatch_size=64)


def clipped_sum_moved(make: object, side: str, engine: str) -> tuple[float, float]:
    """‖S(D′) − S(D)‖ and the sensitivity S claims, for S the clipped sum (C = 0.01, replace-one:
    DP-GD without noise) of the per-record gradients of all 32 records at the model's
    initialisation; D′ = D with its length-3 first record replaced by one of length 12, so that
    every other record of the chunk is padded to 12 steps instead of 5."""
    sums = []
    for first in (None, LONG):
        oracle = oracle_on(make(), side, engine, first)
        rows = oracle.per_record(oracle.flat_params(), torch.arange(oracle.n))
        sums.append(clipping.clip_sum([clipping.Term(1.0, rows, CLIP)], dpa.NeighboringRelation.REPLACE_ONE)[0])
    return float((sums[1].value - sums[0].value).norm()), sums[0].sensitivity


LAYERS = [(kind, bidirectional, side) for kind in ("LSTM", "GRU", "RNN") for bidirectional in (False, True)
          for side in ("right", "left")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("kind", "bidirectional", "side"), LAYERS)
def test_a_longer_record_moves_the_clipped_sum_by_at_most_2c(kind, bidirectional, side, engine):
    """With lengths given, a record's outputs and final states are its own steps' whatever the
    chunk's padded length: only the replaced record's clipped gradient changes (≤ 2C)."""
    moved, sensitivity = clipped_sum_moved(lambda: Reader(kind, side, bidirectional=bidirectional), side, engine)
    assert sensitivity == 2 * CLIP and moved <= sensitivity * (1 + 1e-9), moved


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("kind", "bidirectional", "side"), LAYERS)
def test_a_layer_that_ignores_the_lengths_is_caught_by_the_same_measurement(kind, bidirectional, side, engine):
    """The mutant, which computes what the layers computed before lengths existed (the reverse
    direction from the padded end, the forward one through left padding, h_n after the padding,
    outputs at the padding), moves the clipped sum by more than twice 2C (3.7 to 9.5 times here):
    the other 31 records' gradients move with the replaced record's length. Its honest twin is the
    test above (0.21 to 0.45 times 2C)."""
    moved, sensitivity = clipped_sum_moved(
        lambda: ignoring_lengths(Reader(kind, side, bidirectional=bidirectional)), side, engine)
    assert moved > 2 * sensitivity, moved


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("kind", "settings", "side"), [
    ("LSTM", {"bidirectional": True}, "right"), ("LSTM", {"num_layers": 2}, "left"),
    ("GRU", {"bidirectional": True, "num_layers": 2}, "left"), ("RNN", {"bidirectional": True}, "right")])
def test_each_records_gradient_is_autograds_on_the_record_alone_unpadded(kind, settings, side, engine):
    """The engine's per-record gradients (and norms) on the padded chunk equal autograd's on each
    record alone without padding, to 1e-10 in float64; under the ghost engine the recurrent
    maps keep their ghost rule (their calls at padded steps add exactly zero)."""
    model = Reader(kind, side, **settings)
    oracle = oracle_on(model, side, engine)
    params = [p for p in model.parameters() if p.requires_grad]
    records = Sequences()
    want = torch.stack([flat(torch.autograd.grad(cross_entropy(model(tokens[None]), label[None]).sum(), params))
                        for tokens, label in (records[i] for i in range(len(records)))])
    theta = oracle.flat_params()
    assert torch.allclose(engine_rows(oracle, theta), want, rtol=0, atol=1e-10)
    norms = oracle.per_record(theta, torch.arange(oracle.n)).norms()
    assert torch.allclose(norms, want.norm(dim=1), rtol=1e-9, atol=0)
    if engine == "ghost":
        assert {path for path, rule in oracle.rules() if rule == "ghost"} >= {"rnn.ih_l0", "rnn.hh_l0", "head"}


# ---------------------------------------------------------------------- refused without lengths


class Unmeasured(nn.Module):
    """Tokens → Embedding → the recurrent layer without lengths → Linear on its last h_n."""

    def __init__(self, kind: str = "LSTM", **settings: object) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.rnn = nn.Embedding(VOCABULARY, 3), OURS[kind](3, 4, batch_first=True, **settings)
        self.head = nn.Linear(4, 2)
        self.double()

    def forward(self, tokens: Tensor) -> Tensor:
        _, h = self.rnn(self.embed(tokens))
        return self.head((h[0] if isinstance(h, tuple) else h)[-1])


def private_gradient(model: nn.Module, data: object, engine: str) -> Tensor:
    """The gradient one DP-GD step of dpopt.Private writes to the module's parameters."""
    private = dpopt.Private(model, cross_entropy, data, algorithm=build("dp-gd", n=N, batch_size=N), epsilon=None,
                            delta=1e-3, steps=1, seed=0, engine=engine)
    for _ in private:
        private.backward()
    return flat(p.grad for p in model.parameters())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("kind", "settings"), [("LSTM", {"bidirectional": True}), ("GRU", {}), ("RNN", {})])
def test_without_lengths_a_layer_is_refused_on_chunks_a_collate_fn_pads(kind, settings, engine):
    """Through dpopt.Private with a DataLoader whose collate_fn pads, a layer without lengths= is
    refused at the first step, in one sentence saying what to do; the same layer on fixed-length
    records (tensors, or a DataLoader's default collation) trains as before."""
    with pytest.raises(DpoptError, match=rf"dpopt.nn.{kind} got no lengths= while dpopt runs it on records collated "
                                         r"by the DataLoader's collate_fn, which may pad each chunk .*: pass lengths="):
        private_gradient(Unmeasured(kind, **settings), DataLoader(Sequences(), collate_fn=right_padded), engine)
    fixed = torch.randint(1, VOCABULARY, (N, 5), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(1))
    tensors, loaded = (private_gradient(Unmeasured(kind, **settings), data, engine)
                       for data in ((fixed, labels), DataLoader(TensorDataset(fixed, labels))))
    assert tensors.isfinite().all() and torch.equal(tensors, loaded)  # the same records, the same seeded step


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sequence_packed_inside_the_per_record_run_is_refused_with_its_reason(engine):
    """torch's packing has no vmap rule and a packed record's data has its own length: a
    PackedSequence that reaches the layer inside the engines' per-record run is refused,
    pointing to lengths= (records of different lengths may fail in torch's packing first)."""

    class Packing(Unmeasured):
        def forward(self, tokens: Tensor) -> Tensor:
            lengths = (tokens != 0).sum(1)
            _, (h, _) = self.rnn(pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                                      enforce_sorted=False))
            return self.head(h[-1])

    tokens = torch.randint(1, VOCABULARY, (4, 5), generator=torch.Generator().manual_seed(0))
    oracle = TorchModel(Packing(), cross_entropy, tokens, torch.tensor([0, 1, 0, 1]), engine=engine)
    with pytest.warns(UserWarning, match="batching rule"), pytest.raises(
            DpoptError, match="input is a PackedSequence packed inside dpopt's per-record run .* give the padded "
                              "tensor and lengths= instead"):
        oracle.per_record(oracle.flat_params(), torch.arange(4))
