"""Private tuning: its ε is dp_accounting's RepeatAndSelectDpEvent of one trial's event, the number
of trials follows the chosen distribution, its randomness is secret by default, and what it
writes is classified. Each privacy check is paired with a mutant it catches."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from dpopt import DPSGD, dp_gd, outputs, train
from dpopt._validate import DpoptError
from dpopt.accounting import with_noise
from dpopt.tuning import (LogUniform, Outcome, Poisson, Space, TruncatedNegativeBinomial, repeat_and_select,
                          tune)
from tests.contracts.test_algorithms import oracle

DELTA = 1e-5
STEPS = 20
SPACE = Space({"lr": LogUniform(0.05, 1.0)})


def directly(tuned, trials, relation: dpa.NeighboringRelation) -> float:
    """ε(δ) of the tuning, computed with dp_accounting alone from the selected run's noise: the
    best of K runs of T steps of (Poisson-sampled at b/n, or full-batch) Gaussian(z)."""
    algorithm, n = tuned.algorithm, oracle().n
    step = dpa.GaussianDpEvent(algorithm.noise_multiplier)
    if relation == dpa.NeighboringRelation.ADD_OR_REMOVE_ONE:
        step = dpa.PoissonSampledDpEvent(algorithm.batch_size / n, step)
    accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    accountant.compose(dp_event.RepeatAndSelectDpEvent(dpa.SelfComposedDpEvent(step, STEPS), trials.mean,
                                                       trials.shape))
    return accountant.get_epsilon(DELTA)


def tuned_with(trials, build=lambda c: DPSGD(lr=c["lr"], clip=1.0, noise_multiplier=1.0, batch_size=40)):
    data = oracle()
    return tune(build, data, space=SPACE, trials=trials, epsilon=1.0, delta=DELTA, steps=STEPS, seed=0,
                score=lambda theta: float(data.loss(theta)))


CASES = [(TruncatedNegativeBinomial(3.0, 1.0), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
         (TruncatedNegativeBinomial(5.0, 0.5), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
         (TruncatedNegativeBinomial(4.0, 0.0), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
         (Poisson(3.0), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
         (TruncatedNegativeBinomial(3.0, 1.0), dpa.NeighboringRelation.REPLACE_ONE)]


@pytest.mark.parametrize("trials,relation", CASES)
def test_tune_reports_the_epsilon_of_repeat_and_select_computed_directly(trials, relation):
    """The reported ε (tuning and training) equals dp_accounting's RepeatAndSelectDpEvent around
    one trial's event, and is calibrated to the target: 0.99 ≤ ε ≤ 1."""
    build = None if relation == dpa.NeighboringRelation.ADD_OR_REMOVE_ONE else (
        lambda c: dp_gd(lr=c["lr"], clip=1.0, noise_multiplier=1.0))
    tuned = tuned_with(trials) if build is None else tuned_with(trials, build)
    if tuned.algorithm is None:  # K = 0 under Poisson: nothing released; the ε is still charged
        pytest.skip("no trial drawn")
    assert tuned.final["epsilon"] == pytest.approx(directly(tuned, trials, relation), rel=1e-9)
    assert 0.99 <= tuned.final["epsilon"] <= 1.0
    assert tuned.trial_epsilon < 0.8 * tuned.final["epsilon"]  # tuning costs something


def test_the_epsilon_check_catches_tuning_left_out_of_the_account(monkeypatch):
    """Mutant: the tuning reports (and calibrates to) one trial's ε, as if selecting were free."""
    trials = TruncatedNegativeBinomial(3.0, 1.0)
    monkeypatch.setattr(TruncatedNegativeBinomial, "wrap", lambda self, event: event)
    tuned = tuned_with(trials)
    assert directly(tuned, trials, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE) > 1.3 * tuned.final["epsilon"]


# ------------------------------------------------------------------ the number of trials
DRAWS = 4000
#: The chi-square test's false-alarm probability: an honest sampler fails it with probability 1e-3.
ALPHA = 1e-3


def trial_counts(trials, seed: int = 0) -> list[int]:
    """K of ``DRAWS`` selections, counted as the trials repeat_and_select actually ran."""
    rng = np.random.default_rng(seed)
    counts = []
    for _ in range(DRAWS):
        ran: list[int] = []

        def trial(c, i):
            ran.append(i)
            return Outcome(c["lr"], None)

        selection = repeat_and_select(trial, SPACE, trials, rng)
        assert selection.trials_run == len(ran)
        counts.append(len(ran))
    return counts


def chi_square_p(counts: list[int], trials) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``trials.pmf``: cells k = 0, 1, … while
    their expected count is ≥ 5, the rest of the support in one tail cell."""
    seen = Counter(counts)
    observed, expected, k = [], [], 0
    while DRAWS * trials.pmf(k) >= 5 or (k == 0 and trials.pmf(0) == 0):
        if trials.pmf(k) > 0:
            observed.append(seen[k])
            expected.append(DRAWS * trials.pmf(k))
        k += 1
    observed.append(sum(v for key, v in seen.items() if key >= k))
    expected.append(DRAWS - sum(expected))
    return float(stats.chisquare(observed, expected).pvalue)


FAMILIES = [Poisson(2.0), TruncatedNegativeBinomial(4.0, 1.0), TruncatedNegativeBinomial(4.0, 0.5),
            TruncatedNegativeBinomial(4.0, 0.0), TruncatedNegativeBinomial(6.0, 3.0)]


@pytest.mark.parametrize("trials", FAMILIES)
def test_the_number_of_trials_follows_the_chosen_distribution(trials):
    """The pmf is a distribution with the stated mean, and K of the selection fits it (chi-square,
    false-alarm probability ALPHA, fixed seed)."""
    support = np.arange(0, 2000)
    pmf = np.array([trials.pmf(int(k)) for k in support])
    assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
    assert (support * pmf).sum() == pytest.approx(trials.mean, rel=1e-9)
    assert chi_square_p(trial_counts(trials), trials) > ALPHA


class OneMore(TruncatedNegativeBinomial):
    def draw(self, rng):
        return super().draw(rng) + 1


class NeverZero(Poisson):
    def draw(self, rng):
        while (k := super().draw(rng)) == 0:
            pass
        return k


@pytest.mark.parametrize("mutant", [OneMore(4.0, 1.0), NeverZero(1.5)])
def test_the_trials_check_catches_a_sampler_other_than_the_accounted_one(mutant):
    """Mutants: one trial too many; a Poisson that never stops at K = 0 (both are accounted as
    the distribution they inherit from, but sample another)."""
    accounted = TruncatedNegativeBinomial(4.0, 1.0) if isinstance(mutant, OneMore) else Poisson(1.5)
    assert chi_square_p(trial_counts(mutant), accounted) < 1e-20


def test_tune_runs_exactly_the_trials_it_drew(monkeypatch):
    runs = []
    real = train.train  # every trial is one run of the tuning's plan
    monkeypatch.setattr(train, "train", lambda plan, oracle, options, theta0: runs.append(options.seed)
                        or real(plan, oracle, options, theta0))
    data = oracle()
    tuned = tune(lambda c: DPSGD(lr=c["lr"], clip=1.0, noise_multiplier=1.0, batch_size=40), data, space=SPACE,
                 trials=TruncatedNegativeBinomial(3.0), epsilon=1.0, delta=DELTA, steps=5, seed=4,
                 score=lambda theta: float(data.loss(theta)), diagnostics=True)
    assert tuned.diagnostics["trials_run"] == len(runs) >= 1 and len(set(runs)) == len(runs)


def test_tune_sets_the_calibrated_noise_through_an_update_rule_and_on_banded_noise():
    """A candidate wrapped in DP-AdamBC (its noise multiplier is the inner DP-SGD's) with banded noise:
    every trial runs at the tuning's calibrated noise, whose plan the guarantee is computed from."""
    from dpopt.algorithms import AdamBC

    data = oracle()
    tuned = tune(lambda c: AdamBC(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40, bands=2), lr=c["lr"]),
                 data, space=SPACE, trials=TruncatedNegativeBinomial(2.0), epsilon=2.0, delta=DELTA, steps=6, seed=3,
                 score=lambda theta: float(data.loss(theta)))
    assert isinstance(tuned.algorithm, AdamBC) and tuned.algorithm.inner.bands == 2
    assert tuned.algorithm.inner.noise_multiplier > 1.0 and tuned.final["epsilon"] <= 2.0


# ------------------------------------------------------------------ randomness, refusals, outputs
def small_tune(seed, **extra):
    data = oracle()
    return tune(lambda c: DPSGD(lr=c["lr"], clip=1.0, noise_multiplier=1.0, batch_size=40), data, space=SPACE,
                trials=TruncatedNegativeBinomial(2.0), epsilon=2.0, steps=5, seed=seed,
                score=lambda theta: float(data.loss(theta)), **({"delta": DELTA} | extra))


def test_default_randomness_is_secret_and_a_seed_makes_the_tuning_reproducible():
    a, b = small_tune(None), small_tune(None)
    assert not torch.equal(a.theta, b.theta) and "operating system" in a.randomness
    c, d = small_tune(9), small_tune(9)
    assert torch.equal(c.theta, d.theta) and c.hyperparameters == d.hyperparameters
    assert "seed staying secret" in c.randomness
    e = small_tune(train.OsSeed(9))  # a secret drawn from the operating system, handed on as a seed
    assert torch.equal(e.theta, c.theta) and e.randomness == train.FROM_OS


def test_a_delta_of_at_least_one_over_n_is_refused_unless_allowed():
    with pytest.raises(DpoptError, match=r"^delta=0.01 must be < 1/n = 0.0025 for n=400 records: .* or "
                                         r"allow_large_delta=True \(--allow-large-delta\) to accept this knowingly$"):
        small_tune(1, delta=0.01)
    assert small_tune(1, delta=0.01, allow_large_delta=True).delta == 0.01


def test_a_candidate_that_changes_the_privacy_event_is_refused():
    data = oracle()
    with pytest.raises(DpoptError, match="changes the privacy event"):
        tune(lambda c: DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=c["batch_size"]), data,
             space=Space.grid(batch_size=[40, 80]), trials=TruncatedNegativeBinomial(3.0), epsilon=1.0, delta=DELTA,
             steps=5, seed=1, score=lambda theta: 0.0)


@pytest.mark.parametrize("make,message", [
    (lambda: Poisson(0.5), "mean=0.5 must be >= 1"),
    (lambda: TruncatedNegativeBinomial(3.0, -1.0), "shape=-1.0 must be >= 0"),
    (lambda: LogUniform(1.0, 0.1), "high=0.1 must be >= low=1.0"),
    (lambda: Space.grid(lr=[]), "must hold at least one value"),
])
def test_bad_settings_name_the_argument(make, message):
    with pytest.raises(DpoptError, match=message):
        make()


def test_what_tune_writes_is_classified_and_k_only_among_the_diagnostics():
    plain, diagnosed = small_tune(3), small_tune(3, diagnostics=True)
    assert outputs.unclassified(plain.to_dict()) == [] and plain.diagnostics is None
    assert outputs.unclassified(diagnosed.to_dict()) == []
    assert diagnosed.diagnostics["label"] == outputs.NOT_PRIVATE and "trials_run" not in str(plain.to_dict())
    assert math.isfinite(plain.final["validation_score"])


# ------------------------------------------------------------------ the command line
def test_dpopt_tune_prints_and_writes_the_guarantee_of_tuning_and_training(capsys, tmp_path):
    import json

    from dpopt.cli import main

    argv = ["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "10",
            "--grid", "lr=0.1,0.5", "--range", "clip=0.5,2", "--trials-mean", "2", "--seed", "1", "--json",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "tuned.json").read_text())
    n = round(0.8 * 32561)
    step = dpa.PoissonSampledDpEvent(256 / n, dpa.GaussianDpEvent(float(written["algorithm"].split(
        "noise_multiplier = ")[1].split(",")[0])))
    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_event.RepeatAndSelectDpEvent(dpa.SelfComposedDpEvent(step, 10), 2.0, 1.0))
    assert printed["final"]["epsilon"] == written["final"]["epsilon"] == pytest.approx(
        accountant.get_epsilon(1e-5), rel=1e-9)
    assert 0.99 <= printed["final"]["epsilon"] <= 1.0
    assert printed["trials"] == str(TruncatedNegativeBinomial(2.0, 1.0))
    assert printed["trials"] == "truncated negative binomial (mean 2, shape 1)"  # in words, not a Python repr
    assert printed["hyperparameters"]["lr"] in (0.1, 0.5) and 0.5 <= printed["hyperparameters"]["clip"] <= 2
    assert outputs.unclassified(written) == [] and written["diagnostics"] is None


def test_dpopt_tune_says_the_validation_split_is_unprotected_and_its_score_exact(capsys, tmp_path):
    """Finding: tuned.json and the printed summary gave the validation score without saying that the
    validation records are outside the guarantee and the score is released exactly. Both say it now,
    and the summary says where the randomness came from."""
    import json

    from dpopt.cli import main

    argv = ["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--grid",
            "lr=0.1,0.5", "--trials-mean", "1.5", "--validation-fraction", "0.25", "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "tuned.json").read_text())
    assert written["validation_split"] == (
        "the validation split (25% of the training file, a fixed public permutation) is not protected by the "
        "guarantee: the selected candidate's exact score on it (validation_score) is released")
    selected = next(line for line in printed.splitlines() if line.startswith("selected "))
    assert f"(exact, NOT PROTECTED: {written['validation_split']})" in selected
    assert f"randomness: {train.FROM_OS}" in printed.splitlines()


@pytest.mark.parametrize("extra,message", [
    (["--grid", "batch_size=10,20"], "grid='batch_size' must be one of: lr, clip"),
    (["--range", "lr=0.1"], "range lr='0.1' must be two numbers LOW,HIGH"),
    (["--grid", "lr=0.1", "--trials-mean", "0.5"], "mean=0.5 must be >= 1"),
    ([], "tune needs at least one --grid"),
    (["--grid", "bands=1,2.5"], "grid bands='1,2.5' must be comma-separated integers >= 1"),
    (["--grid", "bands=0,4"], "grid bands=0 must be >= 1"),
    (["--grid", "optimizer=sgd,adam"], "grid optimizer='adam' must be one of: sgd, adambc"),
    (["--range", "bands=1,16"], "range bands: bands takes --grid values, not a log-uniform range"),
])
def test_dpopt_tune_refuses_bad_input_with_exit_2(capsys, extra, message, tmp_path):
    from dpopt.cli import main

    assert main(["tune", "--algorithm", "dp-sgd", "--epsilon", "1", "--out", str(tmp_path), *extra]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------ candidates of other events: dominated
def banded_trials(monkeypatch):
    """A tuning over bands {1, 4} (the reference: 1) and every trial's algorithm, as it ran."""
    ran = []
    real = train.train
    monkeypatch.setattr(train, "train", lambda plan, *args: ran.append(plan.algorithm) or real(plan, *args))
    data = oracle()
    tuned = tune(lambda c: DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40, bands=c["bands"]), data,
                 space=Space.grid(bands=[1, 4]), trials=TruncatedNegativeBinomial(6.0), epsilon=2.0, delta=DELTA,
                 steps=8, seed=2, score=lambda theta: float(data.loss(theta)))
    return tuned, ran, data.n


def rdp(event, orders=None) -> np.ndarray:
    """ε(λ) at the RDP accountant's orders (or at ``orders``)."""
    relation = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    accountant = rdp_privacy_accountant.RdpAccountant(**({} if orders is None else {"orders": orders}),
                                                      neighboring_relation=relation)
    accountant.compose(event)
    return np.asarray(accountant.rdp)


def bounded(event) -> np.ndarray:
    """ε(λ) ≤ ε(⌈λ⌉) at every order λ of the RDP accountant (integer orders: exact)."""
    orders = rdp_privacy_accountant.RdpAccountant().orders
    return rdp(event, [float(math.ceil(order)) for order in orders])


def test_a_candidate_of_other_bands_runs_at_noise_the_reference_dominates(monkeypatch):
    """Repeat-and-select is calibrated on the reference candidate (one band); a trial at four bands
    (another event: ⌈T/4⌉ rounds at rate 4B/n) runs at more noise, the smallest (to 1e-3) whose
    Rényi curve (bounded by its exact value at ⌈λ⌉) is at most the reference's at every order λ of
    the accountant, so the tuning's ε (computed from the reference) covers it."""
    tuned, ran, n = banded_trials(monkeypatch)
    assert {algorithm.bands for algorithm in ran} == {1, 4}
    reference = next(a for a in ran if a.bands == 1)
    curve = rdp(reference.planned_event(n, 8))
    for algorithm in ran:  # the reference's own event, or one it dominates
        assert algorithm.planned_event(n, 8) == reference.planned_event(n, 8) or np.all(
            bounded(algorithm.planned_event(n, 8)) <= curve)
    four = next(a for a in ran if a.bands == 4)
    assert four.noise_multiplier > reference.noise_multiplier
    lower = dataclasses.replace(four, noise_multiplier=four.noise_multiplier / 1.002)
    assert not np.all(bounded(lower.planned_event(n, 8)) <= curve)  # the smallest such noise
    assert tuned.final["epsilon"] <= 2.0


def test_the_dominance_check_catches_a_candidate_run_at_the_references_noise(monkeypatch):
    """Mutant: the candidate of four bands runs at the reference's noise (the check skipped): its
    curve exceeds the reference's at some order, which the test above asserts never happens."""
    from dpopt.tuning import private

    monkeypatch.setattr(private.Dominated, "noised", lambda self, algorithm, candidate: with_noise(algorithm,
                                                                                                     self.noise))
    _, ran, n = banded_trials(monkeypatch)
    reference = next(a for a in ran if a.bands == 1)
    curve = rdp(reference.planned_event(n, 8))
    assert any(not np.all(bounded(algorithm.planned_event(n, 8)) <= curve) for algorithm in ran if algorithm.bands == 4)


def test_a_candidate_whose_curve_is_not_dominated_is_refused_before_it_runs(monkeypatch):
    """The check itself: a candidate at four bands handed to it at the reference's noise is refused."""
    from dpopt.tuning import private

    monkeypatch.setattr(private.dominance, "dominating_scale", lambda *args: 1.0)
    with pytest.raises(DpoptError, match="Rényi curve exceeds the reference candidate's at some order"):
        banded_trials(monkeypatch)


def test_dpopt_tune_tunes_bands_clip_quantile_and_optimizer(capsys, tmp_path):
    """``dpopt tune --grid bands=1,4 --grid optimizer=sgd,adambc --grid clip_quantile=0.5,0.8``: the
    selected candidate is one of the grid's and the guarantee is the reference's (one band, whose
    noise the tuning calibrated and whose Rényi curve dominates every trial's)."""
    import json

    from dpopt.cli import main

    argv = ["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "6", "--grid",
            "bands=1,4", "--grid", "optimizer=sgd,adambc", "--grid", "lr=0.05", "--trials-mean", "3", "--seed",
            "2", "--json", "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["hyperparameters"]["bands"] in (1, 4) and printed["hyperparameters"]["optimizer"] in ("sgd",
                                                                                                          "adambc")
    assert 0.99 <= printed["final"]["epsilon"] <= 1.0
    assert main([*argv[:9], "--grid", "clip_quantile=0.5,0.8", "--grid", "lr=0.1", "--trials-mean", "2", "--seed",
                 "2", "--json", "--out", str(tmp_path / "quantile")]) == 0
    assert json.loads(capsys.readouterr().out)["hyperparameters"]["clip_quantile"] in (0.5, 0.8)
