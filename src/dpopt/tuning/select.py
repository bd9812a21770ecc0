"""Random-stopping repeat-and-select (Papernot & Steinke 2022): draw K, run K independent trials,
keep the best one.

What "best" may read: each trial's score must be a function of that trial's own private output
(its θ) and of data outside the protected training set (a held-out validation split), never of
the training data itself; the score is then part of the trial's private output and choosing the
minimum is post-processing. Only the selected trial leaves this function with its candidate;
K and the other trials' candidates and scores are dropped (K is returned to the caller only as a
non-private diagnostic).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from .space import Space, Value
from .trials import Trials

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One trial's private output: its ``score`` (lower is better; NaN counts as +∞) and ``result``."""

    score: float
    result: T


@dataclass(frozen=True)
class Selection(Generic[T]):
    """The best trial (None when K = 0), its candidate, and K (NOT PRIVATE: a diagnostic)."""

    best: Outcome[T] | None
    candidate: dict[str, Value] | None
    trials_run: int


def repeat_and_select(trial: Callable[[dict[str, Value], int], Outcome[T]], space: Space, trials: Trials,
                      rng: np.random.Generator) -> Selection[T]:
    """K = ``trials.draw(rng)``; for i < K, a candidate c_i = ``space.draw(rng)`` and ``trial(c_i, i)``;
    the outcome with the smallest score wins (the first among ties). ``rng`` must be secret."""
    count = trials.draw(rng)
    best: Outcome[T] | None = None
    chosen: dict[str, Value] | None = None
    for i in range(count):
        candidate = space.draw(rng)
        outcome = trial(candidate, i)
        if best is None or _key(outcome.score) < _key(best.score):
            best, chosen = outcome, candidate
    return Selection(best, chosen, count)


def _key(score: float) -> float:
    return math.inf if math.isnan(score) else score
