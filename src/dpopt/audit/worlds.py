"""The canary worlds: the neighbouring data sets D and D′ an audit trains on, on a chosen engine.

Every record is a squared-loss record f(θ) = ½(⟨x, θ⟩ − y)², so the audit controls its gradient
(θ_r − y)·e_r for x = e_r (a white-box gradient canary):

* a **canary slot** r holds, in D′, the canary x = e_r, y = −M: gradient ≈ M·e_r with M huge, so
  clipping makes it the largest contribution the mechanism allows, in a coordinate no other
  record touches (a Dirac canary); in D it holds, under add/remove-one adjacency, the neutral
  record (x = 0, y = 0: gradient and loss 0 whatever θ is, the same as no record), and under
  replace-one the anti-canary (x = e_r, y = +M: the largest contribution toward −e_r);
* the **background** records are neutral, except where the algorithm clips an aggregate
  (:class:`Canary` ``background`` = A > 0: records with gradient ≈ −A·e_0, so that AClip's
  clipped mean flips from −λe_0 to +λe_0 with the canary: the 2λ its sensitivity accounts for).

A **separable** algorithm (per-record clipping, isotropic noise, a coordinate-wise update and
records sampled independently of each other) runs on the coordinates of a k-slot world as k
independent runs of a one-slot world: one training run audits k canaries at once (the
vectorised audit). Any other algorithm has one slot per run.

Slots sit where the run uses records: a sampler that always returns the same records (O2NC's
single pass through a public order) is asked which ones (:func:`used_positions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from dp_accounting import NeighboringRelation
from torch import Tensor, nn

from .._validate import DpoptError
from ..oracles import Oracle, Ridge, TorchModel, ghost

#: The canary's target: its gradient ≈ M·e_r dwarfs any clip norm and the whole background.
CANARY_PULL = 1e12


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
    "dp-sgd": Canary(separable=True), "dp-gd": Canary(separable=True), "rrpsgd": Canary(), "dp-srm": Canary(),
    "dp-agd": Canary(), "storm": Canary(), "o2nc-zeroth": Canary(), "o2nc-first": Canary(), "o2nc-multi": Canary(),
    "diff2-gd": Canary(), "diff2-bvr": Canary(),
    "aclip": Canary(background=1e6),  # the clipped mean flips from −λu to +λu: the 2λ is attained
}


class Engine(Protocol):
    """Builds the oracle of a world's records ``X [n, k]``, ``y [n]`` (float64)."""

    name: str

    def oracle(self, X: Tensor, y: Tensor) -> Oracle: ...


@dataclass(frozen=True)
class ClosedForm:
    """The GLM path: :class:`~dpopt.oracles.Ridge` with closed-form per-record gradients."""

    name: str = "glm"

    def oracle(self, X: Tensor, y: Tensor) -> Oracle:
        return Ridge(X, y, reg=0.0)


def _squared(output: Tensor, target: Tensor) -> Tensor:
    return 0.5 * (output.squeeze(-1) - target) ** 2


@dataclass(frozen=True)
class Module:
    """:class:`~dpopt.oracles.TorchModel` on a linear module (no bias) with ``engine`` ("ghost" or
    "vmap"); ``layers`` builds extra layers put before it (each must keep the width), and
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


ENGINES: dict[str, Engine] = {"glm": ClosedForm(), "ghost": Module("ghost"), "vmap": Module("vmap")}


def used_positions(algorithm: Any, n: int, steps: int) -> list[int]:
    """The records a run of ``steps`` steps on n records can use, in order of first use: those of a
    sampler that returns the same records whatever its generator (a single pass), else all n."""
    used: dict[int, None] = {}
    for t in range(steps):
        sampler = algorithm.sampler(t, n)
        first = sampler.sample(torch.Generator().manual_seed(1))
        if not torch.equal(first, sampler.sample(torch.Generator().manual_seed(2))):
            return list(range(n))
        used.update(dict.fromkeys(first.tolist()))
    return list(used)


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
        where ``present[r]`` holds (one-run auditing)."""
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
        return X, y


def world(algorithm: Any, name: str, n: int, steps: int, canary: Canary | None = None, *,
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
