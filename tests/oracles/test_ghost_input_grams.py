"""The input Gram matrices of a layer that takes the data itself, kept by record between steps
(``ghost.grams.InputGrams``, augmentation multiplicity's views), and at one position (ScatterNet's
features into a linear layer) the squared input norms, kept the same way.

* A record's matrices (``rounding.record_grams``) have the same bits wherever the record stands in
  its chunk and however the chunk is split into copies; so do its squared norm's bound
  (``rounding.sq_rows``), wherever the row lies in memory.
* Norms and sums from kept matrices (or squared norms) equal, bit for bit, those of an oracle that forms them in the
  step (a fresh oracle on the same records and θ), at other positions, across chunks and for a
  difference at two points; a DP-SGD run gives the same θ whether the matrices are kept or formed
  at every step. The mutant cache keyed by position in the batch instead of record index is
  caught by both measurements, and gives some records norms below their true norm (autograd's):
  clipping would no longer bound what they add.
* More views than the cost rule of a step that forms its input matrices takes (``use_gram``: the
  direct form at nine views of 300 features) keep their matrices too, and their norms take the
  Gram form: nothing of the records is read for them after the first time (finding: at nine views
  of the views' layer, the records were gathered and their weight-gradient rows built every step,
  0.63 s a DP-SGD step of 4,096 records against 0.16 s at five; kept, 0.28 s: ``bench_views_step.py``).
* Changing the records' tensor in place drops what was kept (the mutant without the version in
  its key is caught); records read from a Dataset keep nothing; a copy or pickle of the oracle
  keeps none of the matrices.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import Dataset

from dpopt.algorithms import DPSGD
from dpopt.augmentation import mean_over_views
from dpopt.models import cross_entropy, make_model
from dpopt.oracles import TorchModel, ghost
from dpopt.oracles.ghost import grams, rounding

#: Records of five views of p features: the views' layer, narrowed (still in the Gram form, kept).
N, VIEWS, P, CHUNK = 60, 5, 300, 16


#: What is kept at the first layer, by its positions T: Gram matrices of the views, squared norms at one.
KEPT = {VIEWS: "input_grams", 9: "input_grams", 1: "input_sq_norms"}
#: The positions tested: five views, nine (beyond ``use_gram``'s choice at P features), one.
POSITIONS = [VIEWS, 9, 1]


def views(seed: int = 0, dtype: torch.dtype = torch.float32, T: int = VIEWS) -> tuple[torch.Tensor, torch.Tensor]:
    """N records of T views of P features (``[N, P]`` at T = 1) and their labels."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(N, T, P, generator=gen, dtype=dtype)
    return (X if T > 1 else X[:, 0].contiguous()), torch.randint(0, 10, (N,), generator=gen)


def oracle(X: torch.Tensor, y: torch.Tensor, engine: str = "ghost") -> TorchModel:
    model = make_model("linear", seed=0, inputs=P).to(X.dtype)
    loss = mean_over_views(cross_entropy) if X.ndim == 3 else cross_entropy
    return TorchModel(model, loss, X, y, microbatch_size=CHUNK, engine=engine)


def theta_at(model: TorchModel, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.flat_params().double() + 0.05 * torch.randn(model.dim, generator=gen, dtype=torch.float64)


FIRST = torch.arange(0, N, 2)                     # the even records
SECOND = torch.tensor([1, 3, 4, 10, 11, 12, 13, 30, 31, 32, 40, 44, 45, 50, 51, 52, 53, 54, 55, 58, 59])


def kept_and_fresh(dtype: torch.dtype = torch.float32,
                   T: int = VIEWS) -> tuple[ghost.GhostRows, ghost.GhostRows, TorchModel]:
    """The rows of SECOND at θ₂ from an oracle that kept the matrices of FIRST (at θ₁, other
    positions: record 4 was third there, is third here in another chunk split), and from a fresh one."""
    X, y = views(dtype=dtype, T=T)
    warm, fresh = oracle(X, y), oracle(X, y)
    warm.per_record(theta_at(warm, 1), FIRST).norms()
    return warm.per_record(theta_at(warm, 2), SECOND), fresh.per_record(theta_at(fresh, 2), SECOND), warm


def by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the matrices kept by position in the chunk, not by record index."""
    of = grams.InputGrams.of
    monkeypatch.setattr(grams.InputGrams, "of", lambda self, indices, A: of(self, torch.arange(len(indices)), A))


def without_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the key leaves out the records' version, so an in-place change keeps stale matrices."""
    of_what = grams.InputGrams.of_what
    monkeypatch.setattr(grams.InputGrams, "of_what", lambda self, A: of_what(self, A)[:-1])


def test_a_records_matrices_have_the_same_bits_wherever_it_stands(monkeypatch):
    """Every record of 37 alone, and within the chunk copied 1, 3 or 7 records at a time, at
    offsets 0 and 5: equal bit for bit (and to float64 products of the exact casts, to 1e−12)."""
    gen = torch.Generator().manual_seed(4)
    A = torch.randn(42, VIEWS, 3969, generator=gen)
    alone = torch.stack([rounding.record_grams(A[i:i + 1])[0] for i in range(42)])
    for records in (1, 3, 7):
        monkeypatch.setattr(rounding, "GRAM_BYTES", records * 8 * VIEWS * 3969)
        for offset in (0, 5):
            assert torch.equal(rounding.record_grams(A[offset:offset + 37]), alone[offset:offset + 37])
    exact = A.double() @ A.double().mT
    torch.testing.assert_close(alone, exact[:42], rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_records_squared_norm_has_the_same_bits_wherever_it_lies(dtype):
    """ScatterNet's rows (3,969 features) of 300 records alone, and within chunks of 1 to 1,024 records
    gathered in other orders, from storage started 0 to 15 elements off its allocation: equal bit for
    bit (and to the exact float64 norm within the bound's enlargement)."""
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(300, 3969, generator=gen, dtype=dtype) * torch.rand(300, 1, generator=gen, dtype=dtype)
    alone = torch.cat([rounding.sq_rows(X[i:i + 1]) for i in range(300)])
    for offset, records in ((0, 1), (1, 7), (3, 64), (15, 300)):
        order = torch.randperm(300, generator=gen)[:records]
        storage = torch.empty(offset + records * 3969, dtype=dtype)[offset:].view(records, 3969)
        assert torch.equal(rounding.sq_rows(storage.copy_(X[order])), alone[order])
    exact = X.double().square().sum(1)
    assert (alone >= exact).all() and ((alone - exact) / exact).max() < 1e-5


@pytest.mark.parametrize("T", POSITIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kept_matrices_give_the_norms_and_sums_of_the_step_bit_for_bit(dtype, T):
    rows, fresh, warm = kept_and_fresh(dtype, T)
    layer = rows.chunks[0][0]
    assert KEPT[T] in layer.__dict__ and torch.equal(warm._input_grams.known, torch.isin(  # both calls' records
        torch.arange(N), torch.cat([FIRST, SECOND])))
    assert torch.equal(rows.norms(), fresh.norms())
    w = torch.minimum(torch.ones(len(SECOND), dtype=torch.float64), 0.5 / rows.norms())
    assert torch.equal(rows.weighted_sum(w), fresh.weighted_sum(w))


@pytest.mark.parametrize("read_in_place", [True, False])
def test_nine_views_take_the_gram_form_from_their_kept_matrices(monkeypatch, read_in_place):
    """Beyond ``use_gram``'s choice (its cost comparison prices input matrices formed at every step),
    the layer of nine views keeps its input matrices and takes the Gram form, read in place or
    gathered: no weight-gradient rows are built, and its norms bound autograd's to the rounding."""
    X, y = views(T=9)
    assert not ghost.use_gram(9, P, 10, 4) and grams.kept_shape(9, P, 10, 4)
    if not read_in_place:
        monkeypatch.setattr(ghost, "reads_in_place", lambda *args: False)
    model = oracle(X, y)
    rows = model.per_record(theta_at(model, 2), SECOND)
    norms, layer = rows.norms(), rows.chunks[0][0]
    assert isinstance(layer, ghost.in_place.InPlace) is read_in_place
    assert "input_grams" in layer.__dict__ and "_direct" not in layer.__dict__
    autograd = oracle(X, y, engine="vmap")
    true = autograd.per_record(theta_at(autograd, 2), SECOND).norms()
    assert (norms >= true).all() and ((norms - true) / true).max() < 1e-5


def test_the_difference_at_two_points_shares_the_kept_matrices():
    X, y = views()
    warm, fresh = oracle(X, y), oracle(X, y)
    warm.per_record(theta_at(warm, 1), FIRST).norms()
    got = warm.per_record(theta_at(warm, 2), SECOND) - warm.per_record(theta_at(warm, 3), SECOND)
    want = fresh.per_record(theta_at(fresh, 2), SECOND) - fresh.per_record(theta_at(fresh, 3), SECOND)
    assert "input_grams" in got.chunks[0][0].__dict__
    assert torch.equal(got.norms(), want.norms())


@pytest.mark.parametrize("T", POSITIONS)
def test_the_cache_keyed_by_position_is_caught_and_would_let_records_exceed_the_clip(monkeypatch, T):
    X, y = views(T=T)
    autograd = oracle(X, y, engine="vmap")
    true = autograd.per_record(theta_at(autograd, 2), SECOND).norms()
    rows, fresh, _ = kept_and_fresh(T=T)
    assert (rows.norms() >= true).all()
    by_position(monkeypatch)
    mutant, _, _ = kept_and_fresh(T=T)
    assert not torch.equal(mutant.norms(), fresh.norms())
    assert (mutant.norms() < true).any()  # a record whose clipped gradient would add more than C


def dpsgd_theta(every_step_fresh: bool, monkeypatch: pytest.MonkeyPatch, T: int = VIEWS) -> torch.Tensor:
    from dpopt.accounting import Ledger
    from dpopt.mechanisms import SeededNoise

    from dpopt import train

    if every_step_fresh:  # the matrices formed in each step, none kept
        monkeypatch.setattr(grams.InputGrams, "of_what", lambda self, A: (object(),))
    X, y = views(T=T)
    algorithm = DPSGD(lr=4.0, clip=0.1, noise_multiplier=1.0, batch_size=40)
    model = oracle(X, y)
    state = algorithm.init(model.flat_params().double(), 100, torch.Generator().manual_seed(0))
    gens, ledger = (torch.Generator().manual_seed(0), SeededNoise(1)), Ledger(algorithm.relation())
    for t in range(5):
        state, _ = train.step(algorithm, model, state, t, ledger, *gens, keyed=train.keyed(algorithm))
    monkeypatch.undo()
    return state.theta


@pytest.mark.parametrize("T", POSITIONS)
def test_a_dpsgd_run_gives_the_same_theta_whether_the_matrices_are_kept_or_formed(monkeypatch, T):
    kept_theta = dpsgd_theta(False, monkeypatch, T)
    assert torch.equal(kept_theta, dpsgd_theta(True, monkeypatch, T))
    by_position(monkeypatch)
    assert not torch.equal(kept_theta, dpsgd_theta(False, monkeypatch, T))


@pytest.mark.parametrize("T", POSITIONS)
@pytest.mark.parametrize("mutant", [None, without_version])
def test_an_in_place_change_of_the_records_drops_the_kept_matrices(monkeypatch, mutant, T):
    if mutant:
        mutant(monkeypatch)
    X, y = views(T=T)
    warm = oracle(X, y)
    warm.per_record(theta_at(warm, 1), FIRST).norms()
    X[4].mul_(3.0)  # record 4 (kept) changes
    got = warm.per_record(theta_at(warm, 2), SECOND).norms()
    want = oracle(X, y).per_record(theta_at(warm, 2), SECOND).norms()
    assert torch.equal(got, want) is (mutant is None)


class ViewsDataset(Dataset):
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.X)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.X[i], self.y[i]


def test_records_from_a_dataset_and_copies_of_the_oracle_keep_none():
    X, y = views()
    lazy = TorchModel(make_model("linear", seed=0, inputs=P), mean_over_views(cross_entropy), ViewsDataset(X, y),
                      microbatch_size=CHUNK)
    rows = lazy.per_record(theta_at(lazy, 1), FIRST)
    assert "input_grams" not in rows.chunks[0][0].__dict__ and lazy._input_grams.grams is None
    _, _, warm = kept_and_fresh()
    assert warm._input_grams.grams is not None
    copied, pickled = copy.deepcopy(warm)._input_grams, pickle.loads(pickle.dumps(warm._input_grams))
    for other in (copied, pickled):
        assert other.grams is None and other.known is None and torch.equal(other.data, warm.X)


@pytest.mark.parametrize(("T", "p", "q", "dtype", "keeps"), [
    (5, 3969, 10, torch.float32, True),    # augmentation multiplicity's views
    (5, 3969, 10, torch.float64, True),
    (1, 3969, 10, torch.float32, False),   # one position: no Gram matrices
    (9, 3969, 10, torch.float32, True),    # nine views: use_gram alone would take the direct form
    (16, 3969, 10, torch.float32, True),   # T² = 256
    (17, 3969, 10, torch.float32, False),  # T² = 289 > 256
    (9, 3969, 1000, torch.float32, True),
    (5, 8, 1000, torch.float32, False),    # matrices (200 bytes) above the record (160)
    (16, 32, 1, torch.float32, False),     # matrices (2 kB) above a record's weight gradient (2T² ≥ p·q)
])
def test_which_layers_keep_their_matrices(T, p, q, dtype, keeps):
    stage = ghost.Stage("linear", torch.nn.Linear(p, q), "0", (("weight", "w"),))
    layer = ghost.Layer(stage, torch.zeros(2, T, p, dtype=dtype), torch.zeros(2, T, q, dtype=dtype))
    assert grams.kept(layer) is keeps


@pytest.mark.parametrize(("shape", "p", "dtype", "trainable", "keeps"), [
    ((2, 3969), 3969, torch.float32, True, True),       # ScatterNet's features
    ((2, 1, 3969), 3969, torch.float32, True, True),    # one position, as [B, 1, p]
    ((2, 5, 3969), 3969, torch.float32, True, False),   # five views: the Gram matrices instead
    ((2, 1), 1, torch.float32, True, False),            # a record of 4 bytes: its norm (8) would take more
    ((2, 1), 1, torch.float64, True, True),
    ((2, 3969), 3969, torch.float32, False, False),     # a frozen weight: its norm bound reads no input
])
def test_which_layers_keep_their_squared_input_norms(shape, p, dtype, trainable, keeps):
    stage = ghost.Stage("linear", torch.nn.Linear(p, 10), "0", (("weight", "w"),) if trainable else (("bias", "b"),))
    layer = ghost.Layer(stage, torch.zeros(*shape, dtype=dtype), torch.zeros(*shape[:-1], 10, dtype=dtype))
    assert grams.kept_norms(layer) is keeps
