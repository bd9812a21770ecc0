"""Gathered records written into reused buffers (``records.Tensors.gather``, ``records.Buffers``).

* A gather gives the same tensor as a fresh ``X[indices]`` (values, dtype, shape, layout), and a
  DP-SGD run of the views' layer gives the same θ, bit for bit, as with fresh gathers.
* Steps that keep the per-record results of the last two calls (as ``TorchModel`` does) write
  their chunks into memory already mapped: no page faults once three steps' buffers exist (fresh
  gathers, in a fresh process, fault on every page of every chunk: about 19,400 faults a step here;
  how many depends on the allocator's history, so only the buffers' count is asserted).
* A buffer is never written while a chunk, a view of it, an autograd graph or per-record results
  computed from it are alive: held chunks and the norms and sums of held results keep their
  values. A mutant that reuses every buffer (``unshared`` always true) is caught by the same
  measurements.

The views' layer reads its records in place (``ghost.in_place``), gathering no chunk for its
per-record gradients: the tests of gathered chunks make it take them gathered, as other layers do.
"""

from __future__ import annotations

import copy
import pickle
import resource
import sys

import pytest
import torch

from dpopt.algorithms import DPSGD
from dpopt.augmentation import mean_over_views
from dpopt.models import cross_entropy, make_model
from dpopt.oracles import TorchModel, ghost, records

VIEWS, FEATURES = 5, 3969


def views_data(n: int = 384, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, VIEWS, FEATURES, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def fresh_gather(self: records.Tensors, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather before buffers: a new tensor for each chunk."""
    return self.X[indices], self.y[indices]


def reuse_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every kept buffer counts as free, whoever still reads it."""
    monkeypatch.setattr(records, "unshared", lambda buffer: True)


def test_a_gather_equals_the_fresh_gather():
    X, y = views_data(64)
    data = records.Tensors(X, y)
    for indices in (torch.tensor([5, 1, 63, 5]), torch.arange(0, 64, 3), torch.tensor([], dtype=torch.long)):
        x, labels = data.gather(indices)
        assert torch.equal(x, X[indices]) and x.stride() == X[indices].stride() and x.dtype == X.dtype
        assert torch.equal(labels, y[indices])
    strided = X.transpose(1, 2)  # not contiguous: gathered as before, in X[indices]'s own layout
    x, _ = records.Tensors(strided, y).gather(torch.tensor([3, 2]))
    assert torch.equal(x, strided[[3, 2]]) and x.stride() == strided[[3, 2]].stride()


def test_a_copy_of_the_records_starts_without_buffers():
    X, y = views_data(8)
    data = records.Tensors(X, y)
    chunk = data.gather(torch.tensor([1, 2]))[0]
    for copied in (copy.deepcopy(data), pickle.loads(pickle.dumps(data))):
        assert copied.buffers.kept == [] and copied.buffers.lock is not data.buffers.lock
        assert torch.equal(copied.gather(torch.tensor([2, 1]))[0], X[[2, 1]])
    assert torch.equal(chunk, X[[1, 2]])


def step_faults(data: records.Tensors, steps: int) -> list[int]:
    """Minor page faults of each step's gathers: 1,000 of 1,024 records in chunks of 128, the chunks
    of the last two steps kept alive (as ``TorchModel`` keeps its last two per-record results)."""
    gen, held, faults = torch.Generator().manual_seed(0), [], []
    for _ in range(steps):
        indices = torch.randperm(len(data), generator=gen)[:1000].sort().values
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        chunks = [data.gather(part)[0] for part in indices.split(128)]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        held = [chunks, *held[:1]]
    return faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="minor page faults as Linux counts them")
def test_steps_gather_into_mapped_memory_without_page_faults():
    X, y = views_data(1024)
    faults = step_faults(records.Tensors(X, y), 5)
    assert max(faults[3:]) < 200, faults  # measured: 0; before buffers ~19,400 a step (81 MB, in a fresh process)


def test_a_chunk_or_view_still_alive_is_never_overwritten():
    X, y = views_data(64)
    data = records.Tensors(X, y)
    first = torch.tensor([1, 2, 3])
    chunk = data.gather(first)[0]
    view = data.gather(first)[0].reshape(3, -1)[:, 7:]  # only a view of its chunk is kept
    w = torch.ones(FEATURES, 1, requires_grad=True)
    graph = data.gather(first)[0] @ w  # only the autograd graph keeps its chunk
    for part in torch.arange(4, 64).split(3):
        data.gather(part)
    assert torch.equal(chunk, X[first]) and torch.equal(view, X[first].reshape(3, -1)[:, 7:])
    (grad,) = torch.autograd.grad(graph.sum(), w)
    (want,) = torch.autograd.grad((X[first].clone() @ w).sum(), w)  # the same products on a copy: the same bits
    assert torch.equal(grad, want)
    del chunk, view, graph
    again = data.gather(first)[0]  # everything released: a kept buffer, not a new one
    assert any(again.data_ptr() == kept.data_ptr() for kept in data.buffers.kept)


def test_a_chunk_still_alive_is_never_overwritten_catches_reusing_every_buffer(monkeypatch):
    reuse_always(monkeypatch)
    X, y = views_data(64)
    data = records.Tensors(X, y)
    chunk = data.gather(torch.tensor([1, 2, 3]))[0]
    data.gather(torch.tensor([9, 8, 7]))
    assert not torch.equal(chunk, X[[1, 2, 3]])


def held_results_agree(X: torch.Tensor, y: torch.Tensor) -> bool:
    """Per-record results of a first batch, their norms and sum taken only after two later batches
    were gathered (and the results dropped from the oracle's own cache), against a fresh oracle's."""
    def oracle() -> TorchModel:
        return TorchModel(make_model("linear", seed=0, inputs=FEATURES), mean_over_views(cross_entropy), X, y,
                          microbatch_size=32)

    model, batch = oracle(), torch.arange(0, 96, 2)
    theta = model.flat_params().double()
    held = model.per_record(theta, batch)
    for start in (1, 97):
        model.per_record(theta, torch.arange(start, start + 96))
    norms = held.norms()
    weights = torch.minimum(torch.ones(len(batch), dtype=torch.float64), 0.1 / norms)
    reference = oracle().per_record(theta, batch)
    return bool(torch.equal(norms, reference.norms()) and
                torch.equal(held.weighted_sum(weights), reference.weighted_sum(weights)))


@pytest.mark.parametrize("in_place", [True, False])
def test_held_per_record_results_keep_their_records(monkeypatch, in_place):
    """Also with the records read in place (``ghost.in_place``: results hold no buffer, their sum
    takes one when it reads the records again)."""
    if not in_place:
        gathered(monkeypatch)
    assert held_results_agree(*views_data(256))


def gathered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The views' layer takes its chunk gathered (as a layer not reading the records in place does)."""
    monkeypatch.setattr(ghost, "reads_in_place", lambda *args: False)


def test_held_per_record_results_keep_their_records_catches_reusing_every_buffer(monkeypatch):
    """(The gathered chunks: the results of a layer reading the records in place hold no buffer.)"""
    gathered(monkeypatch)
    reuse_always(monkeypatch)
    assert not held_results_agree(*views_data(256))


def test_a_dp_sgd_run_gives_the_theta_of_fresh_gathers(monkeypatch):
    """Five DP-SGD steps of the views' layer (Poisson batches, chunks of 32, the last one partial)
    with buffers and with fresh gathers: the same θ and losses, bit for bit (its chunks gathered,
    not read in place)."""
    from dpopt import train
    from dpopt.accounting import Ledger
    from dpopt.mechanisms import SeededNoise

    gathered(monkeypatch)
    X, y = views_data(256)
    dpsgd = DPSGD(lr=8.0, clip=0.1, noise_multiplier=1.0, batch_size=200)

    def run() -> tuple[torch.Tensor, list[float]]:
        oracle = TorchModel(make_model("linear", seed=0, inputs=FEATURES), mean_over_views(cross_entropy), X, y,
                            microbatch_size=32)
        gens, ledger = (torch.Generator().manual_seed(0), SeededNoise(1)), Ledger(dpsgd.relation())
        state, losses = dpsgd.init(oracle.flat_params().double(), 100, gens[0]), []
        for t in range(5):
            state, _ = train.step(dpsgd, oracle, state, t, ledger, *gens, keyed=train.keyed(dpsgd))
            losses.append(float(oracle.loss(state.theta, torch.arange(256))))
        return state.theta, losses

    theta, losses = run()
    monkeypatch.setattr(records.Tensors, "gather", fresh_gather)
    before, losses_before = run()
    assert torch.equal(theta, before) and losses == losses_before
