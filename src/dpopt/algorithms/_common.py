"""What every algorithm shares: the batch it is handed, output rules, step-size rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .. import _validate, mechanisms
from ..sampling import Sampler

OUTPUT_RULES = ("last", "uniform")


@dataclass(frozen=True)
class Batch:
    """The records step ``t`` sees and the sampler that chose them (for ``wrap`` and the
    public divisor ``sampler.expected_size``)."""

    t: int
    indices: Tensor
    sampler: Sampler


class Output(NamedTuple):
    """Output-rule state: the iterate chosen so far and the step it is taken at.

    "last" returns the final iterate θ^T. "uniform" returns θ^R with R drawn uniformly from
    {0, …, T−1} at the start (data-independent, so free of privacy cost); only θ^R is kept.
    """

    pick: int
    chosen: Tensor


def output_init(rule: str, theta0: Tensor, steps: int, gen: torch.Generator) -> Output:
    _validate.one_of("output", rule, OUTPUT_RULES)
    pick = int(torch.randint(steps, (1,), generator=gen)) if rule == "uniform" else -1
    return Output(pick, theta0.clone())


def output_track(out: Output, t: int, theta: Tensor) -> Output:
    """Call with θ^t before step t updates it."""
    return out._replace(chosen=theta.clone()) if t == out.pick else out


def output_value(out: Output, theta_last: Tensor) -> Tensor:
    return theta_last if out.pick < 0 else out.chosen


def check_noise(noise: mechanisms.Noise, sampling: str) -> None:
    """``noise`` must be a :data:`mechanisms.Noise` object; noise that cannot be amplified by
    sampling (:class:`~dpopt.mechanisms.Discrete`: its zCDP event has no amplification bound in
    dp_accounting) only without sampling (``sampling="full"``)."""
    if not isinstance(noise, mechanisms.Continuous | mechanisms.Discrete):
        raise _validate.DpoptError(f"noise={noise!r} must be dpopt.mechanisms.CONTINUOUS or dpopt.mechanisms.DISCRETE")
    if not noise.amplifiable and sampling != "full":
        raise _validate.DpoptError(f"noise={noise!r} needs sampling='full', not sampling={sampling!r}: the discrete "
                                   "Gaussian is accounted as zCDP, which dp_accounting cannot amplify by sampling")
