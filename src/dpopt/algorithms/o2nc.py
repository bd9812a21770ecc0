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

Two oracles, two algorithms: :class:`O2NC` (single pass, tree mechanism) and :class:`O2NCMulti`
(every record every step, Gaussian mechanism); the outer loop and the estimator are shared
functions. Privacy, made unconditional by clipping (the paper's sensitivity bounds hold only
with high probability, Lemmas 3.4 and 6.3): each record's estimate at a period start is clipped
at ``clip0`` (C1), each record's difference at ``clip`` (C2), and the steps count how often a
clip bit (``state.clipped`` of ``state.records``).

* :class:`O2NC`, single pass (Algorithms 3, 5): batches of B1 (period start) and B2 records, each
  record used once (:class:`~dpopt.sampling.SinglePass`). The increments (1/B1)Σ clip(·, C1) and
  (1/B2)Σ clip(·, C2) (sensitivities 2C1/B1 and 2C2/B2 under replace-one adjacency, the relation
  of every other full-data method here, so their ε compare directly; the public divisors sit
  inside the clipped sum) feed a :class:`~dpopt.mechanisms.TreeAggregator`, one tree per period,
  with node noise z·2·max(C1/B1, C2/B2); g̃_t is the tree's noisy prefix sum. The periods see disjoint records, so
  they compose in parallel: the run is ONE ``SingleEpochTreeAggregationDpEvent(z, [Σ, …, Σ, r])``,
  whose ε is that of a single period's tree (the deepest). The aggregator returns it with its
  first release (the trees' noise is fixed up front, as in Algorithm 1, line 3) and
  ``NoOpDpEvent`` with every later one.
* :class:`O2NCMulti` (Algorithm 4): every record at every step (replace-one, sensitivity 2C). Period start:
  g̃_t = (Σ_i clip(·, C1) + N(0, (z0·2C1)²))/n; otherwise g̃_t = g̃_{t−1} + (Σ_i clip(diff_i, C2) +
  N(0, (z·2C2)²))/n. Events ``Gaussian(z0)`` and ``Gaussian(z)``, composed over all T steps.

With noise 0 and clips ∞ this is non-private O2NC with the same estimator. Parameter settings of
the theorems, with every hidden constant explicit: :mod:`dpopt.algorithms.o2nc_params`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..base import Batch, NoiseSource, Oracle, Pointwise, Sampler
from ..oracles import zeroth_order as zo

if TYPE_CHECKING:
    from .params import O2NCParams

ESTIMATORS = ("zeroth", "first")


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


def _check_outer(algo: O2NC | O2NCMulti) -> None:
    """Validate the hyper-parameters both oracles share (the outer loop and the estimator)."""
    _validate.positive("lr", algo.lr)
    _validate.positive("radius", algo.radius)
    _validate.positive_int("window", algo.window)
    _validate.positive("alpha", algo.alpha)
    _validate.positive_int("period", algo.period)
    _validate.positive("clip0", algo.clip0, allow_inf=True)
    _validate.positive("clip", algo.clip, allow_inf=True)
    _validate.non_negative("noise_multiplier", algo.noise_multiplier)
    _validate.one_of("estimator", algo.estimator, ESTIMATORS)
    _validate.positive_int("directions", algo.directions)


def _init(algo: _Conversion, theta0: Tensor, steps: int, gen: torch.Generator) -> O2NCState:
    if steps < algo.window:
        raise _validate.DpoptError(f"steps={steps} must be >= window={algo.window} (one window to average)")
    pick = int(torch.randint(steps // algo.window, (1,), generator=gen))
    zero = torch.zeros_like(theta0)
    return O2NCState(theta0.clone(), zero, theta0.clone(), zero, None, steps, pick, zero.clone(), 0, 0)


def _estimates(algo: _Conversion, oracle: Pointwise, point: Tensor, indices: Tensor, count: int,
               gen: torch.Generator) -> Tensor:
    """``[B, d]`` per-record estimates of ∇f_α at ``point`` from ``count`` directions or points."""
    dim = point.shape[0]
    if algo.estimator == "zeroth":
        return zo.two_point(oracle, point, indices, zo.sphere(gen, len(indices), count, dim, point.dtype), algo.alpha)
    offsets = zo.ball(gen, len(indices), count, dim, algo.alpha, point.dtype)
    return oracle.gradients_at(point + offsets, indices).mean(dim=1)


def _outer_step(algo: _Conversion, state: O2NCState, batch: Batch, oracle: Oracle,
                source: NoiseSource) -> tuple[O2NCState, dpa.DpEvent]:
    """Step t of the conversion: s_t, x_t, z_t, the per-record rows at z_t (a fresh estimate at a
    period start, else the difference from z_{t−1}), the oracle's release g̃_t (``algo.release``),
    then Δ_{t+1} = clip(Δ_t − η g̃_t, D) and the window sum."""
    t, indices, gen = batch.t, batch.indices, source.generator
    at_points = cast(Pointwise, oracle)  # O2NC evaluates each record at points of its own (unchecked, per step)
    s = float(torch.rand((), generator=gen, dtype=torch.float64))
    theta = state.theta + state.delta
    z = state.theta + s * state.delta
    start = t % algo.period == 0
    if start:
        rows = _estimates(algo, at_points, z, indices, algo.directions if algo.estimator == "zeroth" else 1, gen)
    else:
        rows = (_estimates(algo, at_points, z, indices, algo.directions, gen)
                - _estimates(algo, at_points, state.previous, indices, algo.directions, gen))
    dense = clipping.Dense(rows)
    clip = algo.clip0 if start else algo.clip
    bit = int((dense.norms() > clip).sum())
    released, tree, event = algo.release(state, batch, dense, start, source)
    step = state.delta - algo.lr * released
    norm = float(step.norm())
    delta = step * (algo.radius / norm) if norm > algo.radius else step
    window_sum = state.window_sum + z if t // algo.window == state.pick else state.window_sum
    return O2NCState(theta, delta, z, released, tree, state.steps, state.pick, window_sum,
                     state.clipped + bit, state.records + len(indices)), event


def _output(algo: _Conversion, state: O2NCState) -> Tensor:
    """x̄_k = (1/M) Σ_{m=1}^{M} z_{(k−1)M+m} for the pre-drawn window k."""
    return state.window_sum / algo.window


def _diagnostics(state: O2NCState) -> dict[str, float]:
    """``clip_rate``: the fraction of per-record contributions whose clip bit (the paper's
    sensitivity bound failing). Computed from the training data: a non-private diagnostic."""
    return {"clip_rate": state.clipped / state.records if state.records else 0.0}


class _Conversion:
    """The outer loop both oracles share (``init``, ``step``, ``output``, ``diagnostics``); each
    algorithm supplies its oracle's ``release``."""

    # the hyper-parameters the loop reads (the fields of each algorithm's dataclass)
    lr: float
    radius: float
    window: int
    alpha: float
    period: int
    clip0: float
    clip: float
    estimator: str
    directions: int

    def release(self, state: O2NCState, batch: Batch, rows: clipping.Dense, start: bool,
                source: NoiseSource) -> tuple[Tensor, mechanisms.TreeAggregator | None, dpa.DpEvent]:
        """g̃_t, the period's tree (if any) and the release's event."""
        raise NotImplementedError

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> O2NCState:
        return _init(self, theta0, steps, gen)

    def step(self, state: O2NCState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[O2NCState, dpa.DpEvent]:
        return _outer_step(self, state, batch, oracle, source)

    def output(self, state: O2NCState) -> Tensor:
        return _output(self, state)

    def diagnostics(self, state: O2NCState) -> dict[str, float]:
        return _diagnostics(state)


@dataclass(frozen=True)
class O2NC(_Conversion):
    """DP-O2NC with the single-pass oracle and the tree mechanism (Algorithms 3, 5).
    Keyword-only hyper-parameters: step size ``lr`` (η), ``radius`` (D, the clip of Δ),
    ``window`` (M), ``alpha`` (α, the smoothing radius), ``period`` (Σ), per-record clips
    ``clip0`` (C1, period starts) and ``clip`` (C2, differences), ``noise_multiplier`` (z, of
    every tree node), ``estimator`` ("zeroth" or "first"), ``directions`` (m), ``batch_size0``
    (B1) and ``batch_size`` (B2), ``order_seed`` (the public record order of the pass)."""

    lr: float
    radius: float
    window: int
    alpha: float
    period: int
    clip0: float
    clip: float
    noise_multiplier: float
    estimator: str = "zeroth"
    directions: int = 1
    batch_size0: int = 1
    batch_size: int = 1
    order_seed: int = 0

    NOISE_FIELDS = ("noise_multiplier",)
    noise_ratios = (1.0,)

    def __post_init__(self) -> None:
        _check_outer(self)
        _validate.positive_int("batch_size0", self.batch_size0)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.non_negative("order_seed", self.order_seed)

    def relation(self) -> dpa.NeighboringRelation:
        return sampling.SinglePass.relation

    def records_used(self, steps: int) -> int:
        """Records a single pass of ``steps`` steps consumes: B1 per period start, B2 otherwise."""
        starts = -(-steps // self.period)
        return starts * self.batch_size0 + (steps - starts) * self.batch_size

    def sampler(self, t: int, n: int) -> Sampler:
        size = self.batch_size0 if t % self.period == 0 else self.batch_size
        return sampling.SinglePass(n, self.records_used(t), size, self.order_seed)

    def tree_sensitivity(self) -> float:
        """max(C1/B1, C2/B2) times the relation's factor: the largest sensitivity of one
        increment of a period's tree (computed as :func:`~dpopt.clipping.clip_sum` computes an
        increment's, (1/B)·C, to the last bit)."""
        factor = clipping.relation_factor(self.relation())
        return max((1.0 / self.batch_size0) * self.clip0, (1.0 / self.batch_size) * self.clip) * factor

    def period_lengths(self, steps: int) -> list[int]:
        full, rest = divmod(steps, self.period)
        return [self.period] * full + ([rest] if rest else [])

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        if self.records_used(steps) > n:
            raise _validate.DpoptError(f"a single pass of steps={steps} needs {self.records_used(steps)} records "
                                       f"but n={n}")
        tree = dpa.SingleEpochTreeAggregationDpEvent(self.noise_multiplier, self.period_lengths(steps))
        return dpa.ComposedDpEvent([tree, dpa.SelfComposedDpEvent(dpa.NoOpDpEvent(), steps - 1)])


    def release(self, state: O2NCState, batch: Batch, rows: clipping.Dense, start: bool,
                source: NoiseSource) -> tuple[Tensor, mechanisms.TreeAggregator, dpa.DpEvent]:
        """g̃_t: the tree's noisy prefix sum of the increments (1/B)Σ clip(·, C) of this period."""
        tree = state.tree or mechanisms.TreeAggregator(tuple(self.period_lengths(state.steps)), self.noise_multiplier,
                                                       self.tree_sensitivity())
        clip, size = (self.clip0, self.batch_size0) if start else (self.clip, self.batch_size)
        bounded, _ = clipping.clip_sum([clipping.Term(1.0 / size, rows, clip)], batch.sampler.relation)
        tree, released, event = tree.add(bounded, source)
        return released, tree, event


@dataclass(frozen=True)
class O2NCMulti(_Conversion):
    """DP-O2NC with the multi-pass oracle (Algorithm 4): every record at every step, Gaussian
    noise. The outer-loop hyper-parameters are :class:`O2NC`'s; ``noise_multiplier`` (z) is the
    difference steps', ``noise_multiplier0`` the period starts' (None = z)."""

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
    directions: int = 1

    def __post_init__(self) -> None:
        _check_outer(self)
        if self.noise_multiplier0 is not None:
            _validate.non_negative("noise_multiplier0", self.noise_multiplier0)

    @property
    def NOISE_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 (the name every algorithm uses)
        return ("noise_multiplier",) if self.noise_multiplier0 is None else ("noise_multiplier0", "noise_multiplier")

    @property
    def noise_ratios(self) -> tuple[float, ...]:
        if self.noise_multiplier0 is None:
            return (1.0,)
        return (self.noise_multiplier0 / self.noise_multiplier, 1.0) if self.noise_multiplier else (1.0, 1.0)

    def relation(self) -> dpa.NeighboringRelation:
        return sampling.FullBatch.relation

    def sampler(self, t: int, n: int) -> Sampler:
        return sampling.FullBatch(n)

    def _multiplier(self, t: int) -> float:
        z0 = self.noise_multiplier0
        return z0 if z0 is not None and t % self.period == 0 else self.noise_multiplier

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return dpa.ComposedDpEvent([dpa.GaussianDpEvent(self._multiplier(t)) for t in range(steps)])


    def release(self, state: O2NCState, batch: Batch, rows: clipping.Dense, start: bool,
                source: NoiseSource) -> tuple[Tensor, None, dpa.DpEvent]:
        """g̃_t = (Σ_i clip(·, C1) + N(0, (z0·2C1)²))/n at a period start, else
        g̃_{t−1} + (Σ_i clip(diff_i, C2) + N(0, (z·2C2)²))/n."""
        bounded, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip0 if start else self.clip)],
                                       batch.sampler.relation)
        noised, event = mechanisms.gaussian(bounded, self._multiplier(batch.t), source)
        increment = noised / batch.sampler.expected_size
        return (increment if start else state.released + increment), None, event


V = TypeVar("V")


def _o2nc_settings(variant: Callable[..., V], params: O2NCParams) -> Callable[..., V]:
    """``variant`` with the settings every O2NC variant reads already given: period Σ =
    ``batch_size``, clips C1 = ``clip`` and C2 = ``clip_diff``, smoothing ``alpha``, m =
    ``directions``, M = ``window``, D = ``o2nc_radius``."""
    _validate.positive_int("batch_size", params.batch_size, maximum=params.n, maximum_name="n (training records)")
    return functools.partial(variant, lr=params.lr, radius=params.o2nc_radius, window=params.window, alpha=params.alpha,
                             period=params.batch_size, clip0=params.clip, clip=params.clip_diff, noise_multiplier=1.0,
                             directions=params.directions)


def zeroth_from_params(params: O2NCParams) -> O2NC:
    """``o2nc-zeroth`` by name: the single pass with the zeroth-order oracle (B1 = Σ, B2 = 1)."""
    return _o2nc_settings(O2NC, params)(estimator="zeroth", batch_size0=params.batch_size, batch_size=1)


def first_from_params(params: O2NCParams) -> O2NC:
    """``o2nc-first`` by name: the single pass with the first-order oracle (B1 = Σ, B2 = 1)."""
    return _o2nc_settings(O2NC, params)(estimator="first", batch_size0=params.batch_size, batch_size=1)


def multi_from_params(params: O2NCParams) -> O2NCMulti:
    """``o2nc-multi`` by name: every record every step."""
    return _o2nc_settings(O2NCMulti, params)()
