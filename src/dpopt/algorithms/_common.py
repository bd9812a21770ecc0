"""What every algorithm shares: the :class:`Algorithm` protocol, the batch it is handed, output
rules, noise checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from dp_accounting import DpEvent, NeighboringRelation
from torch import Tensor

from .. import _validate, mechanisms
from ..sampling import BatchSampling, FullBatch, Sampler

OUTPUT_RULES = ("last", "uniform")


@runtime_checkable
class Algorithm(Protocol):
    """A private optimiser: a frozen dataclass of hyper-parameters, validated in ``__post_init__``.

    ``step`` returns the new state and the event of everything it released, built only from what
    its mechanisms returned (wrapped by the batch's sampler); ``planned_event(n, steps)`` is the
    independent description of the whole run that calibrates the noise and that the ledger is
    checked against (:func:`dpopt.accounting.guarantee`). ``NOISE_FIELDS`` name the noise
    multipliers :func:`dpopt.accounting.calibrate` scales, in the ratios ``noise_ratios``.
    """

    NOISE_FIELDS: tuple[str, ...]
    noise_ratios: tuple[float, ...]

    def relation(self) -> NeighboringRelation: ...

    def sampler(self, t: int, n: int) -> Sampler: ...

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> Any: ...

    def step(self, state: Any, batch: Batch, oracle: Any, source: mechanisms.NoiseSource) -> tuple[Any, DpEvent]: ...

    def output(self, state: Any) -> Tensor: ...

    def planned_event(self, n: int, steps: int) -> DpEvent: ...


@runtime_checkable
class Directed(Protocol):
    """An algorithm whose update is θ_{t+1} = θ_t − η_t·g̃_t, with g̃_t its private gradient estimate
    (its noised release after its own post-processing, e.g. momentum): ``direction(state)`` is
    the g̃_t of the step that produced ``state``, and ``moved(state, theta)`` is that state with
    θ_{t+1} replaced by ``theta`` (what another update rule, e.g. a ``torch.optim`` optimizer,
    made of g̃_t: post-processing, no privacy cost). The state's other parts (momentum, output
    rule, averages) then follow ``theta``. :class:`dpopt.Private` hands g̃_t to the user's optimizer
    through these two methods and nothing else: the estimate comes from ``step``, the code path
    of :func:`dpopt.run`."""

    def direction(self, state: Any) -> Tensor: ...

    def moved(self, state: Any, theta: Tensor) -> Any: ...


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


def check_noise(noise: mechanisms.Noise, sampling: BatchSampling) -> None:
    """``noise`` must be a :data:`mechanisms.Noise` object; noise that cannot be amplified by
    sampling (:class:`~dpopt.mechanisms.Discrete`: its zCDP event has no amplification bound in
    dp_accounting) only without sampling (:class:`~dpopt.sampling.FullBatch`)."""
    if not isinstance(noise, mechanisms.Continuous | mechanisms.Discrete):
        raise _validate.DpoptError(f"noise={noise!r} must be dpopt.mechanisms.CONTINUOUS or dpopt.mechanisms.DISCRETE")
    if not noise.amplifiable and sampling is not FullBatch:
        raise _validate.DpoptError(f"noise={noise!r} needs sampling=FullBatch, not sampling={sampling!r}: the discrete "
                                   "Gaussian is accounted as zCDP, which dp_accounting cannot amplify by sampling")
