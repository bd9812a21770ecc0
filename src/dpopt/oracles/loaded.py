"""Records read through a user's ``torch.utils.data.DataLoader``: its dataset, ``collate_fn`` and
worker processes, loading the batches dpopt draws.

``Loaded(loader, split, microbatch_size)`` is :class:`~dpopt.oracles.records.Records` (what
:class:`~dpopt.oracles.TorchModel` reads): ``gather(part)`` returns ``split(collate_fn([dataset[i]
for i in part]))``, a pair ``(x, y)`` of tensors with one row per record of ``part``, in its order.

**What is taken from the loader, and what is not.** Taken: ``dataset``, ``collate_fn``,
``num_workers``, ``prefetch_factor``, ``pin_memory`` and ``pin_memory_device``, ``timeout``,
``worker_init_fn``, ``multiprocessing_context`` and ``generator`` (it seeds the workers, as torch
does: the data's own randomness, such as augmentation, never the sampling's). Ignored:
``batch_size``, ``shuffle`` and ``drop_last`` (the batches are the ones the run's secret sampler
draws: Poisson or otherwise, of the expected size the run is calibrated for), ``persistent_workers``
(the workers serve the whole run: one pass over its batches) and ``in_order`` (batches always come
in order). Refused: an iterable-style dataset (no ``__getitem__``/``__len__``: its records cannot be
drawn by index, and the accounting assumes each record is drawn independently, by index, from a
secret generator), a ``sampler`` or ``batch_sampler`` of one's own (a choice of records that the
private sampler would silently override), and ``batch_size=None`` (``collate_fn`` then takes one
record, not a list).

**The batch.** ``split(batch) -> (x, y)``: the module is run on ``x`` and the loss on its output
and ``y`` (default: the batch is the pair ``(x, y)``, as torch's default collation of ``(x, y)``
records gives; a dict of an HF-style dataset needs e.g. ``split=lambda b: (b["input_ids"],
b["label"])``). Both must be tensors with a first dimension of one row per record: the engines run
the module and the loss on each row alone where a record's gradient is computed.

**Chunks and padding.** A step's batch is read in the chunks the oracle computes on at once (at
most ``microbatch_size`` records, in the order drawn): each chunk is one loader batch, collated on
its own, so ``microbatch_size`` bounds what is collated and held at once, as it bounds the
computation. A ``collate_fn`` that pads variable-length records pads each chunk to its longest
record: a record's padded length depends on which records share its chunk (and on
``microbatch_size``). So the module and the loss must ignore the padding (an attention mask, a
masked mean, ``ignore_index``): a per-record loss that read the padding would let one record (its
length) move another's clipped gradient, and clipping would no longer bound a record's influence.
``pads`` (true unless ``collate_fn`` is torch's default, which stacks records of one shape) says
the chunks may be padded: ``dpopt.nn``'s recurrent layers then refuse to run without ``lengths=``
(:func:`~dpopt.oracles.records.may_be_padded`). Beyond padding, ``collate_fn`` must build each
record's rows from that record alone (no statistic of the batch, such as normalising by the batch
mean).

**Prefetching, and why the draws ahead are the run's own.** Step t's indices B_t are drawn by the
run from its secret sampling generator (the step's sampler, :func:`dpopt.train.batch_sampler`), at the step,
exactly as without a loader: same draws, same order, so the generator's state (and a checkpoint of
it) is unchanged and a seeded run has the same batches with or without a loader. The loader's
batch sampler draws the same index sets ahead, from a *copy* of that generator taken before step t:
B_t, B_{t+1}, … Each depends only on t, n and the generator's state after the previous draw — on
nothing step t releases (Poisson, fixed-size and full-data samplers are functions of the generator
alone; cyclic Poisson sampling's also of the secret group key the algorithm drew into its state at
``init``, the same at every step: ``draw`` is the run's keyed sampler, never the keyless one, which
refuses to draw) — so drawing B_{t+1} before step t's release is the draw the run will make, and the
workers load chunks of the next steps while the current one computes. A chunk is taken from the loader
only if it is exactly the part the step asks for; anything else (a full pass, a diagnostic sample,
a step whose draw was not foreseen, e.g. after a resume, until the stream restarts from the
generator's new state) is read directly in this process. Either way the records returned are the
ones asked for; a chunk loaded ahead and not asked for is discarded, never used.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sized
from typing import cast

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data import default_collate

from .. import _validate
from .records import chunked_digest

#: The loader settings taken (how records are loaded), by DataLoader's own argument names.
TAKEN = ("num_workers", "prefetch_factor", "pin_memory", "pin_memory_device", "timeout", "worker_init_fn",
         "multiprocessing_context", "generator")

#: Draws step t's indices from a generator: ``dpopt.train.batch_sampler(algorithm, state, t, n, …).sample(gen)``.
Draw = Callable[[int, torch.Generator], Tensor]


def pair(batch: object) -> tuple[object, object]:
    """The default ``split``: the batch is the pair ``(x, y)``."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise _validate.DpoptError(
            f"the DataLoader's batch is a {type(batch).__name__}, not an (x, y) pair: give split=, a function from "
            "a batch to (x, y) (the module's input and the loss's target), e.g. split=lambda batch: "
            "(batch['input'], batch['label'])")
    return batch[0], batch[1]


class Ahead:
    """The loader's batch sampler: the chunks of steps ``t0 … steps − 1`` of at most ``size``
    records, their indices drawn by ``draw`` from a copy of the sampling generator in its state
    ``state`` before step ``t0``'s draw (the copy is this object's own)."""

    def __init__(self, t0: int, state: Tensor, draw: Draw, steps: int, size: int) -> None:
        self.gen = torch.Generator()
        self.gen.set_state(state)
        self.next_t, self.draw, self.steps, self.size = t0, draw, steps, size
        self.before: dict[int, Tensor] = {}  # the copy's state before each step's draw, until the step is done
        self.handed: deque[tuple[int, Tensor]] = deque()  # (step, chunk) handed to the loader, not yet taken
        self.done_through = t0 - 1  # chunks of steps up to this one are no longer handed

    def __iter__(self) -> Iterator[list[int]]:
        while self.next_t < self.steps:
            t = self.next_t
            self.before[t] = self.gen.get_state()
            indices = self.draw(t, self.gen)
            self.next_t += 1
            for part in indices.split(self.size) if len(indices) else ():
                if t <= self.done_through:
                    break
                self.handed.append((t, part))
                yield part.tolist()

    def state_before(self, t: int) -> Tensor | None:
        """The copy's state before step t's draw, if the stream draws step t (None if not)."""
        return self.gen.get_state() if t == self.next_t else self.before.get(t)


class Loaded:
    """The records of a map-style dataset, read through ``loader``'s ``collate_fn`` and workers;
    ``split`` makes ``(x, y)`` of a batch (None: the batch is that pair); ``microbatch_size``: the
    records the oracle reads at once (the chunks loaded ahead)."""

    def __init__(self, loader: DataLoader[object], split: Callable[..., tuple[Tensor, Tensor]] | None,
                 microbatch_size: int, name: str = "train_data") -> None:
        dataset = loader.dataset
        if isinstance(dataset, IterableDataset) or not all(hasattr(dataset, a) for a in ("__getitem__", "__len__")):
            raise _validate.DpoptError(
                f"{name}=DataLoader over {type(dataset).__name__}, an iterable-style dataset: dpopt draws each step's "
                "records by index from a secret generator (the sampling the privacy accounting assumes), so it needs "
                "a map-style dataset (__getitem__ and __len__)")
        own = [f"{key}={type(value).__name__}" for key, value, default in [
            ("sampler", loader.sampler, (SequentialSampler, RandomSampler)),
            ("batch_sampler", loader.batch_sampler, (BatchSampler, type(None)))] if type(value) not in default]
        if own or loader.batch_size is None:
            raise _validate.DpoptError(
                f"{name}=DataLoader with {', '.join(own) or 'batch_size=None'}: dpopt draws each step's batch itself, "
                "from a secret generator (the sampling the privacy accounting assumes), and loads it through the "
                "loader's dataset, collate_fn and workers; build the loader without a sampler or batch_sampler of your "
                "own (its batch_size, shuffle and drop_last are ignored)")
        if len(cast(Sized, dataset)) == 0:  # (map-style: checked above)
            raise _validate.DpoptError(f"{name} is empty")
        self.dataset, self.collate_fn, self.name = dataset, loader.collate_fn, name
        self.pads = self.collate_fn is not default_collate  # (torch's default stacks: one shape, no padding)
        self.split: Callable[..., tuple[object, object]] = split or pair
        self.size = microbatch_size
        self.settings = {key: getattr(loader, key) for key in TAKEN}
        self._ahead: Ahead | None = None
        self._batches: Iterator[object] | None = None
        self._taking: int | None = None  # the step being taken
        self._pair(self.collate_fn([dataset[0]]), 1)  # a bad split or collate_fn, refused now

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))

    def _pair(self, batch: object, count: int) -> tuple[Tensor, Tensor]:
        x, y = self.split(batch)
        if not (isinstance(x, Tensor) and isinstance(y, Tensor) and x.ndim and y.ndim and len(x) == len(y) == count):
            raise _validate.DpoptError(
                f"split(batch) of {count} records of {self.name} must give two tensors (x, y) with one row per record, "
                f"not ({_described(x)}, {_described(y)}): the module runs on x and the loss on its output and y, each "
                "record's row alone where its gradient is computed")
        return x, y

    def gather(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        ahead = self._ahead
        if (ahead is not None and self._batches is not None and self._taking is not None and ahead.handed
                and ahead.handed[0][0] == self._taking and torch.equal(ahead.handed[0][1], indices)):
            ahead.handed.popleft()
            return self._pair(next(self._batches), len(indices))
        return self._pair(self.collate_fn([self.dataset[i] for i in indices.tolist()]), len(indices))

    def chunks(self, size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """All records in order, ``size`` at a time, through the loader's workers."""
        loader = DataLoader(self.dataset, batch_size=size, collate_fn=self.collate_fn, **self.settings)
        for start, batch in zip(range(0, len(self), size), loader):
            yield self._pair(batch, min(size, len(self) - start))

    def digest(self) -> str:
        return chunked_digest(self)

    @contextlib.contextmanager
    def step(self, t: int, gen: torch.Generator, draw: Draw, steps: int) -> Iterator[None]:
        """Step t of ``steps``, about to draw its batch from ``gen`` with ``draw``: its chunks come
        from the loader, loaded ahead, if the stream of chunks foresaw this draw (the same step at
        the same generator state; chunks of earlier steps still loaded ahead are discarded), else
        the stream restarts here (without workers, nothing is loaded ahead: every chunk is read
        when asked for). On exit the chunks of step t it did not ask for are discarded."""
        if self.settings["num_workers"] and self.settings["prefetch_factor"]:
            expected = None if self._ahead is None else self._ahead.state_before(t)
            if expected is None or not torch.equal(expected, gen.get_state()):
                self._restart(t, gen.get_state(), draw, steps)
            assert self._ahead is not None  # (restarted above if there was none)
            self._ahead.draw = draw  # the steps ahead are drawn as this one is (its state's key: the run's)
            self._discard_through(t - 1)
        self._taking = t
        try:
            yield
        finally:
            self._taking = None
            if self._ahead is not None:
                self._discard_through(t)

    def _restart(self, t: int, state: Tensor, draw: Draw, steps: int) -> None:
        self._close()
        self._ahead = Ahead(t, state, draw, steps, self.size)
        self._batches = iter(DataLoader(self.dataset, batch_sampler=self._ahead, collate_fn=self.collate_fn,
                                        **self.settings))

    def _discard_through(self, t: int) -> None:
        """Steps up to t are done: discard their chunks not asked for; close the stream at its end."""
        ahead, batches = self._ahead, self._batches
        assert ahead is not None and batches is not None  # called while a stream is open
        ahead.done_through = max(ahead.done_through, t)
        while ahead.handed and ahead.handed[0][0] <= t:
            ahead.handed.popleft()
            next(batches)
        ahead.before = {s: state for s, state in ahead.before.items() if s > t}
        if ahead.next_t >= ahead.steps and not ahead.handed:
            self._close()

    def _close(self) -> None:
        """Drop the stream: its loader's workers shut down with its iterator."""
        self._ahead, self._batches = None, None


def _described(value: object) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
