"""The canary worlds: the neighbouring data sets D and D′ an audit trains on, on a chosen engine.

Two kinds of world (:class:`Pair`): the audit's own linear world (:class:`World`, :func:`world`),
whose canaries the audit controls exactly, and a data set of the user's with one canary record
added or put in place of one of its records (:class:`Neighbours`, :func:`neighbours`), trained
with the user's module and loss (:class:`UserModule`).

In the linear world every record is a squared-loss record f(θ) = ½(⟨x, θ⟩ − y)², so the audit
controls its gradient (θ_r − y)·e_r for x = e_r (a white-box gradient canary):

* a **canary slot** r holds, in D′, the canary x = e_r, y = −M: gradient ≈ M·e_r with M huge, so
  clipping makes it the largest contribution the mechanism allows, in a coordinate no other
  record touches (a Dirac canary). In D, under replace-one adjacency, it holds the anti-canary
  (x = e_r, y = +M: the largest contribution toward −e_r); under add/remove-one adjacency a world
  of one slot has no record there (D has one record fewer than D′, as the relation says), and a
  world of many slots holds the neutral record (x = 0, y = 0: gradient and loss 0 whatever θ is;
  its D cannot drop every slot's record, see below);
* the **background** records are neutral, except where the algorithm clips an aggregate
  (:class:`Canary` ``background`` = A > 0: records with gradient ≈ −A·e_0, so that AClip's
  clipped mean flips from −λe_0 to +λe_0 with the canary: the 2λ its sensitivity accounts for).

A **separable** algorithm (per-record clipping, isotropic noise, a coordinate-wise update and
records sampled independently of each other) runs on the coordinates of a k-slot world as k
independent runs of a one-slot world: one training run audits k canaries at once (the
vectorised audit). There a neutral record stands for an absent one: it adds exactly nothing to
any release, and the sampling rate stays the one of D′'s n. Any other algorithm has one slot
per run, and under add/remove-one its D lacks the canary's record.

Slots sit where the run uses records: a sampler that always returns the same records (O2NC's
single pass through a public order) is asked which ones (:func:`used_positions`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from dp_accounting import NeighboringRelation
from torch import Tensor, nn

from .._validate import DpoptError
from ..base import S, Algorithm, KeyedSampling, Oracle
from ..oracles import Ridge, TorchModel, ghost

#: The canary's target: its gradient ≈ M·e_r dwarfs any clip norm and the whole background.
CANARY_PULL = 1e12
#: The default canary's target on a user's data (floating-point targets): −CANARY_TARGET, whose
#: gradient under a squared-type loss dwarfs any clip norm, and whose square stays finite in float32.
CANARY_TARGET = 1e6


@dataclass(frozen=True)
class Canary:
    """How the canary world of one algorithm is built: the background records are x = a·e_0,
    y = A for ``background`` = A ≠ 0 and ``background_input`` = a (else neutral); ``separable``:
    one run audits many slots."""

    background: float = 0.0
    background_input: float = 1.0
    separable: bool = False


#: The canary world per algorithm name (one entry per algorithm; a new algorithm adds one line).
CANARIES: dict[str, Canary] = {
    "dp-sgd": Canary(separable=True), "dp-bandmf": Canary(separable=True), "dp-gd": Canary(separable=True),
    "rrpsgd": Canary(), "dp-srm": Canary(),
    "dp-agd": Canary(), "storm": Canary(), "o2nc-zeroth": Canary(), "o2nc-first": Canary(), "o2nc-multi": Canary(),
    "diff2-gd": Canary(), "diff2-bvr": Canary(), "dp-sur": Canary(),
    "aclip": Canary(background=1e6),  # the clipped mean flips from −λu to +λu: the 2λ is attained
}


class Engine(Protocol):
    """Builds the oracle of a world's records ``X [n, ...]``, ``y [n, ...]``, and the θ0 its runs start at."""

    @property
    def name(self) -> str: ...

    def oracle(self, X: Tensor, y: Tensor) -> Oracle: ...

    def start(self, oracle: Oracle) -> Tensor: ...


def _zeros(oracle: Oracle) -> Tensor:
    return torch.zeros(oracle.dim, dtype=torch.float64)


@dataclass(frozen=True)
class ClosedForm:
    """The GLM path: :class:`~dpopt.oracles.Ridge` with closed-form per-record gradients; θ0 = 0."""

    name: str = "glm"

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        return Ridge(X, y, reg=0.0)

    def start(self, oracle: Oracle) -> Tensor:
        return _zeros(oracle)


def _squared(output: Tensor, target: Tensor) -> Tensor:
    return 0.5 * (output.squeeze(-1) - target) ** 2


@dataclass(frozen=True)
class Module:
    """:class:`~dpopt.oracles.TorchModel` on a linear module (no bias, θ0 = 0) with ``engine``
    ("ghost" or "vmap"); ``layers`` builds extra layers put before it (each must keep the width), and
    ``known_layers`` is the ghost engine's registry (a mutant may claim a layer acts per record)."""

    engine: str
    layers: Callable[[int], list[nn.Module]] = lambda width: []
    known_layers: ghost.Registry = field(default=ghost.KNOWN_LAYERS)

    @property
    def name(self) -> str:
        return self.engine

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        linear = nn.Linear(X.shape[1], 1, bias=False, dtype=torch.float64)
        nn.init.zeros_(linear.weight)
        module = nn.Sequential(*self.layers(X.shape[1]), linear)
        return TorchModel(module, _squared, X, y, engine=self.engine, known_layers=self.known_layers)

    def start(self, oracle: Oracle) -> Tensor:
        return _zeros(oracle)


@dataclass(frozen=True)
class UserModule:
    """The user's ``module`` and ``loss_fn`` (one loss per record) as the
    :class:`~dpopt.oracles.TorchModel` they train with (``engine``, ``microbatch_size``,
    ``known_layers`` as there). Every oracle gets its own copy of the module, so that a world's
    runs never touch the user's module nor the other world's; θ0 is the module's parameters, the
    same for every run (an adversary who knows the initialisation)."""

    module: nn.Module
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    engine: str = "ghost"
    microbatch_size: int = 512
    known_layers: ghost.Registry = field(default=ghost.KNOWN_LAYERS)

    @property
    def name(self) -> str:
        return self.engine

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        return TorchModel(copy.deepcopy(self.module), self.loss_fn, X, y, engine=self.engine,
                          microbatch_size=self.microbatch_size, known_layers=self.known_layers)

    def start(self, oracle: Oracle) -> Tensor:
        assert isinstance(oracle, TorchModel)  # built by oracle() above
        return oracle.flat_params().to(torch.float64)


@dataclass(frozen=True)
class Prepared:
    """``inner``'s oracle of the records after ``prepare(X, y) -> (X, y)``: a preparation that
    reads the whole data set (e.g. standardisation), run on D and on D′ alike, so that the audit
    sees what the canary does to it."""

    inner: Engine
    prepare: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]

    @property
    def name(self) -> str:
        return self.inner.name

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        return self.inner.oracle(*self.prepare(X, y))

    def start(self, oracle: Oracle) -> Tensor:
        return self.inner.start(oracle)


@dataclass(frozen=True)
class DataParallel:
    """``inner``'s oracle sharded across the ranks of the default process group
    (:class:`~dpopt.distributed.Sharded`): the data-parallel backend, audited from inside every
    rank of a :func:`~dpopt.distributed.launch` (the ranks share the audit's seeds)."""

    inner: Engine = ClosedForm()

    @property
    def name(self) -> str:
        return f"data-parallel {self.inner.name}"

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        from ..distributed import Sharded

        return Sharded(self.inner.oracle(X, y))

    def start(self, oracle: Oracle) -> Tensor:
        return _zeros(oracle)


ENGINES: dict[str, Engine] = {"glm": ClosedForm(), "ghost": Module("ghost"), "vmap": Module("vmap")}


def used_positions(algorithm: Algorithm[S], n: int, steps: int) -> list[int]:
    """The records a run of ``steps`` steps on n records can use, in order of first use: those of a
    sampler that returns the same records whatever its generator (a single pass), else all n (as
    for an algorithm whose batches depend on a secret of its state: cyclic Poisson's groups)."""
    if isinstance(algorithm, KeyedSampling):
        return list(range(n))
    used: dict[int, None] = {}
    for t in range(steps):
        sampler = algorithm.sampler(t, n)
        first = sampler.sample(torch.Generator().manual_seed(1))
        if not torch.equal(first, sampler.sample(torch.Generator().manual_seed(2))):
            return list(range(n))
        used.update(dict.fromkeys(first.tolist()))
    return list(used)


class Pair(Protocol):
    """D and D′: ``records(present=False)`` is D, ``present=True`` D′ (of ``n`` records, the n
    the claim is computed for); ``slots`` canaries per run; ``seen(value)`` is what the adversary
    watches of θ (or of the output): ``[slots, k]``, one row per canary slot."""

    @property
    def n(self) -> int: ...

    @property
    def slots(self) -> int: ...

    def records(self, *, present: bool | Sequence[bool]) -> tuple[Tensor, Tensor]: ...

    def seen(self, value: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class World:
    """D (``present=False``) or D′ of n records with ``slots`` canary slots at ``positions``."""

    n: int
    slots: int
    positions: tuple[int, ...]
    canary: Canary
    relation: NeighboringRelation

    def records(self, *, present: bool | Sequence[bool]) -> tuple[Tensor, Tensor]:
        """X [n, slots] and y [n] of D′ (``present``) or D, or with the canary in the slots
        where ``present[r]`` holds (one-run auditing). A world of one slot under add/remove-one
        has no record in an empty slot: its D has n − 1 records."""
        X = torch.zeros(self.n, self.slots, dtype=torch.float64)
        y = torch.zeros(self.n, dtype=torch.float64)
        if self.canary.background:
            X[:, 0], y[:] = self.canary.background_input, self.canary.background
        inside = [present] * self.slots if isinstance(present, bool) else [bool(p) for p in present]
        for r, position in enumerate(self.positions):
            X[position] = 0.0
            if inside[r] or self.relation == NeighboringRelation.REPLACE_ONE:
                X[position, r] = 1.0
                y[position] = -CANARY_PULL if inside[r] else CANARY_PULL
            else:
                y[position] = 0.0
        if self.slots == 1 and not inside[0] and self.relation == NeighboringRelation.ADD_OR_REMOVE_ONE:
            kept = torch.arange(self.n) != self.positions[0]
            return X[kept], y[kept]
        return X, y

    def seen(self, value: Tensor) -> Tensor:
        """The canary coordinates: slot r watches θ_r."""
        return value[:self.slots, None]


def world(algorithm: Algorithm[S], name: str, n: int, steps: int, canary: Canary | None = None, *,
          slots: int | None = None) -> World:
    """The world of ``algorithm`` (registered as ``name``) on n records: n slots if it is
    separable (every record a canary slot), else one slot at the first record the run uses; or
    ``slots`` slots at the first records the run uses (one-run auditing: any algorithm)."""
    canary = canary or CANARIES.get(name, Canary())
    positions = used_positions(algorithm, n, steps)
    if slots is None:
        slots = len(positions) if canary.separable and not canary.background else 1
    elif not 1 <= slots <= len(positions):
        raise DpoptError(f"canaries={slots} must be in [1, {len(positions)}]: the run uses {len(positions)} records")
    return World(n, slots, tuple(positions[:slots]), canary, algorithm.relation())


@dataclass(frozen=True)
class Neighbours:
    """D: the records ``X``, ``y`` as given; D′: D with the ``canary`` record ``(x, y)`` added at
    ``position`` (add/remove-one: n + 1 records) or put in place of the record there (replace-one:
    the same n). One canary per run; the adversary watches every coordinate of θ."""

    X: Tensor
    y: Tensor
    canary: tuple[Tensor, Tensor]
    relation: NeighboringRelation
    position: int = 0
    slots: int = field(default=1, init=False)

    @property
    def n(self) -> int:
        return len(self.X) + (self.relation == NeighboringRelation.ADD_OR_REMOVE_ONE)

    def records(self, *, present: bool | Sequence[bool]) -> tuple[Tensor, Tensor]:
        if not isinstance(present, bool):
            raise DpoptError("a world of the user's data holds one canary: present must be True or False")
        if not present:
            return self.X, self.y
        after = self.position + (self.relation == NeighboringRelation.REPLACE_ONE)
        return tuple(torch.cat([whole[:self.position], one.unsqueeze(0).to(whole.dtype), whole[after:]])
                     for whole, one in zip((self.X, self.y), self.canary))  # type: ignore[return-value]

    def seen(self, value: Tensor) -> Tensor:
        return value.reshape(1, -1)


def default_canary(X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """A canary record unlike the background ``X``, ``y``: its input lies along the direction the
    background's inputs use least (the right singular vector of the flattened inputs with the
    smallest singular value, or one orthogonal to all of them when there are more input dimensions
    than records), at the largest input norm; its target is −:data:`CANARY_TARGET` (floating-point
    targets: under a squared-type loss a gradient far above any clip norm) or the background's
    least frequent label in 0, …, max label (integer targets)."""
    if not X.is_floating_point():
        raise DpoptError(f"X has dtype {X.dtype}: the default canary needs floating-point inputs; give canary=(x, y)")
    flat = X.reshape(len(X), -1).to(torch.float64)
    _, _, vh = torch.linalg.svd(flat, full_matrices=False)
    if flat.shape[1] > len(vh):  # more dimensions than records: a direction no record uses at all
        direction = torch.randn(flat.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        direction -= vh.T @ (vh @ direction)
    else:
        direction = vh[-1]
    x = (direction / direction.norm() * flat.norm(dim=1).max()).reshape(X.shape[1:]).to(X.dtype)
    if y.is_floating_point():
        return x, torch.full_like(y[0], -CANARY_TARGET)
    if y.min() < 0:
        raise DpoptError("integer targets must be labels >= 0 for the default canary; give canary=(x, y)")
    counts = torch.bincount(y.reshape(-1))
    return x, torch.full_like(y[0], int(counts.argmin()))


def neighbours(algorithm: Algorithm[S], X: Tensor, y: Tensor, steps: int, canary: tuple[Tensor, Tensor] | None = None
               ) -> Neighbours:
    """The pair of the user's records ``X``, ``y`` and ``canary`` (default :func:`default_canary`)
    under ``algorithm``'s relation, the canary at the first position a run on D′ uses."""
    x, target = default_canary(X, y) if canary is None else (torch.as_tensor(canary[0]), torch.as_tensor(canary[1]))
    if x.shape != X.shape[1:] or target.shape != y.shape[1:]:
        raise DpoptError(f"canary shapes {tuple(x.shape)}, {tuple(target.shape)} must be those of one record: "
                         f"{tuple(X.shape[1:])}, {tuple(y.shape[1:])}")
    relation = algorithm.relation()
    n = len(X) + (relation == NeighboringRelation.ADD_OR_REMOVE_ONE)
    return Neighbours(X, y, (x, target), relation, used_positions(algorithm, n, steps)[0])
