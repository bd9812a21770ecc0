"""STORM (Cutkosky & Orabona 2019): non-private stochastic recursive momentum.

    d_0 = ∇f(x_0; B_0),   x_{t+1} = x_t − η_t d_t,
    d_{t+1} = ∇f(x_{t+1}; B_{t+1}) + (1 − a_{t+1}) (d_t − ∇f(x_t; B_{t+1}))

with batch means divided by the sampler's expected batch size. "constant": η_t = ``lr``,
a_t = ``momentum``. "adaptive" (the paper's rule): η_t = k/(w + Σ_{i≤t} G_i²)^{1/3} with
G_i = ‖∇f(x_i; B_i)‖, and a_{t+1} = min(1, c·η_t²). Privacy event: ``NonPrivateDpEvent`` every
step, so the ledger's ε is ∞. DP-SRM with zero noise and no clipping equals "constant" STORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, sampling
from ..base import Batch, NoiseSource, Oracle, Sampler
from ._common import batch_sampling

if TYPE_CHECKING:
    from .params import StormParams

STEP_RULES = ("constant", "adaptive")


class StormState(NamedTuple):
    theta: Tensor
    theta_prev: Tensor
    direction: Tensor
    sum_sq_grad: float
    next_momentum: float


@dataclass(frozen=True)
class Storm:
    """``lr`` and ``momentum`` (a) for "constant"; ``k``, ``w``, ``c`` for "adaptive"."""

    lr: float = 0.1
    momentum: float = 0.1
    batch_size0: int = 1
    batch_size: int = 1
    sampling: sampling.BatchSampling = sampling.Poisson
    step_rule: str = "constant"
    k: float = 0.1
    w: float = 0.1
    c: float = 10.0

    NOISE_FIELDS = ()
    noise_ratios = ()

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.unit_interval("momentum", self.momentum)
        _validate.positive_int("batch_size0", self.batch_size0)
        _validate.positive_int("batch_size", self.batch_size)
        sampling.check("sampling", self.sampling, (sampling.Poisson, sampling.FixedSize))
        _validate.one_of("step_rule", self.step_rule, STEP_RULES)
        for name in ("k", "w", "c"):
            _validate.positive(name, getattr(self, name))

    def relation(self) -> dpa.NeighboringRelation:
        return self.sampling.relation

    def sampler(self, t: int, n: int) -> Sampler:
        return self.sampling.of(n, self.batch_size0 if t == 0 else self.batch_size)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> StormState:
        return StormState(theta0.clone(), theta0.clone(), torch.zeros_like(theta0), 0.0, self.momentum)

    def step(self, state: StormState, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[StormState, dpa.DpEvent]:
        size = batch.sampler.expected_size
        ones = torch.ones(len(batch.indices), dtype=state.theta.dtype)
        grad = oracle.per_record(state.theta, batch.indices).weighted_sum(ones) / size
        if batch.t == 0:
            direction = grad
        else:
            grad_prev = oracle.per_record(state.theta_prev, batch.indices).weighted_sum(ones) / size
            direction = grad + (1 - state.next_momentum) * (state.direction - grad_prev)
        sum_sq = state.sum_sq_grad + float(grad @ grad)
        if self.step_rule == "constant":
            lr, next_momentum = self.lr, self.momentum
        else:
            lr = self.k / (self.w + sum_sq) ** (1 / 3)
            next_momentum = min(1.0, self.c * lr**2)
        theta = state.theta - lr * direction
        return StormState(theta, state.theta, direction, sum_sq, next_momentum), dpa.NonPrivateDpEvent()

    def output(self, state: StormState) -> Tensor:
        return state.theta

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.NonPrivateDpEvent(), steps)


def from_params(params: StormParams) -> Storm:
    """``storm`` by name (non-private): ``lr``, ``gamma`` (momentum), ``batch_size``, ``sampling``."""
    return Storm(lr=params.lr, momentum=params.gamma, batch_size0=params.first_batch, batch_size=params.batch_size,
                 sampling=batch_sampling(params))
