"""The privacy audit: its statistics, every landed algorithm passes it, every mutant is flagged.

A mutant is an honest algorithm with one deliberate privacy bug: it *runs* one thing and *plans*
(claims, calibrates with) another. The audits run at δ = 0.05 with 2,000 runs per side: at that
δ the claimed ε lies where a few thousand runs can resolve the trade-off curve (at δ = 1e-5 no
audit of this size can refute a Gaussian claim, it only probes the bulk), and the lower bound is
a valid (ε, 0.05) statement like any other point of the privacy profile.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch

from dpopt import accounting, audit, clipping, mechanisms
from dpopt.algorithms import DIFF2
from dpopt._validate import DpoptError
from dpopt.algorithms.by_name import NAMES, NON_PRIVATE, build
from dpopt.cli import main

DELTA, TARGET, RUNS = 0.05, 2.0, 2_000


# ------------------------------------------------------------------------------------ statistics


def test_clopper_pearson_upper_bound_values():
    # zero failures: 1 − α^{1/n} exactly (the "rule of three" region)
    assert audit.clopper_pearson_upper(0, 1000, 0.025) == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert audit.clopper_pearson_upper(1000, 1000, 0.025) == 1.0
    # coverage: for p = 0.3 and n = 200, P(upper < p) ≤ α, summed exactly over the binomial
    from scipy import stats

    k = np.arange(201)
    below = np.array([audit.clopper_pearson_upper(int(i), 200, 0.05) < 0.3 for i in k])
    assert stats.binom.pmf(k, 200, 0.3)[below].sum() <= 0.05


def test_epsilon_bound_formula():
    assert audit._epsilon_bound(0.01, 0.5, 0.05) == pytest.approx(math.log(0.45 / 0.01))
    assert audit._epsilon_bound(0.5, 0.01, 0.05) == pytest.approx(math.log(0.45 / 0.01))
    assert audit._epsilon_bound(0.6, 0.6, 0.05) == 0.0
    assert audit._epsilon_bound(0.0, 0.5, 0.05) == math.inf


def test_identical_score_distributions_give_no_bound_and_separated_ones_a_large_one():
    rng = np.random.default_rng(0)
    same = audit.epsilon_lower_bound(rng.normal(size=2000), rng.normal(size=2000), DELTA, 0.95)[0]
    assert same < 0.3  # the a-priori chance of a bound > 0.3 here is tiny: FPR, FNR both near ½
    apart = audit.epsilon_lower_bound(rng.normal(size=2000), rng.normal(10, 1, size=2000), DELTA, 0.95)[0]
    # no errors in 1,000 held-out runs per side: FPR ≤ 1 − 0.025^{1/1000} ≈ 0.0037
    assert apart == pytest.approx(math.log((1 - DELTA - 0.0036822) / 0.0036822), rel=1e-3)


def test_bad_audit_arguments_are_named():
    algo = build("dp-sgd", n=10, batch_size=5)
    with pytest.raises(DpoptError, match="runs=2 must be >= 4"):
        audit.audit(algo, name="dp-sgd", steps=1, dataset_size=9, runs=2)
    with pytest.raises(DpoptError, match="confidence=1.5 must be in"):
        audit.epsilon_lower_bound(np.zeros(4), np.zeros(4), DELTA, 1.5)


# --------------------------------------------------------------- the mutants and honest audits


@dataclass(frozen=True)
class Mutant:
    """Runs ``runs`` (relation, sampler, steps, output) and claims ``claims``' planned event."""

    runs: Any
    claims: Callable[[int, int], dpa.DpEvent]

    def relation(self) -> dpa.NeighboringRelation:
        return self.runs.relation()

    def sampler(self, t: int, n: int) -> Any:
        return self.runs.sampler(t, n)

    def init(self, theta0, steps, gen):
        return self.runs.init(theta0, steps, gen)

    def step(self, state, batch, oracle, gen):
        return self.runs.step(state, batch, oracle, gen)

    def output(self, state):
        return self.runs.output(state)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return self.claims(n, steps)


def honest(algo: Any) -> Any:
    return algo


def half_noise(algo: Any) -> Mutant:
    """Draws noise with z/2 for every multiplier, claims z. For AClip this is exactly the
    sensitivity-λ bug: std z·λ = (z/2)·2λ where the honest mechanism uses z·2λ."""
    halved = dataclasses.replace(algo, **{f: getattr(algo, f) / 2 for f in algo.NOISE_FIELDS})
    return Mutant(halved, algo.planned_event)


def accounted_on_ten_times_the_data(algo: Any) -> Mutant:
    """Samples at rate b/n, accounts at rate b/(10n): the sample rate computed from the wrong length."""
    return Mutant(algo, lambda n, steps: algo.planned_event(10 * n, steps))


@dataclass(frozen=True)
class Case:
    """``name``: the algorithm (by_name, and its canary world); built for ``n`` + 1 records with
    expected batch ``batch``; ``mutate`` turns the honest algorithm into what runs and claims."""

    name: str
    mutate: Callable[[Any], Any]
    steps: int
    n: int
    batch: int
    twin: Callable[[Any], Any] = honest  # the honest version the mutant is compared with


def calibrated(case: Case) -> Any:
    """The (mutated) algorithm whose *claimed* ε(δ) is ``TARGET``: noise solved on the claim."""
    base = build(case.name, n=case.n + 1, batch_size=case.batch, lr=1.0, clip=1.0)
    scale, _ = accounting.solve_noise(
        lambda s: case.mutate(accounting.scaled(base, s)).planned_event(case.n + 1, case.steps),
        epsilon=TARGET, delta=DELTA, relation=base.relation())
    return case.mutate(accounting.scaled(base, scale))


def run_audit(case: Case, runs: int = RUNS) -> audit.AuditResult:
    return audit.audit(calibrated(case), name=case.name, steps=case.steps, dataset_size=case.n, runs=runs,
                       delta=DELTA, seed=11)


@dataclass(frozen=True)
class NoiseOnEveryClient(DIFF2):
    """The distributed-noise bug in DIFF2: instead of the server adding N(0, (zΔ)²) once to the sum
    of the clients' clipped vectors, every client adds its "share" N(0, (zΔ/P)²) to its own clipped
    sum (the standard deviation split P ways instead of the variance), and the server adds none. The
    released sum then carries noise of standard deviation zΔ/√P while the ledger claims zΔ."""

    def estimate(self, state: Any, t: int, oracle: Any, source: Any) -> tuple[torch.Tensor, dpa.DpEvent]:
        assert self.restarts(t), "the mutant is audited on restart rounds only"
        z = self.noise_multiplier1
        total = torch.zeros_like(state.theta)
        for client in range(self.clients.count):
            rows = oracle.per_record(state.theta, self.clients.records([client]))
            clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], self.relation())
            total += mechanisms.gaussian(clipped, z / self.clients.count, source)[0]
        return total / self.clients.expected_size, dpa.GaussianDpEvent(z)  # the bug: it claims one draw of zΔ


def last_iterate(algo: Any) -> Any:
    """DIFF2 releasing its last iterate (its default, a uniformly random round, would mostly hide
    a one-round audit's release)."""
    return dataclasses.replace(algo, output_rule="last")


def noise_on_every_client(algo: Any) -> Mutant:
    last = last_iterate(algo)
    return Mutant(NoiseOnEveryClient(**{f.name: getattr(last, f.name) for f in dataclasses.fields(last)}),
                  algo.planned_event)


#: Each deliberate bug, on a configuration where the audit has power (rate-1 Poisson "batches" for
#: the noise bugs: no sampling randomness to hide behind; DIFF2: one round, 10 clients of 5 records).
MUTANTS: dict[str, Case] = {
    "dp-sgd noise/2": Case("dp-sgd", half_noise, steps=1, n=9, batch=10),
    "aclip sensitivity λ": Case("aclip", half_noise, steps=1, n=9, batch=10),
    "dp-sgd poisson rate of 10n": Case("dp-sgd", accounted_on_ten_times_the_data, steps=1, n=9, batch=10),
    "diff2 noise on every client": Case("diff2-gd", noise_on_every_client, steps=1, n=49, batch=10,
                                        twin=last_iterate),
}


@pytest.mark.parametrize("key", list(MUTANTS))
def test_every_mutant_is_flagged_and_its_honest_version_is_not(key):
    case = MUTANTS[key]
    broken = run_audit(case)
    assert broken.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert broken.flagged, broken
    fixed = run_audit(dataclasses.replace(case, mutate=case.twin))
    assert not fixed.flagged, fixed


#: Every landed private algorithm, honest, on a small configuration (batch 10 of 50 records; DP-AGD,
#: whose steps run a line search, for 2 steps; O2NC for one window of 10 steps, one period).
STEPS = {"dp-agd": 2, "o2nc-zeroth": 10, "o2nc-first": 10, "o2nc-multi": 10}
HONEST = {name: Case(name, honest, steps=STEPS.get(name, 5), n=49, batch=10)
          for name in NAMES if name not in NON_PRIVATE}


@pytest.mark.parametrize("name", list(HONEST))
def test_every_landed_algorithm_passes_its_audit(name):
    result = run_audit(HONEST[name], runs=1_000)
    assert result.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert result.epsilon_lower_bound <= result.claimed_epsilon, result


def test_a_non_private_method_is_caught():
    """STORM releases its clipped-free gradients exactly: the canary is found every time."""
    algo = build("storm", n=50, batch_size=10, lr=1.0)
    result = audit.audit(algo, name="storm", steps=5, dataset_size=49, runs=1_000, delta=DELTA)
    assert math.isinf(result.claimed_epsilon)
    assert result.epsilon_lower_bound > 4  # ln(0.95/0.0037) ≈ 5.5 with no errors in 500 held-out runs


def test_audits_never_share_the_world_registry_with_a_missing_algorithm():
    assert set(audit.CANARIES) == set(NAMES)


# ------------------------------------------------------------------------------------------ CLI


def test_cli_audit_prints_the_json_payload(capsys):
    code = main(["audit", "--algo", "dp-sgd", "--epsilon", "2", "--delta", "0.05", "--steps", "1",
                 "--dataset-size", "9", "--batch-size", "10", "--runs", "200", "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) >= {"algorithm", "claimed_epsilon", "delta", "epsilon_lower_bound", "confidence", "runs"}
    assert payload["algorithm"] == "dp-sgd" and payload["runs"] == 200 and payload["confidence"] == 0.95
    assert payload["claimed_epsilon"] == pytest.approx(2.0, rel=0.01)
    assert 0 <= payload["epsilon_lower_bound"] <= payload["claimed_epsilon"]


def test_cli_audit_bad_input_is_one_line(capsys):
    assert main(["audit", "--algo", "dp-sgd", "--epsilon", "-1"]) == 2
    assert capsys.readouterr().err == "dpopt: error: epsilon=-1.0 must be > 0 and finite\n"
