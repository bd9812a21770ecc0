"""``dpopt.tune``: private hyper-parameter selection whose cost is in the guarantee.

    tuned = dpopt.tune(lambda c: DPSGD(lr=c["lr"], clip=1.0, noise_multiplier=1.0, batch_size=256),
                       oracle, space=Space.grid(lr=[0.1, 0.3, 1.0]), trials=TruncatedNegativeBinomial(8, 1),
                       epsilon=1.0, delta=1e-5, steps=600, score=lambda theta: oracle.error(theta, X_val, y_val))

Every trial is a full private training run (:func:`dpopt.train.run`) of the algorithm ``build``
makes from a candidate, all with the same noise, calibrated by :func:`calibrate_tuning` so that
the best of K runs is (ε, δ)-DP: the event ``trials.wrap(planned)`` (dp_accounting's
``RepeatAndSelectDpEvent`` around one trial's planned event, RDP accountant) has ε(δ) ≤ ε. The
noise is calibrated on the space's reference candidate; most hyper-parameters leave the privacy
event unchanged (step sizes, clip norms, momenta: the noise multiplier is relative to the clip,
the update rule is post-processing). A candidate whose event differs at the same neighbouring
relation and the same expected batches (other bands of banded matrix factorisation, adaptive
clipping's count) runs at the smallest noise above the tuning's whose Rényi curve the
reference's dominates at every order (:mod:`dpopt.tuning.dominance`); one that changes the
relation or the expected batches (batch size, steps) is refused. Each trial's ledger is checked
against its own planned event by the run itself (double entry), and the tuning's ε is computed
from the reference's planned event, which dominates every trial's.

The score (lower is better) must read only θ and data outside the training set (see
:mod:`dpopt.tuning.select`); the validation records are not protected by the guarantee.
The number of trials, the candidates and the trial noise are drawn from the operating system's
entropy unless ``seed`` is given.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
from dp_accounting import DpEvent
from numpy.typing import NDArray
from torch import Tensor

from .. import _validate, report, seeding, train
from ..accounting import canonical, noise_of, with_noise
from ..base import Algorithm, Oracle
from ..outputs import NOT_PRIVATE
from ..plan import Plan
from . import dominance
from .select import Outcome, repeat_and_select
from ..json_types import JsonObject
from .space import Space, Value
from .trials import Trials

S = TypeVar("S")
#: RepeatAndSelectDpEvent has an RDP bound only.
ACCOUNTANT = "rdp"


def tuning_plan(algorithm: Algorithm[S], *, trials: Trials, epsilon: float, delta: float, n: int, steps: int,
                allow_large_delta: bool = False) -> Plan[S]:
    """The plan of a private tuning: the best of K ~ ``trials`` runs of ``algorithm`` for ``steps``
    steps, its noise multipliers (at their ratios) the smallest common scale with ε(δ) of
    ``trials.wrap(planned_event(n, steps))`` ≤ ``epsilon`` (RDP: repeat-and-select has an RDP bound
    only)."""
    return Plan(algorithm, n=n, steps=steps, delta=delta, accountant=ACCOUNTANT, selection=trials,
                allow_large_delta=allow_large_delta).calibrated(epsilon)


@dataclasses.dataclass
class Tuned:
    """The released result of a private tuning.

    ``theta``, ``hyperparameters`` (the selected candidate) and ``algorithm`` (its calibrated algorithm) are
    None when K = 0 (possible with :class:`~dpopt.tuning.trials.Poisson`): nothing is released.
    ``final``: ``epsilon``, the guarantee of the whole tuning and training; ``validation_score``
    of the selected θ; ``test_error`` of θ on the test data if given; ``expected_passes``, the
    expected data passes of the whole tuning (mean trials × one trial's passes, planned).
    ``trial_epsilon`` is one trial's ε alone (for comparison). ``diagnostics`` (only if asked for,
    NOT PRIVATE): the number of trials run and the wall time, which reveal K."""

    theta: Tensor | None
    hyperparameters: dict[str, Value] | None
    algorithm: Algorithm[Any] | None
    final: dict[str, float]
    delta: float
    trial_epsilon: float
    trials: str
    accountant: str
    neighboring_relation: str
    randomness: str
    diagnostics: dict[str, Any] | None = None

    def to_dict(self) -> JsonObject:
        written = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return written | {"theta": None if self.theta is None else self.theta.tolist(),
                          "algorithm": None if self.algorithm is None else report.settings(self.algorithm)}


class Dominated(Generic[S]):
    """The trials of a tuning calibrated by ``plan`` (its algorithm: the reference candidate's):
    :meth:`noised` gives a candidate's algorithm the tuning's noise, raised where its event is not
    the reference's until the reference's Rényi curve dominates its own, and checks it."""

    def __init__(self, plan: Plan[S]) -> None:
        self.plan = plan
        self.planned = canonical(plan.run_event)
        self.noise = noise_of(plan.algorithm)
        self.passes = self._passes(plan.algorithm)
        self._reference: NDArray[np.float64] | None = None
        self._scales: dict[str, float] = {}  # a candidate's event at the tuning's noise (its repr) → its scale

    def _passes(self, algorithm: Algorithm[S]) -> float:
        """The planned expected data passes of one run of ``algorithm``."""
        plan = self.plan
        return sum(algorithm.sampler(t, plan.n).expected_size for t in range(plan.steps)) / plan.n

    @property
    def reference(self) -> NDArray[np.float64]:
        """The reference run's Rényi curve (computed once, when a candidate first needs it)."""
        if self._reference is None:
            self._reference = dominance.curve(self.plan.run_event, self.plan.relation)
        return self._reference

    def noised(self, algorithm: Algorithm[S], candidate: Mapping[str, Value]) -> Algorithm[S]:
        """``algorithm`` (built from ``candidate``) at the tuning's noise times the smallest scale ≥ 1
        whose run's curve the reference's dominates (1: the same event); refused if its relation or
        its expected batches differ from the reference's, and checked before it runs."""
        noised = with_noise(algorithm, self.noise)
        event = canonical(noised.planned_event(self.plan.n, self.plan.steps))
        if event == self.planned:
            return noised
        if noised.relation() != self.plan.relation or not math.isclose(self._passes(noised), self.passes,
                                                                          rel_tol=1e-9):
            raise _validate.DpoptError(f"space: the candidate {dict(candidate)} changes the privacy event of a trial "
                                       "beyond what its noise can be raised for (its neighbouring relation or its "
                                       "expected batches); tune hyper-parameters such as lr, clip, bands, "
                                       "clip_quantile or optimizer, with batch size and steps fixed")
        key = repr(event)
        if key not in self._scales:
            self._scales[key] = dominance.dominating_scale(lambda s: self._scaled(noised, s), self.reference,
                                                           self.plan.relation)
        return self.checked(with_noise(noised, {f: self._scales[key] * z for f, z in self.noise.items()}))

    def _scaled(self, algorithm: Algorithm[S], scale: float) -> DpEvent:
        return with_noise(algorithm, {f: scale * z for f, z in self.noise.items()}).planned_event(self.plan.n,
                                                                                                  self.plan.steps)

    def checked(self, algorithm: Algorithm[S]) -> Algorithm[S]:
        """``algorithm``, whose run's curve must be at most the reference's at every order."""
        if not dominance.dominated(algorithm.planned_event(self.plan.n, self.plan.steps), self.reference,
                                   self.plan.relation):
            raise _validate.DpoptError(f"{algorithm!r}: its run's Rényi curve exceeds the reference candidate's at "
                                       "some order, so the tuning's guarantee would not cover it")
        return algorithm


def _seeds(seed: int | None) -> tuple[np.random.Generator, Callable[[int], int | None]]:
    """The tuning's secret generator (K and candidates) and each trial's run seed (None: the run
    seeds itself from the operating system)."""
    if seed is not None:
        _validate.non_negative("seed", seed)
    root = np.random.SeedSequence(seed if seed is not None else int.from_bytes(os.urandom(16), "little"))
    selection, runs = root.spawn(2)
    if seed is None:
        return np.random.default_rng(selection), lambda i: None
    return np.random.default_rng(selection), lambda i: int(
        np.random.SeedSequence(runs.entropy, spawn_key=(*runs.spawn_key, i)).generate_state(1)[0])


def tune(build: Callable[[Mapping[str, Value]], Algorithm[S]], oracle: Oracle, *, space: Space, trials: Trials,
         epsilon: float, delta: float, steps: int, score: Callable[[Tensor], float], seed: int | None = None,
         theta0: Tensor | None = None, test_error: Callable[[Tensor], float] | None = None,
         diagnostics: bool = False, progress: bool = False, allow_large_delta: bool = False) -> Tuned:
    """Select hyper-parameters privately: the best of K ~ ``trials`` private runs, (ε, δ)-DP in total.

    ``build(candidate)`` returns the algorithm (noise multipliers at their ratios, as
    :mod:`dpopt.algorithms.registry` leaves them) for a candidate drawn from ``space``;
    ``score(θ)`` (lower is better) must be computed on data outside the training set, e.g. the
    error on a held-out validation split; ``test_error(θ)`` is reported for the selected θ only.
    ``delta`` must be below 1/n unless ``allow_large_delta`` (:class:`dpopt.plan.Plan`).
    """
    started = time.perf_counter()
    n = oracle.n
    plan = tuning_plan(build(space.reference()), trials=trials, epsilon=epsilon, delta=delta, n=n, steps=steps,
                       allow_large_delta=allow_large_delta)
    within = Dominated(plan)
    rng, run_seed = _seeds(seed)

    def trial(candidate: dict[str, Value], i: int) -> Outcome[tuple[Tensor, Algorithm[S]]]:
        trial_plan = plan.with_algorithm(within.noised(build(candidate), candidate))
        history = train.train(trial_plan, oracle, train.Options(seed=run_seed(i), log_every=steps, progress=progress),
                              theta0)
        return Outcome(float(score(history.theta)), (history.theta, trial_plan.algorithm))

    selection = repeat_and_select(trial, space, trials, rng)
    final = {"epsilon": plan.epsilon(), "expected_passes": trials.mean * within.passes}
    theta = algorithm = None
    if selection.best is not None:
        theta, algorithm = selection.best.result
        final["validation_score"] = selection.best.score
        if test_error is not None:
            final["test_error"] = float(test_error(theta))
    return Tuned(theta=theta, hyperparameters=selection.candidate, algorithm=algorithm, final=final, delta=delta,
                 trial_epsilon=dataclasses.replace(plan, selection=None).epsilon(), trials=str(trials),
                 accountant=ACCOUNTANT, neighboring_relation=plan.relation_name,
                 randomness=seeding.origin(seed),
                 diagnostics={"label": NOT_PRIVATE, "trials_run": selection.trials_run,
                              "wall_time_s": time.perf_counter() - started} if diagnostics else None)
