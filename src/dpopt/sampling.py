"""Samplers: which records a step sees, and the amplification that buys.

``sampler.wrap(event)`` is the only place amplification by sampling enters the accounting:
a mechanism run on the sampled batch returns its event, and the sampler wraps it. Each
sampler also states the neighbouring relation its guarantee is under and the public constant
a noised sum is divided by (``expected_size``: never the realised, private, batch size).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import dp_accounting as dpa
import torch
from dp_accounting import NeighboringRelation
from torch import Tensor

from . import _validate


@dataclass(frozen=True)
class FullBatch:
    """Every record, every step. Replace-one adjacency (n is public); no amplification."""

    n: int

    relation = NeighboringRelation.REPLACE_ONE

    @property
    def expected_size(self) -> float:
        return float(self.n)

    @classmethod
    @functools.lru_cache(maxsize=64)  # samplers are immutable: one per configuration
    def of(cls, n: int, batch_size: int) -> FullBatch:
        """All n records (``batch_size`` is ignored)."""
        return cls(n)

    def sample(self, gen: torch.Generator) -> Tensor:
        return torch.arange(self.n)

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return event


@dataclass(frozen=True)
class Poisson:
    """Each record independently with probability ``rate`` (add/remove-one adjacency).

    The batch size is random and private; sums are divided by the public ``rate · n``.
    An empty batch is a valid outcome: the step still releases noise and is still accounted.
    Event: ``PoissonSampledDpEvent(rate, event)``.
    """

    n: int
    rate: float

    relation = NeighboringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        _validate.unit_interval("sampling_rate", self.rate)

    @classmethod
    @functools.lru_cache(maxsize=64)
    def of(cls, n: int, batch_size: int) -> Poisson:
        """Rate ``batch_size / n`` (the expected batch size is ``batch_size``)."""
        _validate.positive_int("batch_size", batch_size, maximum=n, maximum_name="n")
        return cls(n, batch_size / n)

    @property
    def expected_size(self) -> float:
        return self.rate * self.n

    def sample(self, gen: torch.Generator) -> Tensor:
        """Sorted indices of the selected records, in O(expected batch size).

        The gaps between consecutive selected records of a Bernoulli(q) sequence are i.i.d.
        Geometric(q) (trials up to and including the next success), so the cumulative sums of
        Geometric(q) draws that fall below n are exactly a Poisson sample.
        """
        if self.rate == 1:
            return torch.arange(self.n)
        expected = self.rate * self.n
        chunk = int(expected + 6 * math.sqrt(expected) + 16)
        parts, last = [], -1
        while True:
            positions = torch.empty(chunk, dtype=torch.int64).geometric_(self.rate, generator=gen).cumsum_(0)
            positions += last
            inside = int(torch.searchsorted(positions, self.n))  # positions are increasing
            parts.append(positions[:inside])
            if inside < chunk:
                break
            last = int(positions[-1])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return dpa.PoissonSampledDpEvent(self.rate, event)


@functools.lru_cache(maxsize=8)
def _groups(n: int, bands: int, key: int) -> tuple[Tensor, ...]:
    """Group g's sorted record indices, g < ``bands``: each record's group drawn independently and
    uniformly from a generator seeded with ``key``."""
    assignment = torch.randint(bands, (n,), generator=torch.Generator().manual_seed(key))
    return tuple(torch.nonzero(assignment == g).flatten() for g in range(bands))


@dataclass(frozen=True)
class CyclicPoisson:
    """Cyclic Poisson sampling, step ``step`` of it: the records are split into b = ``bands``
    groups, and step t Poisson-samples group t mod b at rate q = b·B/n (B = ``batch_size``, the
    expected batch; b·B > n is refused: q would exceed 1). Add/remove-one adjacency; sums are
    divided by the public B.

    The groups: each record's group is drawn independently and uniformly at random, once per run,
    from the secret ``key`` (:meth:`secret_key`: 63 bits of the run's generator, kept in the
    algorithm's state so a resumed run has the same groups). Not by position (i mod b, or any
    public function of the index): removing one record shifts the index of every later one, so
    on the neighbouring data set many records would change group, and the argument below, which
    holds the other records' groups fixed, would not apply. The key's draws are taken in record
    order too, so for one known key a removed record would shift the later records' draws; with
    the key secret, every record's group is uniform and independent of the others' on D and on
    D′ alike, and the two runs are coupled record by record (each keeps its group), which is what
    the argument below holds fixed. So the key must stay secret: a leaked key voids it.

    The guarantee (Choquette-Choo et al., NeurIPS 2023, arXiv 2306.08153, amplification for
    b-banded matrices): for noise C⁻¹z with C lower-triangular, b-banded, of unit column norm, a
    record of group g takes part only at steps g, g + b, …, each time independently with
    probability q, and its columns of C have disjoint supports; for every assignment of the
    groups, and so for the random one too (a mixture of (ε, δ)-DP mechanisms is (ε, δ)-DP), the run
    is dominated by ⌈T/b⌉ compositions of PoissonSampled(q, Gaussian(z)) — the busiest group's
    rounds (:func:`dpopt.correlation.events.banded_event`). Hence :meth:`wrap` returns that
    event at the steps that start a round of group 0 (t mod b = 0) and ``NoOpDpEvent`` at the
    others: a ledger over the first t + 1 steps composes exactly ⌈(t + 1)/b⌉ rounds, which no
    group exceeds. This is sound only for releases through such a strategy with the same z and
    Δ at every step (:func:`dpopt.correlation.noise.banded_gaussian` commits them), never for
    independent noise with b > 1.

    b = 1 is :class:`Poisson` of rate B/n: the same draws from the same generator (no key is used,
    none need be drawn), the same event.

    Without its ``key`` (None, the default) a b > 1 sampler plans (relation, ``expected_size``,
    ``rate``, ``wrap``: none of them depends on the key) but refuses to draw (:meth:`group`,
    :meth:`sample`): a default key would make the assignment a public function of the index.
    An algorithm keeps the key in its state and hands the keyed sampler to the loop
    (:class:`dpopt.base.KeyedSampling`).
    """

    n: int
    batch_size: int
    bands: int
    step: int = 0
    key: int | None = None

    relation = NeighboringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        _validate.positive_int("n", self.n)
        _validate.positive_int("batch_size", self.batch_size, maximum=self.n, maximum_name="n")
        _validate.positive_int("bands", self.bands)
        if self.bands * self.batch_size > self.n:
            raise _validate.DpoptError(
                f"bands={self.bands} times batch_size={self.batch_size} must be <= n={self.n}: each step samples "
                f"one of {self.bands} groups of about n/bands records at rate bands·batch_size/n, which must be <= 1")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise _validate.DpoptError(f"step={self.step!r} must be an integer >= 0")

    @staticmethod
    def secret_key(gen: torch.Generator) -> int:
        """A group assignment's key: 63 bits drawn from the run's (secret) generator."""
        return int(torch.randint(2**63 - 1, (), generator=gen))

    @property
    def rate(self) -> float:
        return self.bands * self.batch_size / self.n

    @property
    def expected_size(self) -> float:
        return float(self.batch_size)

    def group(self) -> Tensor:
        """The sorted indices of the records of this step's group, t mod b."""
        if self.bands == 1:
            return torch.arange(self.n)
        if self.key is None:  # a default key would make the assignment public
            raise _validate.DpoptError(
                f"bands={self.bands} needs key=CyclicPoisson.secret_key(generator): the group assignment must be "
                "secret; a sampler without its key plans but cannot draw (a run's batches come from the sampler its "
                "algorithm's state makes: dpopt.base.KeyedSampling.batch_sampler)")
        return _groups(self.n, self.bands, self.key)[self.step % self.bands]

    def sample(self, gen: torch.Generator) -> Tensor:
        """Each record of this step's group independently with probability q (sorted indices)."""
        if self.bands == 1:
            return Poisson(self.n, self.rate).sample(gen)
        members = self.group()
        return members[Poisson(len(members), self.rate).sample(gen)]

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return dpa.PoissonSampledDpEvent(self.rate, event) if self.step % self.bands == 0 else dpa.NoOpDpEvent()


@dataclass(frozen=True)
class FixedSize:
    """A uniformly random subset of exactly ``size`` records, without replacement.

    Replace-one adjacency (n is public). Event: ``SampledWithoutReplacementDpEvent(n, size,
    event)``, which dp_accounting accounts with RDP (Wang, Balle, Kasiviswanathan 2019).
    """

    n: int
    size: int

    relation = NeighboringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        _validate.positive_int("batch_size", self.size, maximum=self.n, maximum_name="n")

    @classmethod
    @functools.lru_cache(maxsize=64)
    def of(cls, n: int, batch_size: int) -> FixedSize:
        return cls(n, batch_size)

    @property
    def expected_size(self) -> float:
        return float(self.size)

    def sample(self, gen: torch.Generator) -> Tensor:
        return torch.randperm(self.n, generator=gen)[: self.size]

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        if self.size == self.n:
            return event
        return dpa.SampledWithoutReplacementDpEvent(self.n, self.size, event)


@functools.lru_cache(maxsize=8)
def _permutation(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@dataclass(frozen=True)
class SinglePass:
    """Records ``[start, start + size)`` of one fixed random order of the n records (a permutation
    drawn from the public ``seed``, independent of the data): consecutive steps given consecutive
    slices see disjoint records, so every record is used at most once in the run.

    Replace-one adjacency (n is public; a replaced record sits at the same position of the order,
    so it changes one batch); no amplification: ``wrap`` returns the event unchanged.
    """

    n: int
    start: int
    size: int
    seed: int = 0

    relation = NeighboringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        _validate.positive_int("batch_size", self.size)
        if self.start < 0 or self.start + self.size > self.n:
            raise _validate.DpoptError(f"a single pass needs records [{self.start}, {self.start + self.size}) "
                                       f"but n={self.n}: use fewer steps or smaller batches")

    @property
    def expected_size(self) -> float:
        return float(self.size)

    def sample(self, gen: torch.Generator) -> Tensor:
        return _permutation(self.n, self.seed)[self.start : self.start + self.size]

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return event


@dataclass(frozen=True)
class Clients:
    """A data set split into ``count`` clients' shards of equal size m = ⌊n / count⌋ (the
    n mod count left-over records belong to no client and are never used), and the sampler of
    a round in which every client uses its whole shard.

    ``split="iid"``: a uniformly random permutation of the records cut into consecutive shards
    (the paper's i.i.d. equal split). ``split="label"``: records sorted by ``labels`` (ties in
    random order) and cut into consecutive shards, so each client sees one or two labels (the
    usual label-skewed split). The permutation comes from ``seed`` only: it is public and
    data-independent for "iid"; for "label" it depends on the labels, which is the clients'
    own arrangement of their data, not a release.

    Privacy is per client data set D_p, record-level, under replace-one adjacency (each client's
    m is public). The split stands for a federation whose clients already hold their data: the
    guarantee is for each D_p as the split gives it, not for a pooled data set that is split by
    this class ("label": one changed label can move the label boundaries and so change several
    shards; "iid" does not look at the data). A round's sum of clipped vectors over all used records has
    sensitivity 2C with
    respect to any D_p (a record lives in exactly one shard); dividing by the public m·count
    gives (1/P) Σ_p ClippedMean(D_p), whose sensitivity is 2C/(n_min·P) with n_min = m. No
    amplification (``wrap`` is the identity).
    """

    n: int
    count: int
    split: str = "iid"
    seed: int = 0
    labels: Tensor | None = field(default=None, repr=False, compare=False)

    relation = NeighboringRelation.REPLACE_ONE
    SPLITS = ("iid", "label")

    def __post_init__(self) -> None:
        _validate.positive_int("clients", self.count, maximum=self.n, maximum_name="n")
        _validate.one_of("split", self.split, self.SPLITS)
        if self.split == "label" and (self.labels is None or len(self.labels) != self.n):
            raise _validate.DpoptError(f"split='label' needs labels of length n={self.n}")

    @property
    def size(self) -> int:
        """n_min = m: every client's number of records."""
        return self.n // self.count

    @property
    def expected_size(self) -> float:
        return float(self.size * self.count)

    @functools.cached_property
    def shards(self) -> tuple[Tensor, ...]:
        """Client p's record indices, sorted, for p = 0 … count − 1."""
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed))
        if self.split == "label":
            order = order[torch.argsort(torch.as_tensor(self.labels)[order], stable=True)]
        used = order[: self.size * self.count].reshape(self.count, self.size)
        return tuple(row.sort().values for row in used)

    def records(self, clients: Sequence[int]) -> Tensor:
        """The indices of the records of ``clients`` (in client order)."""
        parts = [self.shards[p] for p in clients]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def sample(self, gen: torch.Generator) -> Tensor:
        return self.records(range(self.count))

    def wrap(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return event


#: How a batch algorithm draws its batches: one of these classes, passed in (``sampling=Poisson``);
#: ``Kind.of(n, batch_size)`` is the sampler of a step and ``Kind.relation`` its guarantee's relation.
BatchSampling = type[FullBatch] | type[Poisson] | type[FixedSize]
BATCH_SAMPLINGS: dict[str, BatchSampling] = {"poisson": Poisson, "fixed": FixedSize, "full": FullBatch}


def check(name: str, kind: object, allowed: tuple[BatchSampling, ...] = (Poisson, FixedSize, FullBatch)) -> None:
    """``kind`` must be one of the ``allowed`` sampler classes (an error naming the argument)."""
    if kind not in allowed:
        names = ", ".join(f"dpopt.sampling.{c.__name__}" for c in allowed)
        raise _validate.DpoptError(f"{name}={kind!r} must be one of: {names}")


def by_name(name: str) -> BatchSampling:
    """The batch sampling named ``name`` at the edge (CLI): "poisson", "fixed" or "full"."""
    _validate.one_of("sampling", name, tuple(BATCH_SAMPLINGS))
    return BATCH_SAMPLINGS[name]
