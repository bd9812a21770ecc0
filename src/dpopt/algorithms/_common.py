"""What every algorithm shares: the :class:`Algorithm` protocol, the batch it is handed, output
rules, noise checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from .. import _validate, mechanisms
from ..sampling import BatchSampling, FullBatch, by_name

if TYPE_CHECKING:
    from .params import Params

OUTPUT_RULES = ("last", "uniform")


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


def check_noise(noise: mechanisms.Noise, sampling: BatchSampling) -> None:
    """``noise`` must be a :data:`mechanisms.Noise` object; noise that cannot be amplified by
    sampling (:class:`~dpopt.mechanisms.Discrete`: its zCDP event has no amplification bound in
    dp_accounting) only without sampling (:class:`~dpopt.sampling.FullBatch`)."""
    if not isinstance(noise, mechanisms.Continuous | mechanisms.Discrete):
        raise _validate.DpoptError(f"noise={noise!r} must be dpopt.mechanisms.CONTINUOUS or dpopt.mechanisms.DISCRETE")
    if not noise.amplifiable and sampling is not FullBatch:
        raise _validate.DpoptError(f"noise={noise!r} needs sampling=FullBatch, not sampling={sampling!r}: the discrete "
                                   "Gaussian is accounted as zCDP, which dp_accounting cannot amplify by sampling")


def noise_kind(params: Params) -> mechanisms.Noise:
    """The kind of noise ``params.noise`` names: the exact discrete Gaussian for "discrete", else
    continuous Gaussian noise (whose source, the run's seeded generator or the OS CSPRNG, is the
    run's: :func:`dpopt.mechanisms.source_named`)."""
    return mechanisms.DISCRETE if params.noise == "discrete" else mechanisms.CONTINUOUS


def batch_sampling(params: Params) -> BatchSampling:
    """The batch sampling ``params.sampling`` names, with ``params.batch_size`` checked against n."""
    _validate.positive_int("batch_size", params.batch_size, maximum=params.n, maximum_name="n (training records)")
    return by_name(params.sampling)
