"""Empirical privacy audit: a statistical lower bound on ε, by the canary method.

Jagielski, Ullman, Oprea (2020); Nasr, Song, Thakurta, Papernot, Carlini (2021); Nasr et al.
(2023). Train many times on a data set D and on its neighbour D′ (D with one canary record,
:mod:`dpopt.audit.worlds`), let the adversary of the threat model score what it sees of each run
(:mod:`dpopt.audit.statistics`), and turn the scores into a lower bound on ε at δ that holds
with probability ≥ ``confidence`` (:mod:`dpopt.audit.bounds`). A bound above the claim refutes
the claim: the code's privacy arithmetic does not match what the code does.

The runs are :func:`dpopt.train.step`, the code :func:`dpopt.run` runs, on the engine chosen
(the GLM closed form, or :class:`~dpopt.oracles.TorchModel` with the ghost or vmap engine). The
claimed ε is the accountant's ε(δ) of the algorithm's ``planned_event``, the description that
calibrates it and that the ledger records. ``smallest_refutable_epsilon`` states the audit's
power: the smallest true ε this configuration would refute.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import _validate, train
from ..accounting import Ledger, epsilon_of
from . import bounds, one_run
from .bounds import KINDS, BoundKind, ClopperPearson, GaussianDP, clopper_pearson_upper
from .statistics import THREAT_MODELS, Final, Releases, ThreatModel, observe
from . import worlds
from .worlds import CANARIES, ENGINES, Canary, ClosedForm, Engine, Module, World, world

__all__ = ["audit", "audit_one_run", "AuditResult", "Canary", "CANARIES", "ENGINES", "THREAT_MODELS", "KINDS", "Final", "Releases",
           "ClosedForm", "Module", "ClopperPearson", "GaussianDP", "clopper_pearson_upper", "observations"]


@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` measured; :meth:`to_dict` is the ``dpopt audit --json`` payload.

    ``epsilon_lower_bound`` is of the kind ``bound``; ``bounds`` holds every kind computed on the
    same runs; ``evidence``: what the bound rests on (the error-rate upper bounds of the test, or
    the one-run audit's guesses). ``runs``: canaries audited per side (all canaries for one run).
    ``smallest_refutable_epsilon``: the smallest true ε (of a Gaussian-shaped mechanism) this
    configuration refutes at its median outcome."""

    algorithm: str
    threat_model: str
    engine: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    bound: str
    bounds: dict[str, float]
    confidence: float
    runs: int
    slots_per_run: int
    evidence: dict[str, float]
    smallest_refutable_epsilon: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claim: with probability ≥ ``confidence`` the claim is false."""
        return self.epsilon_lower_bound > self.claimed_epsilon


def observations(algorithm: Any, place: World, engine: Engine, threat: ThreatModel, *,
                 present: bool | Sequence[bool], steps: int, runs: int, seed: int) -> np.ndarray:
    """What the adversary sees of ``runs`` canary slots of D′ (``present``) or D: trajectories
    [runs, steps + 1] or outputs [runs], from ⌈runs / slots⌉ training runs seeded seed, seed+1, …"""
    oracle = engine.oracle(*place.records(present=present))
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64)
    seen = []
    for r in range(math.ceil(runs / place.slots)):
        sample_gen, source, _ = train.randomness(seed + r)
        state = algorithm.init(theta0, steps, sample_gen)
        ledger = Ledger(algorithm.relation())
        path = [observe(threat, algorithm, state, place.slots)] if threat.observes_steps() else []
        for t in range(steps):
            state, _ = train.step(algorithm, oracle, state, t, ledger, sample_gen, source)
            if threat.observes_steps():
                path.append(observe(threat, algorithm, state, place.slots))
        seen.append(torch.stack(path, 1) if path else observe(threat, algorithm, state, place.slots))
    return torch.cat(seen).double().numpy()[:runs]


def _inclusion_rate(algorithm: Any, n: int) -> float:
    """q: the probability that a step's batch holds a given record (1 for full batches)."""
    return min(1.0, algorithm.sampler(0, n).expected_size / n)


def audit(algorithm: Any, *, name: str, steps: int, dataset_size: int, runs: int = 10_000, delta: float = 1e-5,
          confidence: float = 0.95, threat_model: ThreatModel = Releases(), bound: BoundKind = GaussianDP(),
          engine: Engine = ClosedForm(), canary: Canary | None = None, seed: int = 0) -> AuditResult:
    """Audit ``algorithm`` (already calibrated, built for ``dataset_size`` + 1 records): ``runs``
    canary slots on each of D and D′ (:func:`observations`), scored under ``threat_model`` and
    turned into an ε lower bound at δ of the kind ``bound``, beside the claimed ε(δ) of its
    ``planned_event`` and the smallest ε this configuration refutes."""
    n = _validate.positive_int("dataset_size", dataset_size) + 1
    steps = _validate.positive_int("steps", steps)
    runs = _validate.positive_int("runs", runs)
    if runs < 4:
        raise _validate.DpoptError(f"runs={runs} must be >= 4 (half of them choose the test)")
    _validate.open_unit("delta", delta)
    _validate.open_unit("confidence", confidence)
    relation = algorithm.relation()
    claimed = epsilon_of(algorithm.planned_event(n, steps), delta, relation)
    start = time.perf_counter()
    place = world(algorithm, name, n, steps, canary)
    out, inside = (observations(algorithm, place, engine, threat_model, present=present, steps=steps, runs=runs,
                                seed=seed + offset) for present, offset in ((False, 0), (True, runs)))
    q = _inclusion_rate(algorithm, n)
    found = {kind.name: bounds.lower_bound(kind, out, inside, delta, confidence,
                                          lambda o, i: threat_model.scores(o, i, q)) for kind in KINDS.values()}
    chosen = found[bound.name]
    return AuditResult(
        algorithm=name, threat_model=threat_model.name, engine=engine.name, claimed_epsilon=claimed, delta=delta,
        epsilon_lower_bound=chosen.epsilon, bound=bound.name, bounds={k: b.epsilon for k, b in found.items()},
        confidence=confidence, runs=runs, slots_per_run=place.slots,
        evidence={"false_positive_rate": chosen.fpr, "false_negative_rate": chosen.fnr},
        smallest_refutable_epsilon=bounds.smallest_refutable_epsilon(bound, claimed, runs - runs // 2, delta,
                                                                     confidence),
        seconds=time.perf_counter() - start)


def audit_one_run(algorithm: Any, *, name: str, steps: int, dataset_size: int, canaries: int | None = None,
                  delta: float = 1e-5,
                  confidence: float = 0.95, engine: Engine = ClosedForm(), seed: int = 0) -> AuditResult:
    """One-run audit (Steinke, Nasr, Jagielski 2023; :mod:`dpopt.audit.one_run`): ``canaries``
    slots (default: every record the run uses), each holding the canary with probability ½ (the auditor's coin, from ``seed``), one
    training run, each slot scored by −output_r; the guesses k₊ = k₋ are planned from the claim
    alone (a Gaussian mechanism of the claimed ε's μ), so planning spends no confidence.

    For models where many runs cost too much. It is weaker than many runs (ε-randomized-response
    guesses, no trade-off curve): ``smallest_refutable_epsilon`` says how much."""
    n = _validate.positive_int("dataset_size", dataset_size) + 1
    steps = _validate.positive_int("steps", steps)
    _validate.open_unit("delta", delta)
    _validate.open_unit("confidence", confidence)
    claimed = epsilon_of(algorithm.planned_event(n, steps), delta, algorithm.relation())
    start = time.perf_counter()
    if canaries is None:
        canaries = len(worlds.used_positions(algorithm, n, steps))
    place = world(algorithm, name, n, steps, slots=_validate.positive_int("canaries", canaries))
    included = np.random.default_rng(seed).random(place.slots) < 0.5
    outputs = observations(algorithm, place, engine, Final(), present=included.tolist(), steps=steps,
                           runs=place.slots, seed=seed + 1)
    separation = bounds.gaussian_mu(claimed, delta) if math.isfinite(claimed) else 10.0
    k, _ = one_run.plan_guesses(place.slots, separation, delta, confidence)
    guessed_in, guessed_out = one_run.guesses(-outputs, k, k)
    correct = one_run.correct_guesses(guessed_in, guessed_out, included)
    found = one_run.epsilon_lower_bound(correct, 2 * k, place.slots, delta, confidence)
    return AuditResult(
        algorithm=name, threat_model=Final().name, engine=engine.name, claimed_epsilon=claimed, delta=delta,
        epsilon_lower_bound=found, bound="one-run", bounds={"one-run": found}, confidence=confidence,
        runs=place.slots, slots_per_run=place.slots, evidence={"guesses": 2 * k, "correct": correct},
        smallest_refutable_epsilon=_one_run_power(place.slots, claimed, delta, confidence),
        seconds=time.perf_counter() - start)


def _one_run_power(canaries: int, claimed: float, delta: float, confidence: float) -> float:
    """The ε_μ(δ) of the least μ whose planned one-run audit's expected bound exceeds the claim."""
    if not math.isfinite(claimed):
        return math.inf
    mu, high = bounds.gaussian_mu(claimed, delta), None
    for _ in range(12):  # doubling: the expected bound is capped by the number of canaries
        if one_run.expected_bound(canaries, mu, delta, confidence)[1] > claimed:
            high = mu
            break
        mu *= 2
    if high is None:
        return math.inf
    low = high / 2
    for _ in range(10):  # μ to 0.1 % of the bracket
        mid = (low + high) / 2
        low, high = (low, mid) if one_run.expected_bound(canaries, mid, delta, confidence)[1] > claimed else (mid, high)
    return bounds.gaussian_epsilon(high, delta)
