"""The privacy audit: its statistics, its power, every landed algorithm passes it on every engine,
and every deliberate privacy bug is flagged while its honest twin is not.

A mutant is an honest algorithm with one privacy bug: it *runs* one thing and *plans* (claims,
calibrates with) another. Audits whose mechanism has the Gaussian shape (no sampling, or many
Poisson steps) use the fitted Gaussian-DP bound at δ = 1e−5 under the releases threat model;
the others use the non-parametric Clopper–Pearson bound at δ = 0.05, where a few thousand runs
resolve the trade-off curve (a valid (ε, 0.05) statement like any other point of the profile).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from scipy import stats
from torch import Tensor, nn

import dpopt
from dpopt import accounting, audit, clipping, mechanisms, outputs
from dpopt._validate import DpoptError
from dpopt.algorithms import DIFF2, DPSGD, DPSUR
from dpopt.algorithms.registry import NAMES, PRIVATE, build
from dpopt.plan import Plan
from dpopt.audit import bounds, worlds
from dpopt.cli import main
from dpopt.oracles import ghost

TARGET = 2.0


# ------------------------------------------------------------------------------------ statistics


def test_clopper_pearson_upper_bound_values():
    # zero failures: 1 − α^{1/n} exactly (the "rule of three" region)
    assert audit.clopper_pearson_upper(0, 1000, 0.025) == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert audit.clopper_pearson_upper(1000, 1000, 0.025) == 1.0
    # coverage: for p = 0.3 and n = 200, P(upper < p) ≤ α, summed exactly over the binomial
    k = np.arange(201)
    below = audit.clopper_pearson_upper(k, 200, 0.05) < 0.3
    assert stats.binom.pmf(k, 200, 0.3)[below].sum() <= 0.05


def test_the_two_kinds_of_bound():
    cp, gdp = bounds.ClopperPearson(), bounds.GaussianDP()
    assert cp.strength(np.array([0.01]), np.array([0.5]), 0.05)[0] == pytest.approx(math.log(0.45 / 0.01))
    assert cp.strength(np.array([0.6]), np.array([0.6]), 0.05)[0] == 0.0
    assert cp.strength(np.array([0.0]), np.array([0.5]), 0.05)[0] == math.inf
    # μ = Φ⁻¹(1 − α) − Φ⁻¹(β): α = β = Φ(−μ/2) is the symmetric point of μ-GDP's trade-off curve
    mu = 1.3
    at = stats.norm.cdf(-mu / 2)
    assert gdp.strength(np.array([at]), np.array([at]), 1e-5)[0] == pytest.approx(mu)
    # ε_μ(δ) inverts δ_μ(ε), and for the Gaussian mechanism it is the analytic Gaussian ε
    assert bounds.gaussian_delta(bounds.gaussian_epsilon(mu, 1e-5), mu) == pytest.approx(1e-5, rel=1e-6)
    event = dpa.GaussianDpEvent(1 / mu)  # sensitivity 1, σ = 1/μ
    assert bounds.gaussian_epsilon(mu, 1e-5) == pytest.approx(accounting.epsilon_of(
        event, 1e-5, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE), rel=2e-3)
    assert bounds.gaussian_mu(bounds.gaussian_epsilon(mu, 1e-5), 1e-5) == pytest.approx(mu, rel=1e-6)
    assert gdp.strength(np.array([0.2]), np.array([1.0]), 1e-5)[0] == 0.0  # never negative, never −∞


def test_identical_score_distributions_give_no_bound_and_separated_ones_a_large_one():
    rng = np.random.default_rng(0)
    kind = bounds.ClopperPearson()
    same = bounds.lower_bound(kind, rng.normal(size=2000), rng.normal(size=2000), 0.05, 0.95).epsilon
    assert same < 0.3  # the a-priori chance of a bound > 0.3 here is tiny: FPR, FNR both near ½
    apart = bounds.lower_bound(kind, rng.normal(size=2000), rng.normal(10, 1, size=2000), 0.05, 0.95).epsilon
    # no errors in 1,000 held-out runs per side: FPR ≤ 1 − 0.025^{1/1000} ≈ 0.0037
    assert apart == pytest.approx(math.log((1 - 0.05 - 0.0036822) / 0.0036822), rel=1e-3)


def test_the_gaussian_dp_bound_is_valid_and_tight_on_gaussian_scores():
    """Scores N(0, 1) on D and N(μ, 1) on D′ are exactly μ-GDP: over 40 seeded audits the bound
    exceeds the true ε in at most 6 (P[Bin(40, 0.05) > 6] ≈ 0.014) and its median is within 25 %."""
    mu, delta = 0.5, 1e-5
    true = bounds.gaussian_epsilon(mu, delta)
    found = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        found.append(bounds.lower_bound(bounds.GaussianDP(), rng.normal(size=10_000), rng.normal(mu, 1, 10_000),
                                        delta, 0.95).epsilon)
    assert sum(f > true for f in found) <= 6
    assert np.median(found) >= 0.75 * true


def test_smallest_refutable_epsilon_is_the_audits_power():
    """At 5,000 held-out runs per side the Gaussian-DP audit refutes a claim of 2 from a true ε of
    about 2.3, and more runs make it sharper; the non-parametric bound at δ = 1e-5 cannot come close."""
    gdp, cp = bounds.GaussianDP(), bounds.ClopperPearson()
    sharp = bounds.smallest_refutable_epsilon(gdp, 2.0, 5_000, 1e-5, 0.95)
    assert 2.0 < sharp <= 1.2 * 2.0
    assert bounds.smallest_refutable_epsilon(gdp, 2.0, 50_000, 1e-5, 0.95) < sharp
    assert bounds.smallest_refutable_epsilon(cp, 2.0, 5_000, 1e-5, 0.95) > 1.5 * 2.0


def test_bad_audit_arguments_are_named():
    algo = build("dp-sgd", n=10, batch_size=5)
    with pytest.raises(DpoptError, match="runs=2 must be >= 4"):
        audit.audit(Plan(algo, n=10, steps=1, delta=1e-5), name="dp-sgd", runs=2)
    with pytest.raises(DpoptError, match="confidence=1.5 must be in"):
        bounds.lower_bound(bounds.GaussianDP(), np.zeros(4), np.zeros(4), 0.05, 1.5)


# ------------------------------------------------------------------------------- the canary world


def test_canaries_sit_where_the_run_uses_records():
    """Finding: single-pass O2NC's canary sat at position 98 of the public order while the run used
    19 records, so it never entered the run. Now the slot is the first record the run uses."""
    algo = build("o2nc-first", n=100, batch_size=10)
    place = worlds.world(algo, "o2nc-first", 100, 10)
    used = {int(i) for t in range(10) for i in algo.sampler(t, 100).sample(torch.Generator())}
    assert place.slots == 1 and place.positions[0] in used
    # a separable algorithm audits every record as its own canary, one coordinate each
    sgd = worlds.world(build("dp-sgd", n=100, batch_size=50), "dp-sgd", 100, 20)
    X, y = sgd.records(present=True)
    assert sgd.slots == 100 and torch.equal(X, torch.eye(100, dtype=torch.float64))
    assert torch.all(y == -worlds.CANARY_PULL)
    X, y = sgd.records(present=False)  # add/remove-one, many slots: neutral records
    assert torch.all(X == 0) and torch.all(y == 0)


def test_a_world_of_one_slot_under_add_remove_has_one_record_fewer():
    """Finding: D and D′ always had the same n, D holding a neutral record where D′ held the canary.
    Under add/remove-one a world of one slot now drops it: D has n − 1 records; under replace-one
    both have n, D holding the anti-canary."""
    srm = worlds.world(build("dp-srm", n=50, batch_size=10), "dp-srm", 50, 5)
    (X_out, y_out), (X_in, y_in) = srm.records(present=False), srm.records(present=True)
    assert X_in.shape == (50, 1) and X_out.shape == (49, 1) and y_in[srm.positions[0]] == -worlds.CANARY_PULL
    assert torch.equal(X_out, torch.cat([X_in[:srm.positions[0]], X_in[srm.positions[0] + 1:]]))
    aclip = worlds.world(build("aclip", n=50, batch_size=10), "aclip", 50, 5)  # its background is not neutral
    X_out, y_out = aclip.records(present=False)
    assert X_out.shape == (49, 1) and torch.all(X_out == 1.0) and torch.all(y_out == 1e6)
    gd = worlds.world(build("dp-agd", n=50, batch_size=10), "dp-agd", 50, 2)  # replace-one
    X_out, y_out = gd.records(present=False)
    assert X_out.shape == (50, 1) and y_out[gd.positions[0]] == worlds.CANARY_PULL


def test_a_separable_world_is_independent_runs():
    """The coordinates of a 100-slot DP-SGD world behave as 100 runs: the final coordinate on D′ has
    the moments of T steps of Bernoulli(q)·ηC/b + N(0, (ηzC/b)²) (a 6-σ tolerance on 2,000 slots)."""
    n, b, steps = 100, 50, 4
    algo = DPSGD(lr=1.0, clip=1.0, noise_multiplier=1.0, batch_size=b)
    place = worlds.world(algo, "dp-sgd", n, steps)
    seen = audit.observations(Plan(algo, n=n, steps=steps, delta=1e-5), place, worlds.ClosedForm(), audit.Final(),
                              present=True, runs=2_000, seed=3)
    q, unit = b / n, 1.0 / b
    mean, var = steps * q * unit, steps * (q * (1 - q) + 1.0) * unit ** 2
    assert abs(-seen.mean() - mean) <= 6 * math.sqrt(var / len(seen))
    assert seen.var() == pytest.approx(var, rel=0.15)


# --------------------------------------------------------------------------- the acceptance audits


@pytest.mark.parametrize(("name", "least"), [("dp-gd", 1.4), ("dp-sgd", 1.0)])
def test_cli_releases_audit_is_tight_at_the_defaults(capsys, name, least):
    """`dpopt audit --algorithm NAME --epsilon 2 --threat-model releases --json` at its defaults:
    a lower bound ≥ 0.7 (DP-GD) or 0.5 (DP-SGD) of the claim and ≤ the claim, of a stated kind,
    with the audit's power ≤ 1.5 × the claim."""
    assert main(["audit", "--algorithm", name, "--epsilon", "2", "--threat-model", "releases", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bound"] == "gaussian-dp" and set(result["bounds"]) == {"gaussian-dp", "clopper-pearson"}
    assert least <= result["epsilon_lower_bound"] <= result["claimed_epsilon"] <= 2.0
    assert result["bounds"]["clopper-pearson"] <= result["claimed_epsilon"]
    assert result["smallest_refutable_epsilon"] <= 1.5 * result["claimed_epsilon"]


def test_cli_audit_bad_input_is_one_line(capsys):
    assert main(["audit", "--algorithm", "dp-sgd", "--epsilon", "-1"]) == 2
    assert capsys.readouterr().err == "dpopt: error: epsilon=-1.0 must be > 0 and finite\n"
    assert main(["audit", "--algorithm", "dp-sgd", "--epsilon", "1", "--threat-model", "everything"]) == 2
    assert "threat_model='everything' must be one of" in capsys.readouterr().err
    assert main(["audit", "--algorithm", "dp-xyz", "--epsilon", "1"]) == 2
    assert capsys.readouterr().err.startswith("dpopt: error: algorithm='dp-xyz' must be one of")
    with pytest.raises(SystemExit) as exited:
        main(["audit", "--epsilon", "1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "dpopt: error: one of the arguments --algorithm is required\n"


def test_cli_audit_says_algorithm_like_every_command_and_keeps_algo_hidden(capsys):
    """Finding: `audit` said `--algo` where every other command says `--algorithm`."""
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    shown = capsys.readouterr().out
    assert "--algorithm ALGORITHM" in shown and "--algo " not in shown
    quick = ["--epsilon", "2", "--runs", "200", "--steps", "2", "--json"]
    assert main(["audit", "--algo", "dp-gd", *quick]) == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "dp-gd"


def test_cli_audit_ends_with_a_verdict_and_shows_progress_on_a_terminal(capsys, monkeypatch):
    """Finding: a long audit printed nothing until it ended and gave no verdict line. On a terminal
    a progress bar of the training steps runs on stderr; the human output ends with one line."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    quick = ["audit", "--algorithm", "dp-srm", "--epsilon", "2", "--runs", "40", "--steps", "3", "--delta", "0.05",
             "--bound", "clopper-pearson"]
    assert main(quick) == 0
    out, err = capsys.readouterr()
    assert "audit dp-srm:   0%| " in err and "0/240 " in err  # 2 worlds × 40 runs × 3 steps
    verdict = out.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"claim ε = 2 not refuted: lower bound \d\S* at 95 % \(power: refutes ε ≥ \S+\)",
                        verdict), verdict
    assert main([*quick, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["verdict"] == verdict


def test_the_verdict_says_refuted_with_the_numbers():
    result = audit.AuditResult(
        algorithm="dp-gd", threat_model="releases", engine="glm", claimed_epsilon=2.0, delta=1e-5,
        epsilon_lower_bound=3.14159, bound="gaussian-dp", bounds={"gaussian-dp": 3.14159}, confidence=0.95, runs=4,
        slots_per_run=1, evidence={}, smallest_refutable_epsilon=math.inf, seconds=0.0)
    assert result.verdict == "REFUTED: claim ε = 2 is below the lower bound 3.14 at 95 % (power: refutes ε ≥ ∞)"


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


def noise_divided_by(factor: float) -> Callable[[Any], Mutant]:
    """Draws noise with z/factor for every multiplier, claims z. For AClip at factor 2 this is
    exactly the sensitivity-λ bug: std z·λ = (z/2)·2λ where the honest mechanism uses z·2λ."""
    def mutate(algo: Any) -> Mutant:
        smaller = dataclasses.replace(algo, **{f: getattr(algo, f) / factor for f in algo.NOISE_FIELDS})
        return Mutant(smaller, algo.planned_event)
    mutate.__name__ = f"noise/{factor}"
    return mutate


def accounted_on_ten_times_the_data(algo: Any) -> Mutant:
    """Samples at rate b/n, accounts at rate b/(10n): the Poisson rate accounted as smaller than used."""
    return Mutant(algo, lambda n, steps: algo.planned_event(10 * n, steps))


@dataclass(frozen=True)
class NoiseOfTheMeanOnTheSum(DPSGD):
    """The sum/mean confusion: noise calibrated to the clipped *mean* (std z·C/b, its sensitivity
    C/b) added to the clipped *sum* (sensitivity C), which is then scaled as usual: the release
    carries b times less noise than the ledger says."""

    def step(self, state, batch, oracle, source):
        rows = oracle.per_record(state.theta, batch.indices)
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, self.clip)], batch.sampler.relation)
        std = self.noise_multiplier * clipped.sensitivity / batch.sampler.expected_size  # the mean's
        noised = clipped.value + source.gaussian(clipped.value, std)  # ... on the sum
        theta = state.theta - self.lr / batch.sampler.expected_size * noised
        return state._replace(theta=theta), batch.sampler.wrap(dpa.GaussianDpEvent(self.noise_multiplier))


@dataclass(frozen=True)
class ClipAfterNoise(DPSGD):
    """Noises the unclipped sum, then clips the result to the norm bound: the canary's gradient
    dominates the noise and survives the clipping as a direction."""

    def step(self, state, batch, oracle, source):
        rows = oracle.per_record(state.theta, batch.indices)
        raw, _ = clipping.clip_sum([clipping.Term(1.0, rows, math.inf)], batch.sampler.relation)
        noised = raw.value + source.gaussian(raw.value, self.noise_multiplier * self.clip)
        event = dpa.GaussianDpEvent(self.noise_multiplier)
        bounded = noised * torch.clamp(self.clip / noised.norm().clamp_min(1e-300), max=1.0)
        theta = state.theta - self.lr / batch.sampler.expected_size * bounded
        return state._replace(theta=theta), batch.sampler.wrap(event)


@dataclass(frozen=True)
class UnnoisedTest(DPSUR):
    """DPSUR whose validation test is released without its noise while its event claims σ_v: the
    accept bit then says whether the canary's loss went down, and θ moves only when it did."""

    def test(self, theta, candidate, indices, checks, oracle, source):
        change, _ = DPSUR.test(dataclasses.replace(self, val_noise_multiplier=0.0), theta, candidate, indices, checks,
                               oracle, source)
        return change, dpa.GaussianDpEvent(self.val_noise_multiplier)


def unrecorded_test_at(step: int, steps: int) -> Callable[[Any], Any]:
    """DPSUR whose ``step``-th step (of ``steps`` a run) returns the candidate's event alone: its
    test is released with its noise and left out of the ledger."""

    @dataclass(frozen=True)
    class UnrecordedTest(DPSUR):
        def step(self, state, batch, oracle, source):
            new, event = DPSUR.step(self, state, batch, oracle, source)
            return new, event.events[0] if batch.t == step else event

    return swapped_in(UnrecordedTest)


def swapped_in(kind: type) -> Callable[[Any], Any]:
    def mutate(algo: Any) -> Any:
        return kind(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)})
    mutate.__name__ = kind.__name__
    return mutate


@dataclass(frozen=True)
class NoiseOnEveryClient(DIFF2):
    """The distributed-noise bug in DIFF2: instead of the server adding N(0, (zΔ)²) once to the sum
    of the clients' clipped vectors, every client adds its "share" N(0, (zΔ/P)²) to its own clipped
    sum (the standard deviation split P ways instead of the variance), and the server adds none. The
    released sum then carries noise of standard deviation zΔ/√P while the ledger claims zΔ."""

    def estimate(self, state: Any, t: int, oracle: Any, source: Any) -> tuple[Tensor, dpa.DpEvent]:
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


class BatchCentring(nn.Module):
    """x − mean over the batch: every record's output depends on every other record."""

    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(0, keepdim=True)


#: The mixing layer's world: background records x = 0, y = −M have zero gradient alone, but behind
#: a batch-centring layer each of them sees −x_canary/|B| and is pulled against the canary.
MIXING = worlds.Canary(background=-worlds.CANARY_PULL, background_input=0.0)
CLAIMED_PER_RECORD = worlds.Module("ghost", layers=lambda width: [BatchCentring()],
                                   known_layers=ghost.KNOWN_LAYERS.with_per_record(BatchCentring))
ISOLATED = worlds.Module("ghost", layers=lambda width: [BatchCentring()])


@dataclass(frozen=True)
class Case:
    """``name``: the algorithm (by name in the registry, and its canary world); built for ``n`` + 1 records with
    expected batch ``batch``; ``mutate`` turns the honest algorithm into what runs and claims;
    the audit's settings follow."""

    name: str
    mutate: Callable[[Any], Any]
    steps: int
    n: int
    batch: int
    runs: int = 10_000
    delta: float = 1e-5
    bound: bounds.BoundKind = bounds.GaussianDP()
    threat: Any = audit.Releases()
    engine: worlds.Engine = worlds.ClosedForm()
    twin_engine: worlds.Engine | None = None  # the honest twin's engine, if not the same
    canary: worlds.Canary | None = None
    twin: Callable[[Any], Any] = honest  # the honest version the mutant is compared with
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # more knobs of the algorithm by name


def calibrated(case: Case, mutate: Callable[[Any], Any]) -> Any:
    """The (mutated) algorithm whose *claimed* ε(δ) is ``TARGET``: noise solved on the claim."""
    base = build(case.name, n=case.n + 1, batch_size=case.batch, lr=1.0, clip=1.0, **case.options)
    scale, _ = accounting.solve_noise(
        lambda s: mutate(accounting.scaled(base, s)).planned_event(case.n + 1, case.steps),
        epsilon=TARGET, delta=case.delta, relation=base.relation())
    return mutate(accounting.scaled(base, scale))


def planned(case: Case, algorithm: Any) -> Plan[Any]:
    """The plan the audit of ``case`` claims: ``algorithm`` on D′'s n + 1 records at the case's δ
    (an audit's δ may be ≥ 1/n: it is the δ the claim is checked at)."""
    return Plan(algorithm, n=case.n + 1, steps=case.steps, delta=case.delta, allow_large_delta=True)


def run_audit(case: Case, *, twin: bool = False) -> audit.AuditResult:
    mutate = case.twin if twin else case.mutate
    engine = (case.twin_engine or case.engine) if twin else case.engine
    return audit.audit(planned(case, calibrated(case, mutate)), name=case.name, runs=case.runs, bound=case.bound,
                       threat_model=case.threat, engine=engine, canary=case.canary, seed=11)


SMALL = dict(runs=2_000, delta=0.05, bound=bounds.ClopperPearson())  # one slot per run: fewer, costlier runs

#: Each deliberate bug, on a configuration where the audit has power.
MUTANTS: dict[str, Case] = {
    "dp-gd noise/1.5": Case("dp-gd", noise_divided_by(1.5), steps=20, n=99, batch=50),
    "dp-sgd noise/2": Case("dp-sgd", noise_divided_by(2), steps=20, n=99, batch=50),
    "dp-sgd noise/2, ghost engine": Case("dp-sgd", noise_divided_by(2), steps=20, n=99, batch=50, runs=4_000,
                                         engine=worlds.Module("ghost")),
    "dp-sgd noise/2, vmap engine": Case("dp-sgd", noise_divided_by(2), steps=20, n=99, batch=50, runs=4_000,
                                        engine=worlds.Module("vmap")),
    "dp-sgd poisson rate of 10n": Case("dp-sgd", accounted_on_ten_times_the_data, steps=20, n=99, batch=50),
    "dp-sgd noise of the mean on the sum": Case("dp-sgd", swapped_in(NoiseOfTheMeanOnTheSum), steps=20, n=99,
                                                batch=50),
    "dp-sgd clip after noise": Case("dp-sgd", swapped_in(ClipAfterNoise), steps=1, n=10, batch=10,
                                    canary=worlds.Canary(), **SMALL),
    "aclip sensitivity λ": Case("aclip", noise_divided_by(2), steps=1, n=10, batch=10, **SMALL),
    "diff2 noise on every client": Case("diff2-gd", noise_on_every_client, steps=1, n=49, batch=10,
                                        twin=last_iterate, **SMALL),
    "dp-sur test without noise": Case("dp-sur", swapped_in(UnnoisedTest), steps=5, n=49, batch=10, runs=600,
                                      delta=0.05, bound=bounds.ClopperPearson()),
    "o2nc single pass noise/10": Case("o2nc-first", noise_divided_by(10), steps=10, n=99, batch=10,
                                      **SMALL | {"runs": 300}),
    "ghost batch-mixing layer": Case("dp-sgd", honest, steps=1, n=10, batch=10, runs=1_000, delta=0.05,
                                     bound=bounds.ClopperPearson(), canary=MIXING, engine=CLAIMED_PER_RECORD,
                                     twin_engine=ISOLATED),
}


def flagged_and_twin_not(case: Case) -> audit.AuditResult:
    """Assert that the audit of ``case``'s mutant, claiming ``TARGET``, refutes it and that its
    honest twin's does not; returns the twin's result."""
    broken = run_audit(case)
    assert broken.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert broken.flagged, broken
    fixed = run_audit(case, twin=True)
    assert not fixed.flagged, fixed
    return fixed


@pytest.mark.parametrize("key", list(MUTANTS))
def test_every_mutant_is_flagged_and_its_honest_twin_is_not(key):
    flagged_and_twin_not(MUTANTS[key])


#: Every landed private algorithm, honest, on a small configuration (batch 10 of 50 records; DP-AGD,
#: whose steps run a line search, for 2 steps; O2NC for one window of 10 steps, one period).
STEPS = {"dp-agd": 2, "o2nc-zeroth": 10, "o2nc-first": 10, "o2nc-multi": 10}
HONEST = {name: Case(name, honest, steps=STEPS.get(name, 5), n=49, batch=10,
                     runs=300 if name.startswith("o2nc") else 600, delta=0.05, bound=bounds.ClopperPearson())
          for name in PRIVATE}


@pytest.mark.parametrize("name", list(HONEST))
def test_every_landed_algorithm_passes_its_audit(name):
    result = run_audit(HONEST[name])
    assert result.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert result.epsilon_lower_bound <= result.claimed_epsilon, result


@pytest.mark.parametrize("step", [0, 2, 4])
def test_a_selection_whose_test_is_not_in_the_ledger_is_caught(step):
    """Issue 39's mutant: DPSUR's acceptance test released but its event skipped in the ledger (at
    the first, a middle, the last step). Its releases are honest, so no canary score can show it;
    the audit checks each run's ledger against the whole plan and refuses the run."""
    case = Case("dp-sur", unrecorded_test_at(step, steps=5), steps=5, n=49, batch=10, runs=20, delta=0.05,
                bound=bounds.ClopperPearson())
    with pytest.raises(accounting.PlanMismatch, match="an audited run recorded 9 events where its plan has 10"):
        run_audit(case)
    assert not run_audit(dataclasses.replace(case, mutate=honest)).flagged


def test_a_non_private_method_is_caught():
    """STORM releases its clipped-free gradients exactly: the canary is found every time."""
    algo = build("storm", n=50, batch_size=10, lr=1.0)
    result = audit.audit(Plan(algo, n=50, steps=5, delta=0.05, allow_large_delta=True), name="storm", runs=1_000,
                         bound=bounds.ClopperPearson())
    assert math.isinf(result.claimed_epsilon)
    assert result.epsilon_lower_bound > 4  # ln(0.95/0.0037) ≈ 5.5 with no errors in 500 held-out runs


def test_audits_never_share_the_world_registry_with_a_missing_algorithm():
    assert set(audit.CANARIES) == set(NAMES)


def test_one_run_audit_flags_a_quarter_of_the_noise_and_passes_the_honest_run():
    """One training run of DP-SGD with 400 canaries (each in with probability ½) on the ghost
    engine: the honest run's bound stays below the claim, a run with a quarter of the claimed
    noise (true ε far above 2) is refuted; the audit states its (weaker) power."""
    case = Case("dp-sgd", honest, steps=10, n=399, batch=200)
    results = {}
    for label, mutate in (("honest", honest), ("noise/4", noise_divided_by(4))):
        results[label] = audit.audit_one_run(planned(case, calibrated(case, mutate)), name="dp-sgd",
                                             engine=worlds.Module("ghost"), seed=5)
    assert results["honest"].runs == 400 and results["honest"].bound == "one-run"
    assert results["honest"].epsilon_lower_bound <= results["honest"].claimed_epsilon
    assert results["noise/4"].flagged, results["noise/4"]
    assert 2.0 < results["honest"].smallest_refutable_epsilon < 10.0


def same_n(place: worlds.World, present: bool) -> tuple[Tensor, Tensor]:
    """D′, or D with the neutral record (x = 0, y = 0) in the canary's slot: both of n records."""
    X, y = place.records(present=present)
    if len(y) == place.n:
        return X, y
    at = place.positions[0]
    return torch.cat([X[:at], X.new_zeros(1, X.shape[1]), X[at:]]), torch.cat([y[:at], y.new_zeros(1), y[at:]])


@pytest.mark.parametrize("name", list(HONEST))
def test_what_a_run_writes_besides_theta_does_not_depend_on_the_canary(name):
    """Finding: only the final iterate was scored; the side outputs a run writes were never
    examined. With the same seed, the default history of a run on D and on D′ (the canary world)
    differs in θ alone: every other written field (ε, the planned passes, the step records, the
    randomness) is a public function of the settings, but for the counts an algorithm releases about
    its run from noised values (DPSUR's accepted steps, private like θ). With diagnostics asked for,
    the labelled diagnostics are what differs. n is one of the settings: D holds a neutral record in
    the canary's slot where the add/remove world drops it."""
    case = HONEST[name]
    algo = calibrated(case, honest)
    place = worlds.world(algo, name, case.n + 1, case.steps)
    written = {}
    for present in (False, True):
        oracle = worlds.ClosedForm().oracle(*same_n(place, present))
        # an audit world of case.n + 1 records at the audit's δ, which may be ≥ 1/n
        history = dpopt.run(algo, oracle, steps=case.steps, seed=3, log_every=1, delta=case.delta,
                            allow_large_delta=True)
        written[present] = {k: v for k, v in history.to_dict().items() if k != "theta"}
        written[present]["final"] = {k: v for k, v in history.final.items() if k not in outputs.RELEASED_COUNTS}
    assert written[False] == written[True]
    if name == "dp-sgd":
        oracle = worlds.ClosedForm().oracle(*place.records(present=True))
        diagnosed = dpopt.run(algo, oracle, steps=case.steps, seed=3, log_every=1, diagnostics=True).to_dict()
        assert diagnosed["diagnostics"]["label"].startswith("NOT PRIVATE")
