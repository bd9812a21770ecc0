"""A first Linear layer whose input, the records themselves, is read in place block by block
(``ghost.in_place``, ``ghost.in_place.InPlace``: augmentation multiplicity's views).

Small records (300 of 5 views), chunks of 37 records (the batch is not a multiple) read in blocks
of 5 records (the chunk is not a multiple either), a sorted Poisson-like batch with records of
weight 0, one of them NaN:

* float64: norms and weighted sums equal the vmap engine's per-record gradients to 1e−10, and so
  do those of the difference at two points (DP-SRM), itself a layer read in place.
* float32: each norm is at least the norm of what the sum adds for that record (its sum alone,
  computed as the batch's is), and within 1e−5 of the vmap engine's, at a point and for a difference.
* Given the same output gradients, the norms are those of the layer of the gathered chunk, bit
  for bit; the input Gram matrices formed in the first epoch are ``record_grams`` of the records,
  bit for bit, kept by record and looked up at a later step.
* Mutants caught: a sum that adds a block of records twice (both measurements), a bound without
  its rounding terms (float32: a record would add more than its norm).
* A sum asked of records changed in place since their norms were taken is refused; the layer is
  read in place only where it takes the records themselves, as tensors in its dtype.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpopt import _validate
from dpopt.augmentation import mean_over_views
from dpopt.models import cross_entropy, make_model
from dpopt.oracles import TorchModel, ghost
from dpopt.oracles.ghost import in_place, rounding
from test_ghost_input_grams import ViewsDataset  # a Dataset of the views (tests/ is on sys.path)

N, VIEWS, CHUNK, BLOCK = 300, 5, 37, 5
F64 = torch.float64
#: (dtype, p, q): both take the Gram form with their input Gram matrices kept.
SHAPES = {F64: (50, 3), torch.float32: (300, 10)}
NAN_RECORD = 7  # in the batch, with weight 0


def views(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = SHAPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(N, VIEWS, p, generator=gen, dtype=F64).to(dtype)
    return X, torch.randint(0, q, (N,), generator=gen)


def oracle(X: torch.Tensor, y: torch.Tensor, engine: str = "ghost", bias: bool = True) -> TorchModel:
    p, q = SHAPES[X.dtype]
    model = make_model("linear", seed=0, inputs=p, outputs=q) if bias else nn.Sequential(nn.Linear(p, q, bias=False))
    return TorchModel(model.to(X.dtype), mean_over_views(cross_entropy), X, y, microbatch_size=CHUNK, engine=engine)


def batch(seed: int = 1) -> torch.Tensor:
    """A Poisson-like batch (each record with probability 0.6, sorted), with the NaN record."""
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.rand(N, generator=gen) < 0.6
    chosen[NAN_RECORD] = True
    return chosen.nonzero().squeeze(1)


def theta_at(model: TorchModel, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.flat_params().double() + 0.3 * torch.randn(model.dim, generator=gen, dtype=F64)


def weights(indices: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """Clip weights for C = 0.5, zero for every fifth record and for the NaN record."""
    w = torch.minimum(torch.ones(len(indices), dtype=F64), 0.5 / norms)
    w[::5] = 0
    w[indices == NAN_RECORD] = 0
    return w


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 5 records, so chunks of 37 are read in 8 blocks, the last partial."""
    monkeypatch.setattr(in_place, "block_records", lambda X: BLOCK)


def with_nan(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = views(dtype)
    X[NAN_RECORD, 2, 3] = float("nan")
    return X, y


def reference(X: torch.Tensor, y: torch.Tensor, theta: torch.Tensor, indices: torch.Tensor,
              bias: bool = True) -> torch.Tensor:
    """The records' gradients by the vmap engine, ``[B, d]`` in float64."""
    vmapped = oracle(X, y, engine="vmap", bias=bias).per_record(theta, indices)
    return vmapped.rows.double()


def test_the_layer_reads_the_records_in_place():
    X, y = with_nan(F64)
    model = oracle(X, y)
    rows = model.per_record(theta_at(model, 2), batch())
    assert all(isinstance(chunk[0], in_place.InPlace) for chunk in rows.chunks)
    assert rows.sizes == tuple(len(part) for part in batch().split(CHUNK)) and rows.sizes[-1] % CHUNK


def float64_agrees(X: torch.Tensor, y: torch.Tensor) -> bool:
    """Norms and weighted sum (records of weight 0 left out, the NaN one among them) equal the vmap
    engine's to 1e−10, for one point and for the difference of two."""
    model, indices = oracle(X, y), batch()
    ok = True
    for got, want in ((model.per_record(theta_at(model, 2), indices),
                       reference(X, y, theta_at(model, 2), indices)),
                      (model.per_record(theta_at(model, 2), indices) - model.per_record(theta_at(model, 3), indices),
                       reference(X, y, theta_at(model, 2), indices) - reference(X, y, theta_at(model, 3), indices))):
        norms, finite = got.norms(), indices != NAN_RECORD
        ok &= bool(torch.allclose(norms[finite], want[finite].norm(dim=1), rtol=1e-10, atol=0))
        ok &= bool(torch.isnan(norms[~finite]).all())
        w = weights(indices, norms)
        kept = w != 0
        ok &= bool(torch.allclose(got.weighted_sum(w), w[kept] @ want[kept], rtol=1e-10, atol=1e-13))
        assert all(isinstance(chunk[0], in_place.InPlace) for chunk in got.chunks)
    return ok


def test_float64_norms_and_sums_equal_the_vmap_engine_at_a_point_and_for_a_difference():
    assert float64_agrees(*with_nan(F64))


def contributions(rows: ghost.GhostRows, size: int) -> torch.Tensor:
    """What the sum adds for each record per unit weight, each record's sum computed alone (the
    others weighted 0, so left out) in float32 as the batch's: its norms, float64."""
    norms = []
    for i in range(size):
        w = torch.zeros(size, dtype=F64)
        w[i] = 1
        norms.append(rows.weighted_sum(w).double().norm())
    return torch.stack(norms)


def float32_verdict(X: torch.Tensor, y: torch.Tensor, bias: bool = True, difference: bool = False) -> bool:
    """Every norm covers what the sum adds for its record (a bound of the norm of what is computed,
    from the output gradients computed), and is within 1e−5 of the vmap engine's norm; at one point,
    or for the difference of two (DP-SRM)."""
    model, indices = oracle(X, y, bias=bias), batch()[:120]  # (four chunks: one weighted sum per record)
    theta, other = theta_at(model, 2), theta_at(model, 3)
    rows = model.per_record(theta, indices)
    want = reference(X, y, theta, indices, bias)
    if difference:
        rows, want = rows - model.per_record(other, indices), want - reference(X, y, other, indices, bias)
    norms, vmapped = rows.norms(), want.norm(dim=1)
    return bool((norms >= contributions(rows, len(indices))).all()
                and ((norms - vmapped).abs() <= 1e-5 * vmapped).all())


@pytest.mark.parametrize(("bias", "difference"), [(True, False), (False, False), (True, True)])
def test_float32_norms_cover_what_the_sum_adds_for_each_record(bias, difference):
    assert float32_verdict(*views(torch.float32), bias, difference)


def test_the_norms_are_those_of_the_gathered_chunk_bit_for_bit():
    """Each chunk's layer from the gathered path, given as a layer read in place with the same
    output gradients and input Gram matrices: the same squared bounds, bit for bit; the two paths'
    matrices are the same bits, and their norms agree to the rounding of the forward."""
    for dtype in (F64, torch.float32):
        X, y = views(dtype)
        model, gathered = oracle(X, y), oracle(X, y)
        theta, indices = theta_at(model, 2), batch()
        rows = model.per_record(theta, indices)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ghost, "reads_in_place", lambda *args: False)
            old = gathered.per_record(theta, indices)
        for (mine,), (theirs,) in zip(rows.chunks, old.chunks):
            assert isinstance(theirs, ghost.Layer) and isinstance(mine, in_place.InPlace)
            assert torch.equal(mine.input_grams, theirs.__dict__["input_grams"])
            same_g = mine.layer(mine.stage, theirs.g)
            assert torch.equal(same_g.sq_bounds(), theirs.sq_bounds())
        torch.testing.assert_close(rows.norms(), old.norms(), rtol=1e-12 if dtype == F64 else 1e-5, atol=0)


def test_the_first_epochs_input_grams_are_the_records_grams_bit_for_bit():
    X, y = views(torch.float32)
    model, indices = oracle(X, y), batch()
    rows = model.per_record(theta_at(model, 2), indices)
    want = rounding.record_grams(X[indices])
    assert torch.equal(torch.cat([chunk[0].input_grams for chunk in rows.chunks]), want)
    kept = model._input_grams
    assert torch.equal(kept.known, torch.isin(torch.arange(N), indices)) and torch.equal(kept.grams[indices], want)
    alone = torch.stack([rounding.record_grams(X[i:i + 1])[0] for i in indices[:40]])
    assert torch.equal(want[:40], alone)
    again = model.per_record(theta_at(model, 3), indices[1::2])  # all kept: looked up, not formed
    assert torch.equal(torch.cat([chunk[0].input_grams for chunk in again.chunks]), want[1::2])


add_blocks = in_place.add_blocks


def adds_the_last_block_twice(grad, gw, records, rows):  # noqa: ANN001, ANN201 - a mutant of in_place.add_blocks
    """Mutant: the sum adds the records of its last block twice."""
    add_blocks(grad, gw, records, rows)
    last = (len(rows) - 1) // BLOCK * BLOCK
    add_blocks(grad, gw[last:], records, rows[last:])


def without_rounding(pairs, B, groups, T, dtype, inputs=None):  # noqa: ANN001, ANN201 - a mutant of gram_bounds
    """Mutant: the Gram norm alone, without the rounding of the products that form the sum."""
    return rounding.gram_sq_norms(pairs, inputs)[0].view(B, groups).sum(1).sqrt()


def test_a_sum_that_adds_records_twice_is_caught(monkeypatch):
    monkeypatch.setattr(in_place, "add_blocks", adds_the_last_block_twice)
    assert not float64_agrees(*with_nan(F64))
    assert not float32_verdict(*views(torch.float32))


def test_a_bound_without_its_rounding_is_caught(monkeypatch):
    """(On a layer without bias: a bias's bound is enlarged by its own rounding, which may cover the weight's.)"""
    monkeypatch.setattr(in_place, "gram_bounds", without_rounding)
    assert not float32_verdict(*views(torch.float32), bias=False)


def test_a_sum_of_records_changed_since_their_norms_is_refused():
    X, y = views(F64)
    model, indices = oracle(X, y), batch()
    rows = model.per_record(theta_at(model, 2), indices)
    w = weights(indices, rows.norms())
    X[3].mul_(2.0)
    with pytest.raises(_validate.DpoptError, match="modified in place"):
        rows.weighted_sum(w)


def test_only_records_held_as_tensors_of_the_layers_dtype_are_read_in_place():
    X, y = views(torch.float32)
    model = oracle(X, y)
    assert ghost.reads_in_place(model.stages, model.records, model.dtype, model.device)
    for other in (TorchModel(model.module, model.loss_fn, ViewsDataset(X, y)),  # a Dataset
                  TorchModel(model.module, model.loss_fn, X.double(), y),      # another dtype: cast by chunk
                  TorchModel(model.module, model.loss_fn, X.transpose(0, 1).contiguous().transpose(0, 1), y),
                  TorchModel(model.module, model.loss_fn, X[:, :1], y)):       # one position: no Gram form
        assert not ghost.reads_in_place(other.stages, other.records, other.dtype, other.device)
        rows = other.per_record(theta_at(other, 2), batch())
        assert not isinstance(rows.chunks[0][0], in_place.InPlace)


def test_an_in_place_activation_after_the_layer_is_refused_as_for_a_gathered_chunk():
    """The layer's output is the tap: a later ReLU(inplace=True) overwriting it is refused with the
    message of the gathered path (naming dpopt.fix), not with autograd's error about a leaf."""
    X, y = views(F64)
    p, q = SHAPES[F64]
    model = nn.Sequential(nn.Linear(p, q), nn.ReLU(inplace=True), nn.Linear(q, q)).double()
    ghosted = TorchModel(model, mean_over_views(cross_entropy), X, y, microbatch_size=CHUNK)
    assert ghost.reads_in_place(ghosted.stages, ghosted.records, F64, torch.device("cpu"))
    with pytest.raises(_validate.DpoptError, match=r"the output of layer '0' \(Linear\) is overwritten in place by "
                                                   r"a later module .*dpopt.fix\(model\)"):
        ghosted.per_record(ghosted.flat_params(), batch())
