"""One-run privacy auditing: an ε lower bound from m canaries in a single training run.

Steinke, Nasr, Jagielski (2023), "Privacy Auditing with One (1) Training Run". Each of m
canaries is included independently with probability ½ (inclusion bits S ∈ {±1}^m, drawn by the
auditor); the algorithm runs once and every canary gets a score (higher = "looks included").
The auditor guesses "included" for the k₊ highest scores, "excluded" for the k₋ lowest and
abstains on the rest: r = k₊ + k₋ guesses, W of them correct.

The paper's main theorem: if the algorithm is (ε, δ)-DP with respect to each canary's inclusion
(add/remove-one adjacency, whatever the other canaries' bits), then for every v,

    P[W ≥ v] ≤ β + 2mδ·α,  with q = e^ε/(1 + e^ε) (the accuracy of ε-randomized response),
    β = P[Binomial(r, q) ≥ v],  α = max_{1 ≤ i ≤ v} P[v − i ≤ Binomial(r, q) < v] / i.

For δ = 0 this says W is stochastically dominated by Binomial(r, q): the canaries' guesses
can do no better than r independent ε-randomized responses, with no group-privacy cost. The
right-hand side, p(ε), is a p-value for the hypothesis "(ε, δ)-DP" given W = v: with v₀ the
least v where p(ε) < 1 − confidence, a rejection means W ≥ v₀, whose probability is at most
p(ε) evaluated at v₀, below 1 − confidence. The δ term grows with m, so δ must be well below
1/(2m) for it not to swamp the bound.

The bound reported is the largest grid point ε̂ = j·h (h = ``GRID``) with p(i·h) < 1 −
confidence for every i ≤ j. It is valid without assuming p monotone in ε: if the algorithm is
(ε*, δ)-DP it is also (i·h, δ)-DP for the first grid point i·h ≥ ε*, and ε̂ > ε* needs
p(i·h) < 1 − confidence at that fixed point, an event of probability ≤ 1 − confidence. The
grid costs at most h of the bound.

Confidence is spent only by the final test: k₊ and k₋ must be fixed before the scores are seen
(:func:`plan_guesses` picks them from the audit's configuration alone).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, special, stats

from dpopt import _validate
from dpopt._validate import DpoptError

GRID = 0.01
"""Step h of the ε grid on which the bound is searched (the bound loses at most h)."""
_EPSILON_CAP = 50.0  # p(ε) → 1 as ε → ∞ (q → 1); at 50, q rounds to 1 and p(50) = 1.
_CHUNK = 64  # grid points evaluated at once


def guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices guessed included (the ``k_plus`` highest scores) and excluded (the ``k_minus``
    lowest). Ties are broken by canary index (stable sort), which is fixed before the inclusion
    bits are drawn and so leaks nothing."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
        raise DpoptError(f"scores (shape {scores.shape}) must be a non-empty 1-D array of finite numbers")
    m = scores.size
    _count("k_plus", k_plus, m)
    _count("k_minus", k_minus, m - k_plus)
    order = np.argsort(scores, kind="stable")
    return np.sort(order[m - k_plus:]), np.sort(order[:k_minus])


def correct_guesses(guessed_in: np.ndarray, guessed_out: np.ndarray, included: np.ndarray) -> int:
    """W: how many guesses match the true inclusion bits ``included`` (booleans, one per canary)."""
    included = np.asarray(included)
    if included.ndim != 1 or included.dtype != bool:
        raise DpoptError(f"included (dtype {included.dtype}, shape {included.shape}) must be a 1-D boolean array")
    return int(included[guessed_in].sum() + (~included[guessed_out]).sum())


def p_values(correct: int, guesses: int, canaries: int, epsilons: np.ndarray, delta: float) -> np.ndarray:
    """p(ε) = min(1, β + 2mδ·α) of the module docstring at each ε in ``epsilons``: an upper bound
    on the probability that an (ε, δ)-DP algorithm yields ≥ ``correct`` correct out of
    ``guesses`` guesses among ``canaries`` canaries."""
    v, r, m = correct, guesses, canaries
    q = special.expit(np.asarray(epsilons, dtype=float))[:, None]
    beta = stats.binom.sf(v - 1, r, q[:, 0])
    if delta == 0 or v == 0:
        return np.minimum(1.0, beta)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)    # P[Bin = v−1], …, P[Bin = 0]
    alpha = np.max(np.cumsum(below, axis=1) / np.arange(1, v + 1), axis=1)  # P[v−i ≤ Bin < v]/i
    return np.minimum(1.0, beta + 2 * m * delta * alpha)


def epsilon_lower_bound(correct: int, guesses: int, canaries: int, delta: float,
                        confidence: float = 0.95) -> float:
    """ε̂: with probability ≥ ``confidence`` an (ε, δ)-DP algorithm has ε ≥ ε̂ (module docstring).

    ``correct`` of ``guesses`` guesses were right, among ``canaries`` canaries each included
    independently with probability ½. Returns 0.0 when nothing can be refuted.
    """
    _count("canaries", canaries, None, minimum=1)
    _count("guesses", guesses, canaries)
    _count("correct", correct, guesses)
    _validate.unit_interval("delta", delta, include_zero=True)
    level = 1 - _validate.open_unit("confidence", confidence)
    grid = np.arange(0, round(_EPSILON_CAP / GRID) + 1) * GRID
    for start in range(0, grid.size, _CHUNK):
        failed = np.flatnonzero(p_values(correct, guesses, canaries, grid[start:start + _CHUNK], delta) >= level)
        if failed.size:
            return round(float(grid[start + failed[0] - 1]), 10) if start + failed[0] else 0.0
    return _EPSILON_CAP


def plan_guesses(canaries: int, separation: float, delta: float, confidence: float = 0.95,
                 ) -> tuple[int, int]:
    """(k₊, k₋) that maximise the expected bound, chosen from the configuration alone
    (:func:`expected_bound`); no score or inclusion bit is read, so the choice spends no confidence."""
    k, _ = expected_bound(canaries, separation, delta, confidence)
    return k, k


def expected_bound(canaries: int, separation: float, delta: float, confidence: float = 0.95) -> tuple[int, float]:
    """The best k = k₊ = k₋ and the bound it gets at the expected outcome of the planning model.

    The planning model: a canary's score is ``separation``·[included] + N(0, 1) (a Gaussian
    mechanism with that signal-to-noise ratio, e.g. the one the claimed ε implies). For k = k₊ =
    k₋ guesses per side, the threshold t with (m/2)(Φ̄(t − μ) + Φ̄(t)) = k gives an expected
    2·(m/2)·Φ̄(t − μ) correct out of 2k; k is the candidate (on a geometric grid) whose rounded-down
    expectation gets the largest :func:`epsilon_lower_bound`.
    """
    _count("canaries", canaries, None, minimum=2)
    mu = _validate.positive("separation", separation)
    half = canaries / 2
    best, best_bound = 1, -1.0
    for k in np.unique(np.geomspace(1, canaries // 2, 25).astype(int)):
        t = optimize.brentq(lambda x: half * (special.ndtr(mu - x) + special.ndtr(-x)) - k, -50, mu + 50)
        correct = int(2 * half * special.ndtr(mu - t))
        bound = epsilon_lower_bound(min(correct, 2 * int(k)), 2 * int(k), canaries, delta, confidence)
        if bound > best_bound:
            best, best_bound = int(k), bound
    return best, best_bound


def _count(name: str, value: int, maximum: int | None, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum \
            or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise DpoptError(f"{name}={value!r} must be an integer >= {minimum}{upper}")
    return int(value)
