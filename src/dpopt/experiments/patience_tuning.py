"""The DIFF2 paper's tuning procedure (Murata & Suzuki 2023, appendix A), reusable by any preset,
with the privacy it costs.

For every point of a method's grid (e.g. C1, C2, T), step sizes η are tried from large to small
(0.5^i, i = 0 … 9). A run's training loss is checked every ``check_every`` rounds; the run is
abandoned when the loss is not finite, or when the patience count reaches ``patience``: the
count goes up by one at a check whose loss exceeds ``factor`` × the best loss of this run so
far and is reset to 0 at a check that improves on it. The first η whose run completes is kept
for the point; the point with the lowest final training loss wins.

**Privacy.** Every run, abandoned or not, looks at the private data; the paper does not account
for it. Here each run's ledger is kept and the cost of the whole tuning is reported as the ε of
the plain composition of every run's spent events (an upper bound; the selection of the best run
is post-processing of them). dp_accounting's ``RepeatAndSelectDpEvent`` (Papernot & Steinke
2022) would be tighter, but it needs the number of runs to be random (Poisson or truncated
negative binomial); this deterministic search does not qualify, so it is not used.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Hashable, Sequence
from typing import TypedDict

import dp_accounting as dpa
import torch

from .. import train
from ..accounting import Ledger, epsilon_of
from ..base import S
from ..outputs import NOT_PRIVATE
from ..plan import Plan
from ..progress import bar as progress_bar
from ..jobs import Pool
from ._runner import Method, Params, Problem, grid_points
from .payload import Tuned

#: η = 0.5^i, i = 0 … 9, from large to small.
STEP_SIZES = tuple(0.5**i for i in range(10))


def patience_run(plan: Plan[S], problem: Problem, seed: int, *, check_every: int = 20,
                 patience: int = 5, factor: float = 1.05) -> tuple[float, Ledger, int]:
    """One tuning run of ``plan`` (the loop of :func:`dpopt.train.train`, by its
    :class:`~dpopt.train.Stepper`) with the abandon rule.

    Returns (final training loss, or NaN if abandoned; the run's ledger; rounds run)."""
    oracle = problem.oracle
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64) if problem.theta0 is None else problem.theta0.double()
    stepper = train.Stepper.start(plan, oracle, theta0=theta0, seed=seed)
    best, strikes, loss = math.inf, 0, math.nan
    for t in range(plan.steps):
        stepper.step()
        if (t + 1) % check_every and t + 1 < plan.steps:
            continue
        loss = float(oracle.loss(stepper.state.theta))
        if not math.isfinite(loss):
            return math.nan, stepper.ledger, t + 1
        if loss > factor * best:
            strikes += 1
            if strikes >= patience:
                return math.nan, stepper.ledger, t + 1
        elif loss < best:
            strikes = 0
        best = min(best, loss)
    return loss, stepper.ledger, plan.steps


def patience_tune(method: Method, problem: Problem, *, epsilon: float, delta: float, seeds: Sequence[int],
                  progress: bool = False, pool: Pool | None = None, key: Hashable = None,
                  step_sizes: Sequence[float] = STEP_SIZES, check_every: int = 20, patience: int = 5,
                  factor: float = 1.05) -> Tuned:
    """The paper's search over ``method.grid`` × ``step_sizes`` (one run per trial, on
    ``seeds[0]``), with :func:`dpopt.experiments._runner.explore_grid`'s signature (``pool`` unused: the
    trials are sequential by nature). Returns the choice (grid point and ``lr``), every point's
    score and the cost: runs, rounds, wall seconds, and ``epsilon_composed``, the ε(δ) of all the
    runs' events composed (0 for a non-private method); labelled NOT PRIVATE (the scores are
    training losses without noise; the private selection is :func:`dpopt.tuning.tune`)."""
    start = time.perf_counter()
    scores: list[_Score] = []
    ledgers, rounds = [], 0
    n = problem.oracle.n
    points = grid_points(method.grid)
    with progress_bar(len(points), desc=f"tune {method.name} ε={epsilon}", unit="point", enabled=progress) as bar:
        for point in points:
            algorithm, steps = method.build(n, {**point, "lr": step_sizes[0]})
            plan = Plan(algorithm, n=n, steps=steps, delta=delta, allow_large_delta=True)  # the paper's δ
            if method.private:  # η does not change the noise: one calibration per point
                plan = plan.calibrated(epsilon)
            score: _Score = {"params": point, "objective": math.inf, "lr": None, "abandoned": []}
            for lr in step_sizes:
                stepped = plan.with_algorithm(dataclasses.replace(plan.algorithm, lr=lr))
                loss, ledger, ran = patience_run(stepped, problem, seeds[0], check_every=check_every,
                                                 patience=patience, factor=factor)
                ledgers.append(ledger)
                rounds += ran
                if math.isfinite(loss):
                    score["objective"], score["lr"] = loss, lr
                    break
                score["abandoned"].append(lr)
            scores.append(score)
            bar.update()
    best = min(scores, key=lambda s: s["objective"])
    return {"label": NOT_PRIVATE, "chosen": {**best["params"], "lr": best["lr"]}, "scores": scores,
            "cost": {"runs": len(ledgers), "rounds": rounds, "wall_time_s": time.perf_counter() - start,
                     "epsilon_composed": composed_epsilon(ledgers, delta) if method.private else 0.0}}


class _Score(TypedDict):
    """A grid point's result: its final training loss (+∞ if every η was abandoned), the η kept
    (None: none) and the η abandoned."""

    params: Params
    objective: float
    lr: float | None
    abandoned: list[float]


def composed_epsilon(ledgers: Sequence[Ledger], delta: float) -> float:
    """ε(δ) of every ledger's events composed (all under the first ledger's relation)."""
    event = dpa.ComposedDpEvent([ledger.event() for ledger in ledgers])
    return epsilon_of(event, delta, ledgers[0].relation, ledgers[0].requested_accountant)
