"""One-run auditing statistics: reference values recomputed independently, validity on ideal
(ε, δ)-DP mechanisms whose true ε is known, power on a strong Gaussian mechanism, and bad inputs.

Mutants the tests catch: q = 1/(1 + e^ε) instead of e^ε/(1 + e^ε) (the bound runs to the cap:
the reference and validity tests fail), and dropping the δ term (the δ reference test, and the
(ε, δ) validity test, where ignoring δ refutes the true ε in most runs).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpopt.audit import one_run as one
from dpopt._validate import DpoptError

LEVEL = 0.05  # 1 − confidence


def _logit_of_all_correct(r: int) -> float:
    """δ = 0 and every one of r guesses right: q^r = LEVEL, so ε = logit(LEVEL^(1/r))."""
    q = LEVEL ** (1 / r)
    return math.log(q / (1 - q))


def _theorem(v: int, r: int, m: int, epsilon: float, delta: float) -> float:
    """The bound β + 2mδ·α written with CDFs: α = max_i (F(v−1) − F(v−i−1)) / i."""
    q = 1 / (1 + math.exp(-epsilon))
    i = np.arange(1, v + 1)
    alpha = np.max((stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - i - 1, r, q)) / i)
    return min(1.0, stats.binom.sf(v - 1, r, q) + 2 * m * delta * alpha)


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_all_correct_pure_dp_bound_is_the_closed_form(r):
    expected = _logit_of_all_correct(r)  # 1.82, 3.49, 5.81
    assert expected - one.GRID <= one.epsilon_lower_bound(r, r, 1000, 0.0, 0.95) <= expected


@pytest.mark.parametrize(("v", "r"), [(180, 200), (300, 500), (60, 100)])
def test_pure_dp_bound_inverts_the_binomial_tail(v, r):
    expected = optimize.brentq(lambda e: stats.binom.sf(v - 1, r, special.expit(e)) - LEVEL, 0, 20)
    assert expected - one.GRID <= one.epsilon_lower_bound(v, r, 1000, 0.0) <= expected


def test_chance_level_accuracy_refutes_nothing():
    assert one.epsilon_lower_bound(100, 200, 1000, 0.0) == 0.0
    assert one.epsilon_lower_bound(0, 0, 1000, 1e-5) == 0.0


@pytest.mark.parametrize(("v", "r", "m", "delta"), [(100, 100, 1000, 1e-4), (600, 600, 1000, 1e-4),
                                                    (170, 200, 1000, 1e-3)])
def test_delta_bound_is_the_theorem(v, r, m, delta):
    for epsilon in (0.5, 2.0, 4.0):
        assert one.p_values(v, r, m, np.array([epsilon]), delta)[0] == pytest.approx(
            _theorem(v, r, m, epsilon, delta), rel=1e-9, abs=1e-15)
    expected = optimize.brentq(lambda e: _theorem(v, r, m, e, delta) - LEVEL, 0, 20)
    bound = one.epsilon_lower_bound(v, r, m, delta)
    assert expected - one.GRID <= bound <= expected
    assert bound < one.epsilon_lower_bound(v, r, m, 0.0) - 0.05  # δ matters at these settings


def _exceedances(bounds: np.ndarray, true_epsilon: float) -> int:
    return int(np.sum(bounds > true_epsilon))


def _allowed(trials: int) -> int:
    """Exceedances are dominated by Binomial(trials, LEVEL); allow its 1 − 1e-6 quantile."""
    return int(stats.binom.ppf(1 - 1e-6, trials, LEVEL))


def _audit(scores: np.ndarray, included: np.ndarray, k: int, delta: float) -> float:
    guessed_in, guessed_out = one.guesses(scores, k, k)
    v = one.correct_guesses(guessed_in, guessed_out, included)
    return one.epsilon_lower_bound(v, 2 * k, included.size, delta)


def test_valid_and_informative_on_ideal_randomized_response():
    """ε-DP randomized response (flip each bit with probability 1/(1+e^ε)); a uniform jitter
    below the gap breaks ties (post-processing). Expected accuracy of the top/bottom guesses is
    q = 0.731, so r = 200 guesses give a median bound near logit(0.679) ≈ 0.75."""
    epsilon, m, k, trials = 1.0, 1000, 100, 300
    bounds = []
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        flipped = rng.random(m) < 1 / (1 + math.exp(epsilon))
        scores = (included ^ flipped) + 0.5 * rng.random(m)
        bounds.append(_audit(scores, included, k, 0.0))
    bounds = np.array(bounds)
    assert _exceedances(bounds, epsilon) <= _allowed(trials)
    assert 0.6 <= np.median(bounds) <= epsilon


def test_delta_is_needed_for_validity():
    """(0.5, 0.01)-DP per canary: with probability δ a canary's bit is revealed exactly,
    otherwise randomized response at ε = 0.5. The 8 extreme guesses are the revealed canaries
    in most runs; ignoring δ (the mutant) then refutes the true ε = 0.5 (q^8 = 0.022 < 0.05),
    the theorem's δ term does not."""
    epsilon, delta, m, k, trials = 0.5, 0.01, 1000, 4, 300
    honest, mutant = [], []
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        flipped = rng.random(m) < 1 / (1 + math.exp(epsilon))
        revealed = rng.random(m) < delta
        sign = np.where(included ^ (flipped & ~revealed), 1.0, -1.0)
        scores = sign * np.where(revealed, 10.0, 1.0) + 0.5 * rng.random(m)
        honest.append(_audit(scores, included, k, delta))
        mutant.append(_audit(scores, included, k, 0.0))
    assert _exceedances(np.array(honest), epsilon) <= _allowed(trials)
    assert _exceedances(np.array(mutant), epsilon) > _allowed(trials)


def test_strong_gaussian_mechanism_gets_the_all_correct_bound():
    """Scores 8·[included] + N(0, 1): the top and bottom 50 of 1000 are right (an error needs a
    4σ excursion past the other group's 90th percentile), so the bound is logit(0.05^(1/100))."""
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    scores = 8.0 * included + rng.standard_normal(1000)
    guessed_in, guessed_out = one.guesses(scores, 50, 50)
    assert one.correct_guesses(guessed_in, guessed_out, included) == 100
    expected = _logit_of_all_correct(100)  # 3.49
    assert expected - one.GRID <= _audit(scores, included, 50, 0.0) <= expected
    assert expected - 0.1 <= _audit(scores, included, 50, 1e-5) <= expected


def test_plan_beats_fixed_extremes_on_its_model():
    """Planned k for separation 2 against k = 10 and k = m/2, on the planning model itself."""
    m, mu = 1000, 2.0
    k_plus, k_minus = one.plan_guesses(m, mu, 1e-5)
    assert k_plus == k_minus and 10 < k_plus < m // 2
    realised = {k: [] for k in (10, k_plus, m // 2)}
    for seed in range(8):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        scores = mu * included + rng.standard_normal(m)
        for k, bounds in realised.items():
            bounds.append(_audit(scores, included, k, 1e-5))
    mean = {k: np.mean(bounds) for k, bounds in realised.items()}
    assert mean[k_plus] > max(mean[10], mean[m // 2]) + 0.1


def test_guesses_take_the_extremes_and_count_matches():
    scores = np.array([0.1, 0.9, 0.5, 0.3, 0.7, 0.5])
    guessed_in, guessed_out = one.guesses(scores, 2, 1)
    assert guessed_in.tolist() == [1, 4] and guessed_out.tolist() == [0]
    included = np.array([False, True, True, False, False, True])
    assert one.correct_guesses(guessed_in, guessed_out, included) == 2  # 1 in, 4 wrong, 0 out
    assert one.guesses(scores, 1, 2)[1].tolist() == [0, 3]
    tied_in, tied_out = one.guesses(np.zeros(4), 1, 1)
    assert tied_in.tolist() == [3] and tied_out.tolist() == [0]  # ties: by index


@pytest.mark.parametrize(("call", "message"), [
    (lambda: one.guesses(np.zeros(5), 6, 0), "k_plus=6 must be an integer >= 0 and <= 5"),
    (lambda: one.guesses(np.zeros(5), 3, 3), "k_minus=3 must be an integer >= 0 and <= 2"),
    (lambda: one.guesses(np.array([0.0, np.nan]), 1, 0), "scores"),
    (lambda: one.correct_guesses(np.array([0]), np.array([1]), np.array([1, 0])), "included"),
    (lambda: one.epsilon_lower_bound(5, 4, 10, 0.0), "correct=5 must be an integer >= 0 and <= 4"),
    (lambda: one.epsilon_lower_bound(4, 11, 10, 0.0), "guesses=11 must be an integer >= 0 and <= 10"),
    (lambda: one.epsilon_lower_bound(0, 0, 0, 0.0), "canaries=0 must be an integer >= 1"),
    (lambda: one.epsilon_lower_bound(1, 2, 10, -0.1), "delta=-0.1 must be in"),
    (lambda: one.epsilon_lower_bound(1, 2, 10, 0.0, 1.0), "confidence=1.0 must be in"),
    (lambda: one.plan_guesses(100, 0.0, 1e-5), "separation=0.0 must be > 0"),
])
def test_bad_inputs_name_the_argument(call, message):
    with pytest.raises(DpoptError, match=message.replace("(", r"\(").replace(".", r"\.")):
        call()
