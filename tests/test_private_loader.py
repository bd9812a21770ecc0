"""``dpopt.Private`` with a user's DataLoader: its dataset, ``collate_fn`` and worker processes
load the batches the run's secret sampler draws, and nothing else changes.

The records a step trains on are read back from the batches themselves (each record carries its
index and the id of the process that read it), so the test sees what the worker processes loaded,
not what the main process asked for."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler

import dpopt
from dpopt._validate import DpoptError
from dpopt.algorithms.registry import build
from tests.test_private import Counting

N, DELTA, STEPS = 60, 1e-3, 3
#: DP-SGD, expected batch 20, its noise multiplier as built (1): no calibration, which would take seconds
PLAN = {"algorithm": build("dp-sgd", n=N, batch_size=20), "epsilon": None, "delta": DELTA}


def data() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, 6, generator=gen, dtype=torch.float64)
    return X, (X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 1.0, -1.0], dtype=torch.float64) > 0).long()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def loss(out: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


class Dicts(Dataset):
    """HF-style records: a dict per record, with the record's index and the reading process's id."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"features": self.X[i], "label": self.y[i], "index": i, "pid": os.getpid()}


def collate(records: list[dict[str, Any]]) -> dict[str, Tensor]:
    return {key: torch.stack([r[key] for r in records]) if key in ("features", "label")
            else torch.tensor([r[key] for r in records]) for key in records[0]}


def trained(data: Any, steps: int = STEPS, after_step: Callable[[], None] = lambda: None,
            **kwargs: Any) -> dpopt.Private:
    """A seeded DP-SGD run of ``steps`` steps through torch's SGD; ``after_step`` after each."""
    net = model()
    private = dpopt.Private(net, loss, data, **PLAN, steps=steps,
                            microbatch_size=8, seed=3, **kwargs)
    sgd = torch.optim.SGD(net.parameters(), lr=0.5)
    after_step()  # what construction read is no step's
    for _ in private:
        private.backward()
        sgd.step()
        after_step()
    return private


def test_a_dataloader_of_dicts_with_a_collate_fn_and_two_workers_trains_on_the_samplers_batches():
    """Acceptance: a dict-returning dataset, a custom collate_fn and num_workers=2 train via Private
    with exactly the sampler's batches (those the same seeded run reads without a loader, step by
    step, in chunks of at most microbatch_size), loaded in the worker processes, and the same θ."""
    X, y = data()
    chunks, loaded = [], []

    def split(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        chunks.append((batch["index"].tolist(), set(batch["pid"].tolist())))
        return batch["features"], batch["label"]

    def step_done() -> None:
        loaded.append(list(chunks))
        chunks.clear()

    private = trained(DataLoader(Dicts(X, y), collate_fn=collate, num_workers=2), split=split, after_step=step_done)
    reading = Counting(X, y)
    drawn = []
    reference = trained(reading, after_step=lambda: (drawn.append(list(reading.read)), reading.read.clear()))
    assert [sum((part for part, _ in step), []) for step in loaded[1:]] == drawn[1:]
    assert all(0 < len(part) <= 8 for step in loaded[1:] for part, _ in step)
    assert max(len(step) for step in loaded[1:]) >= 2  # steps of several chunks
    workers = {pid for step in loaded[1:] for _, pids in step for pid in pids}
    assert len(workers) == 2 and os.getpid() not in workers
    assert torch.equal(private.output(), reference.output())
    assert private.ledger.event() == reference.ledger.event()


def test_an_iterable_dataset_is_refused():
    X, y = data()

    class Stream(IterableDataset):
        def __iter__(self):
            return zip(X, y)

    with pytest.raises(DpoptError, match=r"^train_data=DataLoader over Stream, an iterable-style dataset: dpopt draws "
                                         r"each step's records by index .* needs a map-style dataset \(__getitem__ and "
                                         r"__len__\)$"):
        dpopt.Private(model(), loss, DataLoader(Stream(), batch_size=4), **PLAN, steps=STEPS)


def test_the_loaders_batch_size_shuffle_and_drop_last_are_ignored_and_a_sampler_of_its_own_refused():
    """The loader's own batch_size, shuffle and drop_last do not change a seeded run; a sampler or
    batch sampler of one's own, and batch_size=None, are refused with the reason."""
    X, y = data()
    pairs = Counting(X, y)
    ignored = trained(DataLoader(pairs, batch_size=7, shuffle=True, drop_last=True))
    assert torch.equal(ignored.output(), trained((X, y)).output())
    for loader, named in [(DataLoader(pairs, sampler=WeightedRandomSampler(torch.ones(N), N)),
                           "sampler=WeightedRandomSampler"),
                          (DataLoader(pairs, batch_sampler=[[0, 1], [2, 3]]), "batch_sampler=list"),
                          (DataLoader(pairs, batch_size=None), "batch_size=None")]:
        with pytest.raises(DpoptError, match=rf"^train_data=DataLoader with {named}: dpopt draws each step's batch "
                                             r"itself.* \(its batch_size, shuffle and drop_last are ignored\)$"):
            dpopt.Private(model(), loss, loader, **PLAN, steps=STEPS)


def test_a_batch_that_is_not_a_pair_needs_split_and_split_needs_a_loader():
    X, y = data()
    with pytest.raises(DpoptError, match=r"^the DataLoader's batch is a dict, not an \(x, y\) pair: give split="):
        dpopt.Private(model(), loss, DataLoader(Dicts(X, y), collate_fn=collate), **PLAN, steps=3)
    with pytest.raises(DpoptError, match=r"^split\(batch\) of 1 records of train_data must give two tensors \(x, y\) "
                                         r"with one row per record, not \(shape \(1, 6\), int\)"):
        dpopt.Private(model(), loss, DataLoader(Dicts(X, y), collate_fn=collate),
                      split=lambda batch: (batch["features"], 1), **PLAN, steps=3)
    with pytest.raises(DpoptError, match=r"^split= takes \(x, y\) out of a DataLoader's batches, and data is a "
                                         r"tuple: pass DataLoader\(dataset, collate_fn=...\) as data$"):
        dpopt.Private(model(), loss, (X, y), split=lambda batch: batch, **PLAN, steps=3)


@pytest.mark.parametrize("own_steps", [1, 3])
def test_a_run_with_a_loader_resumes_exactly(tmp_path: Path, own_steps: int):
    """Resuming moves the sampling generator. A run one step in (its stream has loaded step 1's
    chunks ahead, and step 2's draw is the checkpoint's) discards the stale chunks; one three steps
    in (past the checkpoint's step 2) restarts its stream from the resumed generator. Both continue
    as the uninterrupted run, loading in the workers."""
    X, y = data()
    pids = []

    def loader() -> DataLoader:
        return DataLoader(Dicts(X, y), collate_fn=collate, num_workers=2)

    def split(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        pids.extend(batch["pid"].tolist())
        return batch["features"], batch["label"]

    def started() -> tuple[dpopt.Private, torch.optim.Optimizer]:
        private = dpopt.Private(model(), loss, loader(), split=split, **PLAN, steps=5, microbatch_size=8, seed=3)
        return private, torch.optim.SGD(private.module.parameters(), lr=0.5)

    whole = trained(loader(), steps=5, split=split)
    first, sgd = started()
    for _ in range(2):
        first.backward()
        sgd.step()
    first.save(tmp_path / "run.ckpt")
    second, _ = started()
    for _ in range(own_steps):
        second.backward()
    second.resume(tmp_path / "run.ckpt")
    second_sgd = torch.optim.SGD(second.module.parameters(), lr=0.5)
    pids.clear()
    for _ in second:
        second.backward()
        second_sgd.step()
    assert torch.equal(second.output(), whole.output())
    assert pids and os.getpid() not in pids


class Lengths(Dataset):
    """Variable-length records: a sequence of 1 to 6 features (a record's length is its own) and a label."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.X[i, : 1 + i % 6].unsqueeze(-1), self.y[i]


def padded(records: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Pads each collated group to its longest record, with a mask column: [B, T, 2] (value, real)."""
    longest = max(len(x) for x, _ in records)
    x = torch.zeros(len(records), longest, 2, dtype=torch.float64)
    for k, (seq, _) in enumerate(records):
        x[k, : len(seq), 0], x[k, : len(seq), 1] = seq[:, 0], 1.0
    return x, torch.stack([label for _, label in records])


class MaskedMean(nn.Module):
    """Mean of a per-position Linear map over the real positions only: blind to the padding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Linear(1, 4).double(), nn.Linear(4, 2).double()

    def forward(self, x: Tensor) -> Tensor:
        mask = x[..., 1:]
        return self.head((torch.tanh(self.embed(x[..., :1])) * mask).sum(1) / mask.sum(1))


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_padding_that_depends_on_the_chunk_does_not_change_a_masked_models_run(engine):
    """A collate_fn that pads each chunk to its longest record: a record's padded length depends on
    the records beside it and on microbatch_size; a module that masks the padding trains the same
    θ whatever the chunks (to rounding)."""
    X, y = data()
    runs = []
    for microbatch_size in (3, 64):
        net = MaskedMean()
        private = dpopt.Private(net, loss, DataLoader(Lengths(X, y), collate_fn=padded), **PLAN, steps=STEPS,
                                microbatch_size=microbatch_size, seed=3, engine=engine)
        sgd = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in private:
            private.backward()
            sgd.step()
        runs.append(private.output())
    assert torch.allclose(runs[0], runs[1], rtol=0, atol=1e-12)
    assert not torch.allclose(runs[0], private.theta0, rtol=0, atol=1e-3)  # it trained


@pytest.mark.parametrize("algorithm", ["dp-bandmf", "dp-adambc-bandmf"])
def test_a_banded_run_loads_its_keyed_batches_through_the_workers(algorithm):
    """dp-bandmf draws each step's batch from the groups of a secret key kept in its state (cyclic
    Poisson sampling); the workers load the batches of that keyed sampler (the draws ahead are the
    run's own), so a run with num_workers=1 is the run without workers, bit for bit, θ and ε."""
    X, y = data()
    pids = []

    def split(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        pids.extend(batch["pid"].tolist())
        return batch["features"], batch["label"]

    banded = build("dp-bandmf", n=N, batch_size=10, bands=4)
    if algorithm == "dp-adambc-bandmf":  # DP-AdamBC around it hands its inner algorithm's keyed sampler on
        banded = build("dp-bandmf", n=N, batch_size=10, bands=4, optimizer="adambc", lr=0.01)
    runs = []
    for workers in (0, 1):
        net = model()
        private = dpopt.Private(net, loss, DataLoader(Dicts(X, y), collate_fn=collate, num_workers=workers),
                                split=split, algorithm=banded, epsilon=None, delta=DELTA, steps=6,
                                microbatch_size=8, seed=3)
        pids.clear()  # (construction reads a record to check split: no step's)
        sgd = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in private:
            private.backward()
            sgd.step()
        runs.append((private.output(), private.epsilon(), set(pids)))
    (plain, plain_epsilon, plain_pids), (loaded, loaded_epsilon, loaded_pids) = runs
    assert torch.equal(loaded, plain) and not torch.equal(plain, private.theta0)
    assert loaded_epsilon == plain_epsilon
    assert plain_pids == {os.getpid()} and os.getpid() not in loaded_pids  # the worker loaded the batches
