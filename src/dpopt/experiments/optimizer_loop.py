"""A reproduction's run as a practitioner writes it: :class:`dpopt.Private` and a torch optimizer.

Step t: ``Private.backward()`` releases g̃_t, the plan's algorithm's noised gradient at the
module's current parameters (its event goes to the ledger, checked against the plan); the
optimizer (SGD with momentum, Adam, …) takes its step from it at the learning rate of the
schedule, ``lr · schedule(t / T)``. The output is the last iterate θ_T, or the exponential moving
average of the iterates

    θ̄_t = β_t θ̄_{t−1} + (1 − β_t) θ_t,    β_t = min(β, (1 + t) / (10 + t)),   θ̄_0 = θ_0

(the usual warm-up of the decay, so that the first iterates do not weigh for long). Everything
after the release is post-processing of released values and of the public θ_0: the optimizer,
its state, the schedule and the average cost no privacy; the plan's ε is the run's. So loops that
differ only in their output run once together (:meth:`OptimizerLoop.run_outputs`): one run gives the
last iterate's history and each average's, each the one its own run would give.

Logged like :meth:`dpopt.experiments._runner.Problem.run`: at every ``log_every`` steps and at
the end the private metrics of the output so far (ε of the ledger, test error, expected data
passes) and, labelled NOT PRIVATE, the training wall and CPU time (evaluations not counted).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from .. import _validate
from ..base import S
from ..outputs import NOT_PRIVATE
from ..plan import Plan
from ..private import Private
from ..clock import StepClock
from ..train import History, all_finite
from ._runner import Problem

#: Learning-rate schedules by name: the factor of ``lr`` at the fraction f = t/T of the run.
SCHEDULES: dict[str, Callable[[float], float]] = {
    "constant": lambda f: 1.0,
    "cosine": lambda f: 0.5 * (1 + math.cos(math.pi * f)),
    "linear": lambda f: 1 - f,
}
#: Where an optimizer may be named from (a class taking ``params, lr=…, **options``).
OPTIMIZER_MODULES = ("torch.optim", "dpopt.optim")


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The optimizer class ``name`` ("torch.optim.SGD", "dpopt.optim.AdamBC", …); a DpoptError
    naming it if it is not in :data:`OPTIMIZER_MODULES` or does not exist (in this dpopt)."""
    module, _, attribute = name.rpartition(".")
    if module not in OPTIMIZER_MODULES:
        raise _validate.DpoptError(f"optimizer={name!r} must be a class of {' or '.join(OPTIMIZER_MODULES)}")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        raise _validate.DpoptError(f"optimizer={name!r} does not exist in this installation") from None
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise _validate.DpoptError(f"optimizer={name!r} is not a torch optimizer class")
    return found


@dataclass(frozen=True)
class OptimizerLoop:
    """``optimizer`` (a name for :func:`optimizer_class`) at learning rate ``lr`` with ``options``
    (name, value pairs, e.g. ``(("momentum", 0.9),)``), under ``schedule`` (a name of
    :data:`SCHEDULES`), its output the last iterate (``ema`` None) or the moving average of the
    iterates with decay ``ema`` = β ∈ (0, 1)."""

    optimizer: str
    lr: float
    options: tuple[tuple[str, Any], ...] = ()
    schedule: str = "constant"
    ema: float | None = None

    def __post_init__(self) -> None:
        optimizer_class(self.optimizer)
        _validate.positive("lr", self.lr)
        _validate.one_of("schedule", self.schedule, SCHEDULES)
        if self.ema is not None and not 0 < self.ema < 1:
            raise _validate.DpoptError(f"ema={self.ema!r} must be in (0, 1) (or None: the last iterate)")

    def optimizer_for(self, module: torch.nn.Module, private: Private) -> torch.optim.Optimizer:
        """The optimizer over ``module``'s parameters; one whose constructor takes ``private``
        (:class:`dpopt.optim.AdamBC`: it reads the noise variance of each release) is given it."""
        cls: Callable[..., torch.optim.Optimizer] = optimizer_class(self.optimizer)
        given = {"private": private} if "private" in inspect.signature(cls).parameters else {}
        return cls(module.parameters(), lr=self.lr, **given, **dict(self.options))

    def trajectory(self) -> OptimizerLoop:
        """What sets the iterates: this loop without its output rule (a moving average is
        post-processing of the iterates), so loops of equal trajectories can share a run."""
        return replace(self, ema=None)

    def run(self, problem: Problem, plan: Plan[S], seed: int, log_every: int) -> History:
        """One run of ``plan`` on ``problem`` (its oracle's module from θ0, its data, engine and
        chunks) with ``seed``, logged every ``log_every`` steps; the output's final metrics and the
        problem's (:meth:`Problem.completed`)."""
        return self.run_outputs(problem, plan, seed, log_every, (self,))[0]

    def run_outputs(self, problem: Problem, plan: Plan[S], seed: int, log_every: int,
                    loops: Sequence[OptimizerLoop]) -> list[History]:
        """:meth:`run` once, with the output of each of ``loops`` (of this loop's trajectory: the last
        iterate, moving averages of the iterates): each loop's history, in order, the one its own run
        would give (the same releases, iterates and measurements; stopped where an output is not
        finite) but for its training time, which counts every output's average."""
        if any(loop.trajectory() != self.trajectory() for loop in loops):
            raise ValueError(f"loops {loops!r} do not all take the iterates of {self.trajectory()!r}")
        oracle = problem.oracle
        module = copy.deepcopy(oracle.module)
        if problem.theta0 is not None:
            torch.nn.utils.vector_to_parameters(problem.theta0.to(oracle.dtype),
                                                [p for p in module.parameters() if p.requires_grad])
        private = Private(module, oracle.loss_fn, (oracle.X, oracle.y), algorithm=plan.algorithm, epsilon=None,
                          delta=plan.delta, steps=plan.steps, seed=seed, accountant=plan.accountant,
                          engine=oracle.engine, microbatch_size=oracle.microbatch_size,
                          allow_large_delta=plan.allow_large_delta)
        if private.plan.run_event != plan.run_event:  # the run spends what the plan calibrated, no more
            raise _validate.DpoptError(f"the run's planned event differs from the plan's ({private.plan.run_event} vs "
                                       f"{plan.run_event})")
        optimizer = self.optimizer_for(module, private)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: SCHEDULES[self.schedule](t / plan.steps))
        start = private.oracle.flat_params().double()
        averages = [None if loop.ema is None else start.clone() for loop in loops]
        decays = [(average, loop.ema) for average, loop in zip(averages, loops)
                  if average is not None and loop.ema is not None]
        per_step = plan.algorithm.sampler(0, plan.n).expected_size / plan.n
        records: list[list[dict[str, float]]] = [[] for _ in loops]
        logged: list[dict[str, float]] = []
        stopped = None

        def outputs() -> list[Tensor]:
            iterate = private.oracle.flat_params().double()
            return [iterate if average is None else average for average in averages]

        clock = StepClock()
        for t in private:
            private.backward()
            optimizer.step()
            schedule.step()
            if decays:  # the moving averages, from the iterate (read only where one is kept)
                iterate = private.oracle.flat_params().double()
                for average, ema in decays:
                    decay = min(ema, (1 + t) / (10 + t))
                    average.mul_(decay).add_(iterate, alpha=1 - decay)
            if (t + 1) % log_every == 0 or t + 1 == plan.steps:
                with clock.paused():
                    thetas = outputs()
                    shared = {"step": t + 1, "epsilon": private.epsilon()}
                    for kept, theta in zip(records, thetas):
                        kept.append(shared | {"test_error": problem.test_error(theta),
                                              "expected_passes": (t + 1) * per_step})
                    logged.append({"step": t + 1, "cpu_time_s": clock.cpu, "wall_time_s": clock.wall})
                if not all(all_finite(theta) for theta in thetas):
                    stopped = f"diverged at step {t + 1}: θ has non-finite entries"
                    break
        clock.stop()
        ledger = private.ledger
        final_time = {"cpu_time_s": clock.cpu, "wall_time_s": clock.wall}
        return [problem.completed(History(
            records=kept, final=dict(kept[-1]) | {"step": private.t}, theta=theta, delta=plan.delta,
            accountant=ledger.accountant, neighboring_relation=ledger.neighboring_relation, steps_done=private.t,
            randomness=private.stepper.origin, stopped=stopped,
            diagnostics={"label": NOT_PRIVATE, "records": [dict(row) for row in logged], "final": dict(final_time)},
            diverged_at=private.t if stopped else None)) for kept, theta in zip(records, outputs())]
