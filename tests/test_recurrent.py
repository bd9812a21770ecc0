"""``dpopt.nn``'s recurrent layers: torch's modules (names, state dict, outputs), per-record
gradients equal to autograd's record by record under both engines, training through
``dpopt.Private`` with the ledger equal to the plan, and a hidden state shared across the batch
(the mutant) caught by a per-record check, under which the engines keep every record alone."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils.rnn import pack_padded_sequence

import dpopt
import dpopt.nn as dnn
from dpopt._validate import DpoptError
from dpopt.accounting import canonical
from dpopt.oracles import TorchModel

F64 = torch.float64
ENGINES = ("vmap", "ghost")
TORCH = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}
OURS = {"LSTM": dnn.LSTM, "GRU": dnn.GRU, "RNN": dnn.RNN}
SETTINGS = [
    {},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
    {"num_layers": 2, "bias": False, "dropout": 0.5},
]


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


# ------------------------------------------------------------------------------ torch's module


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN", "RNN-relu"])
def test_outputs_parameters_and_state_dict_are_torchs(kind, settings):
    """Same parameter names, order and shapes; a state dict loads both ways; the same outputs
    and final states (float64, eval mode) for batched and unbatched inputs, with and without hx."""
    extra = {"nonlinearity": "relu"} if kind == "RNN-relu" else {}
    kind = kind.split("-")[0]
    torch.manual_seed(0)
    theirs = TORCH[kind](3, 5, **settings, **extra, dtype=F64).eval()
    ours = OURS[kind](3, 5, **settings, **extra, dtype=F64).eval()
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    copy.deepcopy(theirs).load_state_dict(ours.state_dict())
    layers = settings.get("num_layers", 1) * (2 if settings.get("bidirectional") else 1)
    records = torch.randn(4, 6, 3, dtype=F64)  # 4 records of 6 steps
    x = records if settings.get("batch_first") else records.transpose(0, 1)
    hx = torch.randn(layers, 4, 5, dtype=F64)
    hx = (hx, torch.randn_like(hx)) if kind == "LSTM" else hx
    unbatched = (hx[0][:, 0], hx[1][:, 0]) if kind == "LSTM" else hx[:, 0]
    for args in ((x,), (x, hx), (records[0],), (records[0], unbatched)):
        (out_t, h_t), (out_o, h_o) = theirs(*args), ours(*args)
        assert out_o.shape == out_t.shape
        assert torch.allclose(out_o, out_t, rtol=0, atol=1e-12)
        for a, b in zip(h_o if kind == "LSTM" else (h_o,), h_t if kind == "LSTM" else (h_t,)):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_are_torchs(kind):
    torch.manual_seed(0)
    theirs = getattr(nn, kind)(3, 5, dtype=F64)
    ours = dnn.from_torch(theirs)
    assert isinstance(ours, getattr(dnn, kind))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    x, h = torch.randn(4, 3, dtype=F64), torch.randn(4, 5, dtype=F64)
    hx = (h, torch.randn_like(h)) if kind == "LSTMCell" else h
    for args in ((x,), (x, hx), (x[0],)):
        got, want = ours(*args), theirs(*args)
        got, want = (torch.stack(got), torch.stack(want)) if kind == "LSTMCell" else (got, want)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=1e-12)


def test_from_torch_keeps_settings_dtype_mode_and_frozen_parameters():
    theirs = nn.GRU(3, 4, num_layers=2, batch_first=True, dropout=0.25, bidirectional=True, dtype=F64).eval()
    theirs.weight_hh_l1.requires_grad_(False)
    ours = dnn.from_torch(theirs)
    assert (ours.num_layers, ours.batch_first, ours.dropout, ours.bidirectional, ours.training) == (2, True, 0.25,
                                                                                                   True, False)
    assert {n for n, p in ours.named_parameters() if not p.requires_grad} == {"weight_hh_l1"}
    assert all(p.dtype == F64 for p in ours.parameters())
    # one tensor per parameter: the Linear child holds the very parameter torch's name holds
    assert ours.ih_l0.weight is ours.weight_ih_l0 and len(list(ours.parameters())) == 16


def test_refusals_name_the_argument():
    lstm = dnn.LSTM(3, 4, batch_first=True)
    packed = pack_padded_sequence(torch.randn(2, 5, 3), torch.tensor([5, 3]), batch_first=True)
    with pytest.raises(DpoptError, match="input is a PackedSequence, which dpopt.nn.GRUCell .* does not take"):
        dnn.GRUCell(3, 4)(packed)
    with pytest.raises(DpoptError, match=r"input of shape \(2, 5, 4\) must have 2 or 3 dims, the last of size "
                                         r"input_size=3"):
        lstm(torch.randn(2, 5, 4))
    with pytest.raises(DpoptError, match=r"hx must be a pair \(h_0, c_0\) of tensors of shape \(1, 2, 4\)"):
        lstm(torch.randn(2, 5, 3), torch.zeros(1, 2, 4))
    with pytest.raises(DpoptError, match="proj_size=2: dpopt.nn.LSTM has no projection"):
        dnn.from_torch(nn.LSTM(3, 4, proj_size=2))
    with pytest.raises(DpoptError, match="nonlinearity='sigmoid' must be one of: tanh, relu"):
        dnn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(DpoptError, match=r"dropout=1.5 must be a number in \[0, 1\]"):
        dnn.GRU(3, 4, dropout=1.5)


# ------------------------------------------------------------------------- per-record gradients


class Classifier(nn.Module):
    """Tokens → Embedding → recurrent layer → Linear on the last step's output."""

    def __init__(self, rnn: nn.Module, vocab: int = 12, width: int = 4) -> None:
        super().__init__()
        self.embed, self.rnn = nn.Embedding(vocab, width), rnn
        self.head = nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out[:, -1])


def classifier(kind: str, **settings) -> Classifier:
    torch.manual_seed(0)
    return Classifier(OURS[kind](4, 5, batch_first=True, **settings)).to(F64)


def tokens(n: int = 6, length: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 12, (n, length), generator=gen), torch.randint(0, 2, (n,), generator=gen)


def autograd_rows(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each record's gradient by autograd on that record alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.stack([flat(torch.autograd.grad(cross_entropy(model(X[i:i + 1]), y[i:i + 1]).sum(), params))
                        for i in range(len(y))])


def engine_rows(oracle: TorchModel, theta: torch.Tensor) -> torch.Tensor:
    """Each record's gradient as the engine adds it to a sum (one-hot weights)."""
    rows = oracle.per_record(theta, torch.arange(oracle.n))
    return torch.stack([rows.weighted_sum(torch.eye(oracle.n, dtype=F64)[i]) for i in range(oracle.n)])


@pytest.mark.parametrize(("kind", "settings"), [("LSTM", {}), ("GRU", {}), ("LSTM", {"num_layers": 2,
                                                "bidirectional": True}), ("GRU", {"num_layers": 2}), ("RNN", {})])
@pytest.mark.parametrize("engine", ENGINES)
def test_per_record_gradients_are_autograds_record_by_record(kind, settings, engine):
    model = classifier(kind, **settings)
    X, y = tokens()
    want = autograd_rows(model, X, y)
    oracle = TorchModel(model, cross_entropy, X, y, engine=engine)
    theta = oracle.flat_params()
    assert torch.allclose(engine_rows(oracle, theta), want, rtol=0, atol=1e-10)
    norms = oracle.per_record(theta, torch.arange(6)).norms()
    assert torch.allclose(norms, want.norm(dim=1), rtol=1e-9, atol=0)
    assert (norms >= want.norm(dim=1) * (1 - 1e-12)).all()  # the ghost norms are upper bounds
    if engine == "ghost":  # the recurrent maps keep the ghost rule inside the per-record run
        assert {path for path, rule in oracle.rules() if rule == "ghost"} >= {"rnn.ih_l0", "rnn.hh_l0", "head"}


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_module_alone_runs_per_record_under_vmap(kind):
    """torch.func's vmap(grad) of the recurrent module by itself (what TorchModel's vmap engine
    does), with hx: each record's gradient is autograd's on that record alone."""
    torch.manual_seed(0)
    rnn = OURS[kind](3, 4, num_layers=2, batch_first=True, dtype=F64)
    x, h0 = torch.randn(5, 6, 3, dtype=F64), torch.randn(5, 2, 4, dtype=F64)
    params = dict(rnn.named_parameters())

    def loss(p, xi, hi):
        hx = hi.unsqueeze(1)
        out, _ = functional_call(rnn, p, (xi.unsqueeze(0), (hx, torch.tanh(hx)) if kind == "LSTM" else hx))
        return out.pow(2).sum()

    per_record = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, h0)
    for i in range(5):
        hx = h0[i].unsqueeze(1)
        out, _ = rnn(x[i:i + 1], (hx, torch.tanh(hx)) if kind == "LSTM" else hx)
        want = torch.autograd.grad(out.pow(2).sum(), list(params.values()))
        assert torch.allclose(flat(g[i] for g in per_record.values()), flat(want), rtol=0, atol=1e-10)


# ----------------------------------------------------------------------- training via Private


def detection_task(n: int = 256, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of tokens 2..19; label 1 iff token 1 occurs (inserted in half the records)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randint(2, 20, (n, length), generator=gen)
    y = torch.randint(0, 2, (n,), generator=gen)
    X[y == 1, torch.randint(0, length, (int(y.sum()),), generator=gen)] = 1
    return X, y


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_text_classifier_trains_through_private_to_its_plan(kind, engine):
    """Contract: after 30 Adam steps on the private gradient the ledger equals the planned event
    and ε is the target; the (float32) classifier's loss on the data drops (from 0.73 to 0.32
    for the LSTM, 0.01 for the GRU: the two engines' runs agree)."""
    X, y = detection_task()
    torch.manual_seed(0)
    model = Classifier(OURS[kind](16, 16, batch_first=True), vocab=20, width=16)
    with torch.no_grad():
        before = float(cross_entropy(model(X), y).mean())
    private = dpopt.Private(model, cross_entropy, (X, y), epsilon=8.0, delta=1e-5, steps=30, batch_size=64,
                            clip=1.0, seed=0, engine=engine)
    adam = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in private:
        private.backward()
        adam.step()
    assert private.ledger.event() == canonical(private.algorithm.planned_event(len(y), 30))
    assert 0.99 * 8.0 <= private.epsilon() <= 8.0
    with torch.no_grad():
        after = float(cross_entropy(model(X), y).mean())
    assert after < before - 0.25, (before, after)


# -------------------------------------------------------- a hidden state shared across the batch


class SharedStateLSTM(dnn.LSTM):
    """Mutant: each step's hidden state is averaged with the batch's mean hidden state, so a
    record's output (and gradient) depends on the other records of its batch."""

    def _update(self, gi, gh, state):
        h, c = super()._update(gi, gh, state)
        return 0.5 * (h + h.mean(0, keepdim=True)), c


def record_zero(rows_of, X, y) -> tuple[torch.Tensor, torch.Tensor]:
    """Record 0's gradient in its batch, and with every other record of the batch replaced."""
    other = X.clone()
    other[1:] = tokens(len(y), X.shape[1], seed=7)[0][1:]
    return rows_of(X, y)[0], rows_of(other, y)[0]


def leaks(rows_of, X, y) -> bool:
    """The per-record check: does record 0's gradient move when the other records change?"""
    mine, with_others = record_zero(rows_of, X, y)
    return not torch.allclose(mine, with_others, rtol=0, atol=1e-12)


def whole_batch_rows(model):
    """Per-record gradients read off one forward of the whole batch (∂ℓ_i/∂θ through the batch's
    forward): what an engine running the module on the whole batch computes."""
    def rows(X, y):
        losses = cross_entropy(model(X), y)
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.stack([flat(torch.autograd.grad(loss, params, retain_graph=True)) for loss in losses])
    return rows


def engine_rows_of(model, engine):
    def rows(X, y):
        oracle = TorchModel(model, cross_entropy, X, y, engine=engine)
        return engine_rows(oracle, oracle.flat_params())
    return rows


def test_a_hidden_state_shared_across_the_batch_is_caught_and_the_engines_keep_records_apart():
    """The per-record check flags the mutant run on the whole batch and passes its honest twin;
    both engines run the mutant on each record alone, so there it leaks nothing and its
    gradients are the honest module's, record by record."""
    X, y = tokens()
    honest = classifier("LSTM")
    mutant = copy.deepcopy(honest)
    mutant.rnn.__class__ = SharedStateLSTM
    assert leaks(whole_batch_rows(mutant), X, y)
    assert not leaks(whole_batch_rows(honest), X, y)
    for engine in ENGINES:
        assert not leaks(engine_rows_of(mutant, engine), X, y)
        assert torch.allclose(engine_rows_of(mutant, engine)(X, y), autograd_rows(honest, X, y), rtol=0, atol=1e-10)


class Recurrence(nn.Module):
    """A frozen one-unit recurrence over a record's features, ``h_t = tanh(x_t + 0.9 h_{t−1})``,
    as an audit world's layer (``[B, k] → [B, k]``). With ``batch_first=False`` it is the mutant:
    the ``[B, k, 1]`` input is read as ``[T, batch, 1]``, so the hidden state runs from record to
    record through the batch."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.rnn = dnn.RNN(1, 1, bias=False, batch_first=batch_first, dtype=F64).requires_grad_(False)
        with torch.no_grad():
            self.rnn.weight_ih_l0.fill_(1.0)
            self.rnn.weight_hh_l0.fill_(0.9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x.unsqueeze(-1))[0].squeeze(-1)


def test_the_audit_flags_a_recurrence_through_the_batch_claimed_per_record_and_passes_its_twin():
    """Both layers are claimed to act on each record on its own (registered with the ghost engine,
    so run on the whole batch). The mutant's hidden state carries the canary into the records
    after it in the batch (background records x = 0, y = −M, zero gradient alone): the audit
    refutes the claimed ε = 2; the honest layer, whose state stays within each record, passes."""
    from dpopt.audit import worlds
    from dpopt.oracles import ghost
    from tests.test_audit import MIXING, MUTANTS, run_audit

    claimed = ghost.KNOWN_LAYERS.with_per_record(Recurrence)
    case = dataclasses.replace(
        MUTANTS["ghost batch-mixing layer"], canary=MIXING,
        engine=worlds.Module("ghost", layers=lambda width: [Recurrence(batch_first=False)], known_layers=claimed),
        twin_engine=worlds.Module("ghost", layers=lambda width: [Recurrence()], known_layers=claimed))
    assert run_audit(case).flagged
    assert not run_audit(case, twin=True).flagged
