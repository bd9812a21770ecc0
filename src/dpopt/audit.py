"""Empirical privacy audit: a statistical lower bound on ε, by the canary method.

Jagielski, Ullman, Oprea (2020) and Nasr, Song, Thakurta, Papernot, Carlini (2021): run the
algorithm many times on a data set D and on its neighbour D′ (D with one canary record), score
each final output, and test "D or D′?" by a threshold on the score. An (ε, δ)-DP algorithm
forces every test to have FPR·e^ε + FNR ≥ 1 − δ (and symmetrically), so

    ε ≥ ln((1 − δ − FNR) / FPR)      and      ε ≥ ln((1 − δ − FPR) / FNR).

With one-sided Clopper–Pearson upper bounds on FPR and FNR (each at level α/2, α = 1 −
``confidence``; a union bound), the right-hand sides hold for the true ε with probability ≥
``confidence``. The threshold is chosen on the first half of each side's runs and the bound
computed on the second half, so choosing it costs no confidence.

The canary world is a one-parameter ridge problem, f_i(θ) = ½(⟨x_i, θ⟩ − y_i)², so every record
has a gradient that the audit controls (a gradient canary, white-box):

* D′'s last record is the canary, x = u, y = −M: gradient ≈ M·u with M huge, so clipping sets it
  to the largest contribution the mechanism allows, always in the direction u;
* D's last record is, under add/remove-one adjacency, neutral (x = 0, y = 0: gradient and loss 0
  whatever θ is, so D with it is D with it removed; both worlds run the same sampler, at a public
  rate), and under replace-one the anti-canary (x = u, y = +M: the largest contribution toward −u);
* the other n records are the background (:class:`Canary`): zero gradients for algorithms that
  clip per record (nothing else moves θ), or gradients ≈ −A·u pushing the opposite way for
  algorithms that clip an aggregate (AClip: clip(mean) is −λu without the canary and +λu with it,
  the 2λ its sensitivity accounts for).

The score is −⟨output, u⟩ (the canary pulls θ toward −u). Runs are cheap (d = 1), so a
thousand runs per side take seconds to minutes. The claimed ε is the accountant's ε(δ) of the
algorithm's ``planned_event``, the same description that calibrates it and that the ledger
records.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from dp_accounting import NeighboringRelation
from scipy import stats

from . import _validate, train
from .accounting import Ledger, epsilon_of
from .oracles import Ridge

#: The canary's target: its gradient ≈ M·u dwarfs any clip norm and the whole background.
CANARY_PULL = 1e12


@dataclass(frozen=True)
class Canary:
    """How the canary world of one algorithm is built: ``background`` = A, the background records'
    pull against the canary (gradient ≈ −A·u each; 0 for zero gradients)."""

    background: float = 0.0


#: The canary world per algorithm name (one entry per algorithm; a new algorithm adds one line).
CANARIES: dict[str, Canary] = {
    "dp-sgd": Canary(), "dp-gd": Canary(), "rrpsgd": Canary(), "dp-srm": Canary(), "dp-agd": Canary(),
    "storm": Canary(), "o2nc-zeroth": Canary(), "o2nc-first": Canary(), "o2nc-multi": Canary(),
    "diff2-gd": Canary(), "diff2-bvr": Canary(),
    "aclip": Canary(background=1e6),  # the clipped mean flips from −λu to +λu: the 2λ is attained
}


@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` measured; :meth:`to_dict` is the ``dpopt audit --json`` payload."""

    algorithm: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    confidence: float
    runs: int
    false_positive_rate: float
    false_negative_rate: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claim: with probability ≥ ``confidence`` the claim is false."""
        return self.epsilon_lower_bound > self.claimed_epsilon


def canary_oracle(n: int, canary: Canary, relation: NeighboringRelation, *, present: bool) -> Ridge:
    """The n + 1 records of D′ (``present=True``: the canary last) or of D (the neutral record
    under add/remove-one, the anti-canary under replace-one)."""
    X = torch.ones(n + 1, 1, dtype=torch.float64)
    y = torch.full((n + 1,), canary.background, dtype=torch.float64)
    if canary.background == 0:
        X[:n] = 0.0
    if present:
        y[n] = -CANARY_PULL
    elif relation == NeighboringRelation.REPLACE_ONE:
        y[n] = CANARY_PULL
    else:
        X[n, 0], y[n] = 0.0, 0.0
    return Ridge(X, y)


def clopper_pearson_upper(failures: int, trials: int, alpha: float) -> float:
    """One-sided upper confidence bound at level 1 − α on a binomial rate."""
    return 1.0 if failures >= trials else float(stats.beta.ppf(1 - alpha, failures + 1, trials - failures))


def _epsilon_bound(fpr: float, fnr: float, delta: float) -> float:
    """max(0, ln((1−δ−FNR)/FPR), ln((1−δ−FPR)/FNR)), with ln(x/0) = ∞ for x > 0."""
    best = 0.0
    for numerator, denominator in ((1 - delta - fnr, fpr), (1 - delta - fpr, fnr)):
        if numerator > 0:
            best = max(best, math.inf if denominator == 0 else math.log(numerator / denominator))
    return best


def _rates(out: np.ndarray, canary: np.ndarray, threshold: float) -> tuple[int, int]:
    """(#D scores > threshold, #D′ scores ≤ threshold): the test's false positives and negatives."""
    return int((out > threshold).sum()), int((canary <= threshold).sum())


def epsilon_lower_bound(out: np.ndarray, canary: np.ndarray, delta: float,
                        confidence: float) -> tuple[float, float, float]:
    """The ε lower bound from scores on D (``out``) and on D′ (``canary``), and the FPR and FNR
    upper bounds it rests on: threshold from the first halves, Clopper–Pearson on the second."""
    _validate.open_unit("confidence", confidence)
    alpha = (1 - confidence) / 2
    half_out, half_canary = len(out) // 2, len(canary) // 2
    pick_out, pick_canary = np.sort(out[:half_out]), canary[:half_canary]
    candidates = np.unique(np.concatenate([pick_out, pick_canary]))

    def bound(threshold: float, o: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
        fp, fn = _rates(o, c, threshold)
        fpr, fnr = clopper_pearson_upper(fp, len(o), alpha), clopper_pearson_upper(fn, len(c), alpha)
        return _epsilon_bound(fpr, fnr, delta), fpr, fnr

    best = max(candidates, key=lambda t: bound(t, pick_out, pick_canary)[0])
    return bound(best, out[half_out:], canary[half_canary:])


def scores(algorithm: Any, oracle: Ridge, *, steps: int, runs: int, seed: int) -> np.ndarray:
    """−⟨output, u⟩ of ``runs`` independent runs (seeds seed, seed+1, …), each run by
    :func:`dpopt.train.step` exactly as :func:`dpopt.run` runs it."""
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64)
    values = np.empty(runs)
    for r in range(runs):
        sample_gen, noise_gen = train._generators(seed + r)
        state = algorithm.init(theta0, steps, sample_gen)
        ledger = Ledger(algorithm.relation())
        for t in range(steps):
            state, _ = train.step(algorithm, oracle, state, t, ledger, sample_gen, noise_gen)
        values[r] = -float(algorithm.output(state)[0])
    return values


def audit(algorithm: Any, *, name: str, steps: int, dataset_size: int, runs: int = 1000, delta: float = 1e-5,
          confidence: float = 0.95, canary: Canary | None = None, seed: int = 0) -> AuditResult:
    """Audit ``algorithm`` (already calibrated, built for ``dataset_size`` + 1 records): ``runs``
    runs on each of D and D′ (:func:`canary_oracle`), scored and turned into an ε lower bound at δ
    (:func:`epsilon_lower_bound`), beside the claimed ε(δ) of its ``planned_event``."""
    n = _validate.positive_int("dataset_size", dataset_size)
    steps = _validate.positive_int("steps", steps)
    runs = _validate.positive_int("runs", runs)
    if runs < 4:
        raise _validate.DpoptError(f"runs={runs} must be >= 4 (half of them choose the threshold)")
    _validate.open_unit("delta", delta)
    canary = canary or CANARIES.get(name, Canary())
    claimed = epsilon_of(algorithm.planned_event(n + 1, steps), delta, algorithm.relation())
    start = time.perf_counter()
    relation = algorithm.relation()
    out = scores(algorithm, canary_oracle(n, canary, relation, present=False), steps=steps, runs=runs, seed=seed)
    inside = scores(algorithm, canary_oracle(n, canary, relation, present=True), steps=steps, runs=runs,
                    seed=seed + runs)
    bound, fpr, fnr = epsilon_lower_bound(out, inside, delta, confidence)
    return AuditResult(algorithm=name, claimed_epsilon=claimed, delta=delta, epsilon_lower_bound=bound,
                       confidence=confidence, runs=runs, false_positive_rate=fpr, false_negative_rate=fnr,
                       seconds=time.perf_counter() - start)
