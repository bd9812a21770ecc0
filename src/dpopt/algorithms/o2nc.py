"""DP-O2NC: private Goldstein-stationary points of nonsmooth nonconvex losses
(Kornowski, Liu, Talwar; online-to-non-convex conversion of Cutkosky, Mehta, Orabona 2023).

Outer loop (Algorithm 2), step t = 1..T, with Δ_1 = 0:

    s_t ~ U[0, 1];   x_t = x_{t−1} + Δ_t;   z_t = x_{t−1} + s_t Δ_t;   g̃_t = O(z_t);
    Δ_{t+1} = clip(Δ_t − η g̃_t, D);

output: the average of z over one of the K = ⌊T/M⌋ windows of M consecutive steps, chosen
uniformly at random before training (free of privacy cost). The oracle O estimates ∇F_α, the
gradient of the α-smoothed loss, with variance reduction over periods of Σ steps: at a period
start g_t is a fresh estimate, otherwise g_t = g_{t−1} + (estimate at z_t − estimate at z_{t−1}).
Per-record estimates (``estimator``):

* "zeroth": the two-point sphere estimator (4) with m directions (fresh 2m at a difference step:
  m at z_t, m at z_{t−1}; Algorithms 3, 4);
* "first": gradients at points uniform in the α-ball (10): one point per record at a period
  start, m at each of z_t, z_{t−1} otherwise (Algorithm 5).

Privacy (``passes``), made unconditional by clipping (the paper's sensitivity bounds hold only
with high probability, Lemmas 3.4 and 6.3): each record's estimate at a period start is clipped
at ``clip0`` (C1), each record's difference at ``clip`` (C2), and the steps count how often a
clip bit (``state.clipped`` of ``state.records``).

* "single" (Algorithms 3, 5): batches of B1 (period start) and B2 records, each record used once
  (:class:`~dpopt.sampling.SinglePass`). The increments (1/B1)Σ clip(·, C1) and (1/B2)Σ clip(·, C2)
  (sensitivities C1/B1 and C2/B2 under replace-special adjacency; the public divisors sit inside
  the clipped sum) feed one :class:`~dpopt.mechanisms.TreeAggregator` per period with node noise
  z·max(C1/B1, C2/B2); g̃_t is the tree's noisy prefix sum. The periods see disjoint records, so
  they compose in parallel: the run is ONE ``SingleEpochTreeAggregationDpEvent(z, [Σ, …, Σ, r])``,
  whose ε is that of a single period's tree (the deepest). The aggregator returns it with its
  first release (the trees' noise is fixed up front, as in Algorithm 1, line 3) and
  ``NoOpDpEvent`` with every later one.
* "multi" (Algorithm 4): every record at every step (replace-one, sensitivity 2C). Period start:
  g̃_t = (Σ_i clip(·, C1) + N(0, (z0·2C1)²))/n; otherwise g̃_t = g̃_{t−1} + (Σ_i clip(diff_i, C2) +
  N(0, (z·2C2)²))/n. Events ``Gaussian(z0)`` and ``Gaussian(z)``, composed over all T steps.

With noise 0 and clips ∞ this is non-private O2NC with the same estimator. Parameter settings of
the theorems, with every hidden constant explicit: :mod:`dpopt.algorithms.o2nc_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..oracles import Oracle
from ..oracles import zeroth_order as zo
from ._common import Batch

ESTIMATORS = ("zeroth", "first")
PASSES = ("single", "multi")


class O2NCState(NamedTuple):
    theta: Tensor          # x_{t−1} before step t
    delta: Tensor          # Δ_t
    previous: Tensor       # z_{t−1}
    released: Tensor       # g̃_{t−1}
    tree: mechanisms.TreeAggregator | None
    steps: int             # T (the plan, for the tree event and the windows)
    pick: int              # the window whose average is the output
    window_sum: Tensor
    clipped: int           # per-record clips that bit so far
    records: int           # per-record contributions clipped so far


@dataclass(frozen=True)
class O2NC:
    """Keyword-only hyper-parameters: step size ``lr`` (η), ``radius`` (D, the clip of Δ),
    ``window`` (M), ``alpha`` (α, the smoothing radius), ``period`` (Σ), per-record clips ``clip0``
    (C1, period starts) and ``clip`` (C2, differences), ``noise_multiplier`` (z: the tree's, or the
    difference steps' under "multi") and ``noise_multiplier0`` ("multi" only: the period starts';
    None = z), ``estimator``, ``passes``, ``directions`` (m), ``batch_size0`` (B1) and ``batch_size``
    (B2) (single pass), ``order_seed`` (the public record order of the single pass)."""

    lr: float
    radius: float
    window: int
    alpha: float
    period: int
    clip0: float
    clip: float
    noise_multiplier: float
    noise_multiplier0: float | None = None
    estimator: str = "zeroth"
    passes: str = "single"
    directions: int = 1
    batch_size0: int = 1
    batch_size: int = 1
    order_seed: int = 0

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.positive("radius", self.radius)
        _validate.positive_int("window", self.window)
        _validate.positive("alpha", self.alpha)
        _validate.positive_int("period", self.period)
        _validate.positive("clip0", self.clip0, allow_inf=True)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.non_negative("noise_multiplier", self.noise_multiplier)
        _validate.one_of("estimator", self.estimator, ESTIMATORS)
        _validate.one_of("passes", self.passes, PASSES)
        if self.noise_multiplier0 is not None:
            _validate.non_negative("noise_multiplier0", self.noise_multiplier0)
            if self.passes == "single":
                raise _validate.DpoptError(f"noise_multiplier0={self.noise_multiplier0!r} is for passes='multi'; "
                                           "a single pass has one tree noise (noise_multiplier)")
        _validate.positive_int("directions", self.directions)
        _validate.positive_int("batch_size0", self.batch_size0)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.non_negative("order_seed", self.order_seed)

    @property
    def NOISE_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 (the name every algorithm uses)
        return ("noise_multiplier",) if self.noise_multiplier0 is None else ("noise_multiplier0", "noise_multiplier")

    @property
    def noise_ratios(self) -> tuple[float, ...]:
        if self.noise_multiplier0 is None:
            return (1.0,)
        return (self.noise_multiplier0 / self.noise_multiplier, 1.0) if self.noise_multiplier else (1.0, 1.0)

    # ------------------------------------------------------------------------- data and privacy

    def relation(self) -> dpa.NeighboringRelation:
        return sampling.SinglePass.relation if self.passes == "single" else sampling.FullBatch.relation

    def records_used(self, steps: int) -> int:
        """Records a single pass of ``steps`` steps consumes: B1 per period start, B2 otherwise."""
        starts = -(-steps // self.period)
        return starts * self.batch_size0 + (steps - starts) * self.batch_size

    def sampler(self, t: int, n: int) -> sampling.Sampler:
        if self.passes == "multi":
            return sampling.make("full", n, n)
        size = self.batch_size0 if t % self.period == 0 else self.batch_size
        return sampling.SinglePass(n, self.records_used(t), size, self.order_seed)

    def tree_sensitivity(self) -> float:
        """max(C1/B1, C2/B2): the largest sensitivity of one increment of a period's tree (computed
        as :func:`~dpopt.clipping.clip_sum` computes an increment's, (1/B)·C, to the last bit)."""
        return max((1.0 / self.batch_size0) * self.clip0, (1.0 / self.batch_size) * self.clip)

    def period_lengths(self, steps: int) -> list[int]:
        full, rest = divmod(steps, self.period)
        return [self.period] * full + ([rest] if rest else [])

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        if self.passes == "single":
            if self.records_used(steps) > n:
                raise _validate.DpoptError(f"a single pass of steps={steps} needs {self.records_used(steps)} records "
                                           f"but n={n}")
            tree = mechanisms.tree_event(self.noise_multiplier, self.period_lengths(steps))
            return dpa.ComposedDpEvent([tree, dpa.SelfComposedDpEvent(dpa.NoOpDpEvent(), steps - 1)])
        return dpa.ComposedDpEvent([self._gaussian_event(t) for t in range(steps)])

    def _gaussian_event(self, t: int) -> dpa.DpEvent:
        start = t % self.period == 0 and self.noise_multiplier0 is not None
        return dpa.GaussianDpEvent(self.noise_multiplier0 if start else self.noise_multiplier)

    # --------------------------------------------------------------------------------- the loop

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> O2NCState:
        if steps < self.window:
            raise _validate.DpoptError(f"steps={steps} must be >= window={self.window} (one window to average)")
        pick = int(torch.randint(steps // self.window, (1,), generator=gen))
        zero = torch.zeros_like(theta0)
        return O2NCState(theta0.clone(), zero, theta0.clone(), zero, None, steps, pick, zero.clone(), 0, 0)

    def _estimates(self, oracle: Oracle, point: Tensor, indices: Tensor, count: int,
                   gen: torch.Generator) -> Tensor:
        """``[B, d]`` per-record estimates of ∇f_α at ``point`` from ``count`` directions or points."""
        dim = point.shape[0]
        if self.estimator == "zeroth":
            return zo.two_point(oracle, point, indices, zo.sphere(gen, len(indices), count, dim, point.dtype),
                                self.alpha)
        offsets = zo.ball(gen, len(indices), count, dim, self.alpha, point.dtype)
        return oracle.gradients_at(point + offsets, indices).mean(dim=1)

    def step(self, state: O2NCState, batch: Batch, oracle: Oracle,
             source: mechanisms.NoiseSource) -> tuple[O2NCState, dpa.DpEvent]:
        t, indices, gen = batch.t, batch.indices, source.generator
        s = float(torch.rand((), generator=gen, dtype=torch.float64))
        theta = state.theta + state.delta
        z = state.theta + s * state.delta
        start = t % self.period == 0
        if start:
            rows = self._estimates(oracle, z, indices, self.directions if self.estimator == "zeroth" else 1, gen)
            clip, batch_size = self.clip0, self.batch_size0
        else:
            rows = (self._estimates(oracle, z, indices, self.directions, gen)
                    - self._estimates(oracle, state.previous, indices, self.directions, gen))
            clip, batch_size = self.clip, self.batch_size
        dense = clipping.Dense(rows)
        bit = int((dense.norms() > clip).sum())
        tree = state.tree
        if self.passes == "single":
            if tree is None:
                tree = mechanisms.TreeAggregator(tuple(self.period_lengths(state.steps)), self.noise_multiplier,
                                                 self.tree_sensitivity())
            bounded, _ = clipping.clip_sum([clipping.Term(1.0 / batch_size, dense, clip)], batch.sampler.relation)
            tree, released, event = tree.add(bounded, source)
        else:
            bounded, _ = clipping.clip_sum([clipping.Term(1.0, dense, clip)], batch.sampler.relation)
            z_noise = self.noise_multiplier0 if start and self.noise_multiplier0 is not None else self.noise_multiplier
            noised, event = mechanisms.gaussian(bounded, z_noise, source)
            increment = noised / batch.sampler.expected_size
            released = increment if start else state.released + increment
        step = state.delta - self.lr * released
        norm = float(step.norm())
        delta = step * (self.radius / norm) if norm > self.radius else step
        window_sum = state.window_sum + z if t // self.window == state.pick else state.window_sum
        return O2NCState(theta, delta, z, released, tree, state.steps, state.pick, window_sum,
                         state.clipped + bit, state.records + len(indices)), event

    def output(self, state: O2NCState) -> Tensor:
        """x̄_k = (1/M) Σ_{m=1}^{M} z_{(k−1)M+m} for the pre-drawn window k."""
        return state.window_sum / self.window

    def diagnostics(self, state: O2NCState) -> dict[str, float]:
        """``clip_rate``: the fraction of per-record contributions whose clip bit (the paper's
        sensitivity bound failing), reported in ``History.final``."""
        return {"clip_rate": state.clipped / state.records if state.records else 0.0}
