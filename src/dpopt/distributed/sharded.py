"""Data-parallel training over ``torch.distributed``: the same algorithms, the same run.

Every rank builds the same full oracle, wraps it in :class:`Sharded` and calls the unchanged
:func:`dpopt.run` with the same seed. What each rank does at step t:

1. Sampling. The sampling generator is seeded identically on every rank, so every rank draws
   the **same** batch B_t (a Poisson batch stays one Poisson sample of the whole data set, of
   the rate the ledger accounts for; nothing is sampled per rank).
2. Clipped sums. Rank r takes its share B_t^r = B_t[r::K] (K ranks; the shares partition
   B_t, some may be empty), computes its records' per-record vectors and their norms, clips
   them with the usual weights w_i = min(1, C/‖v_i‖), and sums them; the K local sums are
   all-reduced (SUM), so every rank holds

       Σ_r Σ_{i∈B_t^r} w_i v_i  =  Σ_{i∈B_t} w_i v_i,

   the clipped sum of the whole batch (a record's weight depends on its own vector only, so
   clipping per share is clipping per record). Multi-term sums (DP-SRM's clipped gradient and
   clipped gradient difference) are all-reduced term by term; oracle gradient sums
   (AClip's batch sum) are all-reduced the same way.
3. Noise. :func:`dpopt.mechanisms.gaussian` adds N(0, (zΔ)² I) drawn from the noise
   generator, which is also seeded identically everywhere (:func:`shared_secret_seed`): all ranks
   add the **same single draw** to the same all-reduced sum. The released value is exactly the
   single-process one (up to the summation order of floating-point additions), noise enters once,
   not K times. Banded correlated noise is no exception: its group key comes from the shared
   sampling generator and its noise from the shared noise generator, so every rank holds the same
   ring of past noise and adds the same x_t. Adaptive clipping's count Σ(1[‖v_i‖ ≤ C_t] − ½) is
   counted per share and all-reduced like the sums (``ShardedRows.batch_total``), so every rank
   releases the same noised count and moves to the same C_{t+1}.

Privacy argument: every release is the single-process mechanism's release, computed in
pieces: the same sampled batch (same sampling rate, same neighbouring relation), the same
clipped sum with the same sensitivity (Δ = Σ_k |s_k| C_k, or twice that under replace-one;
:func:`dpopt.clipping.clip_sum` still makes the only :class:`~dpopt.mechanisms.Bounded`, from
the local norms and the all-reduced sum) and one Gaussian draw of the same scale. So every
rank's ledger records the same events and reports the same ε(δ) as one process would; the
privacy of a run does not depend on the number of processes. (The shared noise seed is as
secret as in one process: it lives only inside the training processes.)

Not sharded (computed redundantly, identically, on every rank, by the full oracle): ``loss``,
``gradient``, ``error``, ``per_record_loss`` (DP-AGD's candidate scores), ``regulariser`` and
every other attribute. Every rank holds the whole data set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from ..base import Oracle, Rows, Scored
from .group import collective


def shared_secret_seed() -> int:
    """A seed drawn from the operating system by rank 0 and sent to every rank: data-parallel ranks
    must add one shared noise draw and sample one shared batch, and the seed must stay secret
    (it never leaves the run's processes)."""
    seed = torch.tensor([int.from_bytes(os.urandom(8), "little") >> 1], dtype=torch.int64)
    dist.broadcast(seed, src=0)
    return int(seed)


class Sharded:
    """``oracle`` for one rank of a data-parallel run (every rank wraps the same full oracle).

    ``per_record(θ, B)`` and ``gradient_sum(θ, B)`` work on this rank's share ``B[rank::world]``
    and all-reduce the sums; everything else is delegated to ``oracle`` (see the module
    docstring). ``group``: the process group (default: the default group).
    """

    shares_noise = True  #: every rank must add the same noise draw (:func:`dpopt.train.run` checks)

    def __init__(self, oracle: Oracle, group: dist.ProcessGroup | None = None) -> None:
        self.oracle, self.group = oracle, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.n, self.dim = oracle.n, oracle.dim

    def share(self, indices: Tensor) -> Tensor:
        """This rank's part of a batch: every ``world``-th record from position ``rank``."""
        return indices[self.rank::self.world]

    def all_reduce(self, local: Tensor) -> Tensor:
        """Σ over ranks of ``local`` (in place; every rank must call this in the same order)."""
        collective(dist.all_reduce, local, op=dist.ReduceOp.SUM, group=self.group)
        return local

    def per_record(self, theta: Tensor, indices: Tensor) -> ShardedRows:
        share = self.share(indices)
        return ShardedRows(self.oracle.per_record(theta, share), len(indices), len(share), self)

    def gradient_sum(self, theta: Tensor, indices: Tensor | None) -> Tensor:
        everyone = torch.arange(self.n) if indices is None else indices
        return self.all_reduce(self.oracle.gradient_sum(theta, self.share(everyone)).clone())

    # delegated: the full oracle on every rank
    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        return self.oracle.loss(theta, indices)

    def gradient(self, theta: Tensor) -> Tensor:
        return self.oracle.gradient(theta)

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        return self.oracle.per_record_loss(thetas, indices)

    def regulariser(self, theta: Tensor) -> Tensor:
        return self.oracle.regulariser(theta)

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        return cast(Scored, self.oracle).error(theta, X, y)  # the oracle's, where it has one

    def __getattr__(self, name: str) -> Any:  # flat_params, load, reg, engine, ...
        if name == "oracle":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.oracle, name)


@dataclass(frozen=True)
class ShardedRows:
    """A :class:`~dpopt.base.PerRecord` of one rank: ``local`` holds this rank's share of a
    batch of ``size`` records (``local_size`` of them).

    ``norms()`` are the local records' norms (``[local_size]``); ``weighted_sum(w)`` is the
    local weighted sum all-reduced over the ranks, i.e. the sum over the whole batch, and
    ``batch_total(x)`` any other per-share total so summed (:class:`~dpopt.base.ShareOfBatch`). ``w`` is
    per local record (what :func:`~dpopt.clipping.clip_sum` passes, computed from ``norms()``)
    or per batch record (``[size]``, e.g. STORM's ones), then this rank's share of it is used.
    ``a - b`` (DP-SRM: the same records at two points) subtracts the local rows.
    """

    local: Rows
    size: int
    local_size: int
    oracle: Sharded

    def norms(self) -> Tensor:
        return self.local.norms()

    def batch_total(self, local: Tensor) -> Tensor:
        """Σ over the ranks of ``local``, a total over this rank's records (e.g. adaptive clipping's
        count): the total over the whole batch."""
        return self.oracle.all_reduce(local.clone())

    def weighted_sum(self, weights: Tensor) -> Tensor:
        if len(weights) == self.size and self.size != self.local_size:
            weights = self.oracle.share(weights)
        elif len(weights) != self.local_size:
            raise ValueError(f"weights of length {len(weights)}: expected {self.local_size} (this rank's records) "
                             f"or {self.size} (the batch)")
        return self.oracle.all_reduce(self.local.weighted_sum(weights).contiguous())

    def __sub__(self, other: ShardedRows) -> ShardedRows:
        if not isinstance(other, ShardedRows):
            return NotImplemented
        if (other.size, other.local_size) != (self.size, self.local_size):
            raise ValueError("sharded rows can only be subtracted on the same records")
        return ShardedRows(self.local - other.local, self.size, self.local_size, self.oracle)
