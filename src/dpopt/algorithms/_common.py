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


def check_noise(noise: str, sampling: str) -> None:
    """``noise`` must be one of :data:`mechanisms.NOISES`; discrete noise only without sampling
    (``sampling="full"``): its zCDP event has no amplification-by-sampling bound in dp_accounting."""
    _validate.one_of("noise", noise, mechanisms.NOISES)
    if noise == "discrete" and sampling != "full":
        raise _validate.DpoptError(f"noise='discrete' needs sampling='full', not sampling={sampling!r}: the discrete "
                                   "Gaussian is accounted as zCDP, which dp_accounting cannot amplify by sampling")
