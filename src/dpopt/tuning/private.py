"""``dpopt.tune``: private hyper-parameter selection whose cost is in the guarantee.

    tuned = dpopt.tune(lambda c: DPSGD(lr=c["lr"], clip=1.0, noise_multiplier=1.0, batch_size=256),
                       oracle, space=Space.grid(lr=[0.1, 0.3, 1.0]), trials=TruncatedNegativeBinomial(8, 1),
                       epsilon=1.0, delta=1e-5, steps=600, score=lambda theta: oracle.error(theta, X_val, y_val))

Every trial is a full private training run (:func:`dpopt.train.run`) of the algorithm ``build``
makes from a candidate, all with the same noise, calibrated by :func:`calibrate_tuning` so that
the best of K runs is (ε, δ)-DP: the event ``trials.wrap(planned)`` (dp_accounting's
``RepeatAndSelectDpEvent`` around one trial's planned event, RDP accountant) has ε(δ) ≤ ε. The
hyper-parameters the space varies must therefore leave the privacy event unchanged (step sizes,
clip norms, momenta: the noise multiplier is relative to the clip); a candidate that changes it
(batch size, steps) is refused. Each trial's ledger is checked against that planned event by the
run itself (double entry), and the tuning's ε is computed from the planned event the trials
were checked against.

The score (lower is better) must read only θ and data outside the training set (see
:mod:`dpopt.tuning.select`); the validation records are not protected by the guarantee.
The number of trials, the candidates and the trial noise are drawn from the operating system's
entropy unless ``seed`` is given.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch import Tensor

from .. import _validate, train
from ..accounting import canonical, noise_of, with_noise
from ..base import Algorithm, Oracle
from ..outputs import NOT_PRIVATE
from ..plan import Plan
from .select import Outcome, repeat_and_select
from .space import Space
from .trials import Trials

#: RepeatAndSelectDpEvent has an RDP bound only.
ACCOUNTANT = "rdp"


def tuning_plan(algorithm: Algorithm[Any], *, trials: Trials, epsilon: float, delta: float, n: int, steps: int,
                allow_large_delta: bool = False) -> Plan[Any]:
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
    hyperparameters: dict[str, Any] | None
    algorithm: Any | None
    final: dict[str, float]
    delta: float
    trial_epsilon: float
    trials: str
    accountant: str
    neighboring_relation: str
    randomness: str
    diagnostics: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        written = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return written | {"theta": None if self.theta is None else self.theta.tolist(),
                          "algorithm": None if self.algorithm is None else repr(self.algorithm)}


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


def tune(build: Callable[[Mapping[str, Any]], Any], oracle: Oracle, *, space: Space, trials: Trials,
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
    planned = canonical(plan.run_event)
    noise = noise_of(plan.algorithm)
    rng, run_seed = _seeds(seed)

    def trial(candidate: dict[str, Any], i: int) -> Outcome[tuple[Tensor, Any]]:
        trial_plan = plan.with_algorithm(with_noise(build(candidate), noise))
        if canonical(trial_plan.run_event) != planned:
            raise _validate.DpoptError(f"space: the candidate {candidate} changes the privacy event of a trial; "
                                       "tune only hyper-parameters that leave it unchanged (e.g. lr, clip), with "
                                       "batch size and steps fixed")
        history = train.train(trial_plan, oracle, train.Options(seed=run_seed(i), log_every=steps, progress=progress),
                              theta0)
        return Outcome(float(score(history.theta)), (history.theta, trial_plan.algorithm))

    selection = repeat_and_select(trial, space, trials, rng)
    passes = sum(plan.algorithm.sampler(t, n).expected_size for t in range(steps)) / n
    final = {"epsilon": plan.epsilon(), "expected_passes": trials.mean * passes}
    theta = algorithm = None
    if selection.best is not None:
        theta, algorithm = selection.best.result
        final["validation_score"] = selection.best.score
        if test_error is not None:
            final["test_error"] = float(test_error(theta))
    return Tuned(theta=theta, hyperparameters=selection.candidate, algorithm=algorithm, final=final, delta=delta,
                 trial_epsilon=dataclasses.replace(plan, selection=None).epsilon(), trials=repr(trials),
                 accountant=ACCOUNTANT, neighboring_relation=plan.relation_name,
                 randomness=train.origin(seed),
                 diagnostics={"label": NOT_PRIVATE, "trials_run": selection.trials_run,
                              "wall_time_s": time.perf_counter() - started} if diagnostics else None)
