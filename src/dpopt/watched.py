"""The steps of :class:`dpopt.Private`, watched: each step's batch loaded through the user's
DataLoader (when the training data is one), and the step's training loss kept for the user to
watch (NOT PRIVATE).

:class:`Watched` is :class:`dpopt.train.Stepper` (so :func:`dpopt.fit`'s loop,
:func:`dpopt.train.drive`, takes its steps too) with two additions around each step, neither of
which changes a draw, a release or the ledger:

* with :class:`~dpopt.oracles.loaded.Loaded` records, the step runs inside ``Loaded.step``: the
  loader's workers have loaded its chunks ahead, from the same draws (why that is the run's own
  draw: :mod:`dpopt.oracles.loaded`);
* ``train_loss``: the mean of ℓ_i(θ_t) over the realised batch B_t, the per-record losses the
  step's gradients at its iterate θ_t were taken of (:meth:`~dpopt.oracles.TorchModel.losses_seen`:
  no second forward). It is computed from the training records without noise, and B_t itself is
  secret: a NOT PRIVATE diagnostic, written only where the user asks for diagnostics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import torch
from torch import Tensor

from .base import S, Algorithm
from .oracles.loaded import Loaded
from .oracles.torch_model import TorchModel
from .train import Stepper, batch_sampler


@dataclasses.dataclass
class Watched(Stepper):
    """A :class:`~dpopt.train.Stepper` of a :class:`~dpopt.oracles.TorchModel`, its batches loaded
    through a :class:`~dpopt.oracles.loaded.Loaded` if the oracle's records are one; ``train_loss``:
    the last step's mean training loss at its iterate (NaN before the first step, for an empty
    batch, and for a step that takes no gradient at its iterate, e.g. O2NC's at random points)."""

    oracle: TorchModel  # (the field of Stepper, narrowed: it keeps its place)
    train_loss: float = math.nan

    def step(self) -> int:
        t, point, records = self.t, self.state.theta.clone(), self.oracle.records
        # (holds no stepper, no reference cycle; the state only where the batches depend on its key)
        draw = functools.partial(drawn, self.algorithm, self.state if self.keyed else None, self.oracle.n)
        loading = (records.step(t, self.sample_gen, draw, self.steps) if isinstance(records, Loaded)
                   else contextlib.nullcontext())
        with loading, self.oracle.losses_seen() as mean_at:
            size = super().step()
        self.train_loss = mean_at(point)
        return size


def drawn(algorithm: Algorithm[S], state: S | None, n: int, t: int, gen: torch.Generator) -> Tensor:
    """Step t's batch as the run draws it (:func:`dpopt.train.step`), from ``gen``: from the sampler
    of ``state`` for an algorithm whose batches depend on a secret of its state (cyclic Poisson
    sampling's group key, drawn at ``init`` and the same at every step; ``state`` None: they do not)."""
    sampler = algorithm.sampler(t, n) if state is None else batch_sampler(algorithm, state, t, n, keyed=True)
    return sampler.sample(gen)
