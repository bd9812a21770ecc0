"""DPSUR (``DPSUR``, registry name ``dp-sur``): a DP-SGD candidate kept iff a noised validation test
says it lowered the loss. Each step records the candidate's and the test's Poisson-sampled Gaussians,
accepted or not; the plan is exactly that composition; the accept rule is u < β; the accepted count is
reported and the validation losses are not. (Ledger = plan, calibration, bad values, checkpoints and
release mutants, including a step that drops its test's event: the contract table.)"""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant

import dpopt
from dpopt import accounting, data, outputs, train
from dpopt.accounting import canonical, epsilon_of
from dpopt.algorithms import DPSUR
from dpopt.algorithms.registry import build
from dpopt.base import Batch
from dpopt.cli import main
from dpopt.mechanisms import SeededNoise
from dpopt.oracles import LeastSquares, make
from dpopt.plan import plan_for
from dpopt.sampling import Poisson
from tests.contracts.test_algorithms import DELTA, DIM, SEED, TABLE, N, oracle, replay

ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE


def dpsur(**changes: object) -> DPSUR:
    return DPSUR(**{"lr": 0.5, "clip": 1.0, "noise_multiplier": 1.0, "val_noise_multiplier": 1.0, "batch_size": 40,
                    "val_rate": 0.1, "val_clip": 0.5} | changes)


# ------------------------------------------------------------------------------ the accounting


def test_the_plan_is_the_composition_of_both_sampled_gaussians_per_step():
    """n = 100, b = 10 (q = 0.1), q_v = 0.2, σ = σ_v = 1.2, T = 5: ε of the plan (2.99) is what
    dp_accounting's PLD accountant gives for the T pairs composed directly (same grid). A plan that
    left the tests out (the mutant) claims 1.61: the comparison catches it."""
    algo = dpsur(noise_multiplier=1.2, val_noise_multiplier=1.2, batch_size=10, val_rate=0.2)
    steps, grid = 5, 1e-3
    direct = pld_privacy_accountant.PLDAccountant(ADD_REMOVE, value_discretization_interval=grid)
    for _ in range(steps):
        direct.compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.2)))
        direct.compose(dpa.PoissonSampledDpEvent(0.2, dpa.GaussianDpEvent(1.2)))
    want = direct.get_epsilon(DELTA)
    assert epsilon_of(algo.planned_event(100, steps), DELTA, ADD_REMOVE, "pld", grid) == pytest.approx(want, rel=1e-6)
    candidates_only = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.2)), steps)
    assert epsilon_of(candidates_only, DELTA, ADD_REMOVE, "pld", grid) < 0.6 * want


def test_every_step_records_the_candidate_then_the_test():
    algo = TABLE["dpsur"].make(1.0, 1.0)
    sampler = algo.sampler(0, N)
    state = algo.init(torch.zeros(DIM, dtype=torch.float64), 3, torch.Generator())
    _, event = algo.step(state, Batch(0, sampler.sample(torch.Generator().manual_seed(1)), sampler), oracle(),
                         SeededNoise(2))
    assert event == dpa.ComposedDpEvent([dpa.PoissonSampledDpEvent(40 / N, dpa.GaussianDpEvent(1.0)),
                                         dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(2.0))])


def test_rejected_steps_still_spend_both_releases():
    """β = −10⁹: every candidate is rejected, θ never moves, no step is counted as accepted, and the
    ledger is still the whole plan: T candidates and T tests (the ε of 20 steps, above that of 19)."""
    algo = dpsur(threshold=-1e9)
    manual = replay(algo, 20)
    assert all(torch.equal(theta, manual.thetas[0]) for theta in manual.thetas) and manual.state.accepted == 0
    assert manual.ledger.event() == canonical(algo.planned_event(N, 20))
    assert manual.ledger.steps == 40
    assert manual.ledger.epsilon(DELTA) > epsilon_of(algo.planned_event(N, 19), DELTA, ADD_REMOVE) > 0


def test_calibration_keeps_the_ratio_of_the_test_noise_to_the_candidates():
    algo = accounting.calibrate(dpsur(noise_ratios=(1.0, 3.0)), epsilon=1.0, delta=DELTA, n=N, steps=30)
    assert algo.val_noise_multiplier == pytest.approx(3 * algo.noise_multiplier, rel=1e-12)
    assert 0.99 <= epsilon_of(algo.planned_event(N, 30), DELTA, ADD_REMOVE) <= 1.0


def test_the_tests_clipped_sum_moves_by_at_most_c_v_when_a_record_is_removed():
    """Per-record loss changes of any size (±10³⁰⁰, ∞, NaN): removing one validation record moves
    b_v·u (noise 0) by at most C_v = 0.5. The same measurement on an unclipped test (C_v = ∞, the
    mutant) sees the record's whole change."""

    class Losses:
        """per_record_loss: record i's loss is 0 at θ and ``changes[i]`` at the candidate."""
        n = 4

        def __init__(self, changes: list[float]) -> None:
            self.changes = torch.tensor(changes, dtype=torch.float64)

        def per_record_loss(self, thetas: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
            return torch.stack([torch.zeros(len(indices), dtype=torch.float64), self.changes[indices]], dim=1)

        def regulariser(self, theta: torch.Tensor) -> torch.Tensor:
            return theta.new_zeros(())

    checks = Poisson(4, 1.0)
    theta = torch.zeros(1, dtype=torch.float64)
    for last in (1e300, -1e300, math.inf, -math.inf, math.nan, 0.3):
        for clip, bounded in ((0.5, True), (math.inf, False)):
            algo = dpsur(noise_multiplier=0.0, val_noise_multiplier=0.0, val_clip=clip, clip=math.inf)
            oracle_ = Losses([0.2, -3.0, 7.0, last])
            sums = [algo.test(theta, theta, torch.arange(k), checks, oracle_, SeededNoise(0))[0] * 4 for k in (4, 3)]
            moved = abs(sums[0] - sums[1]) if math.isfinite(sums[0]) else math.inf
            if bounded:
                assert moved <= 0.5 * (1 + 1e-12), (last, moved)
            elif last == 1e300:
                assert moved > 1e299  # the mutant: an unclipped change moves it arbitrarily


# ------------------------------------------------------------------------------ the accept rule


def toy(lr: float, threshold: float) -> tuple[torch.Tensor, int]:
    """One noiseless step on ℓ_i(θ) = ½θ² (n = 10, x = 1, y = 0) from θ = 1, every record in the
    batch and in the test: θ' = 1 − η and u = ½(θ'² − 1) exactly."""
    algo = DPSUR(lr=lr, clip=math.inf, noise_multiplier=0.0, val_noise_multiplier=0.0, batch_size=10, val_rate=1.0,
                 val_clip=math.inf, threshold=threshold)
    problem = LeastSquares(torch.ones(10, 1, dtype=torch.float64), torch.zeros(10, dtype=torch.float64))
    sampler = algo.sampler(0, 10)
    state = algo.init(torch.ones(1, dtype=torch.float64), 1, torch.Generator())
    new, _ = algo.step(state, Batch(0, sampler.sample(torch.Generator()), sampler), problem, SeededNoise(0))
    return new.theta, new.accepted


@pytest.mark.parametrize(("lr", "change"), [(0.5, -0.375), (3.0, 1.5)])
def test_a_step_is_kept_iff_its_loss_change_is_below_beta(lr, change):
    """η = 0.5 lowers the loss (u = −0.375): kept at β = 0, rejected at β just below u. η = 3 raises it
    (θ' = −2, u = 1.5): rejected at β = 0, kept at β just above u. Kept means θ₁ = θ', else θ₁ = θ₀."""
    candidate = torch.tensor([1.0 - lr], dtype=torch.float64)
    for threshold, kept in ((0.0, change < 0), (change - 1e-9, False), (change + 1e-9, True)):
        theta, accepted = toy(lr, threshold)
        assert accepted == kept, (threshold, kept)
        assert torch.allclose(theta, candidate if kept else torch.ones(1, dtype=torch.float64), rtol=0, atol=1e-15)


def selective_sgd_reference(algo: DPSUR, steps: int) -> tuple[list[torch.Tensor], int]:
    """Minibatch SGD with the selection, by hand with autograd on ``oracle.loss``: θ' = θ − η·∇(Σ_{i∈B} f_i)(θ)/b;
    V drawn at rate q_v from the noise source's generator; u = Σ_{i∈V} (ℓ_i(θ') − ℓ_i(θ))/b_v + r(θ') − r(θ),
    ℓ_i = f_i − r the data loss of record i alone; θ ← θ' iff u < β. Returns θ_0 … θ_T and the accepted count."""
    sample_gen, source, _ = train.randomness(SEED)
    problem, batches, checks = oracle(), Poisson.of(N, algo.batch_size), Poisson(N, algo.val_rate)
    theta, thetas, accepted = torch.zeros(DIM, dtype=torch.float64), [], 0
    thetas.append(theta)
    for _ in range(steps):
        indices = batches.sample(sample_gen)
        point = theta.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(len(indices) * problem.loss(point, indices), point)
        candidate = theta - algo.lr * grad / algo.batch_size
        regulariser = float(problem.regulariser(candidate) - problem.regulariser(theta))
        change = sum(float(problem.loss(candidate, i[None]) - problem.loss(theta, i[None])) - regulariser
                     for i in checks.sample(source.generator))
        if change / checks.expected_size + regulariser < algo.threshold:
            theta, accepted = candidate, accepted + 1
        thetas.append(theta)
    return thetas, accepted


def test_without_noise_or_clipping_it_is_sgd_that_keeps_the_steps_that_lower_the_validation_loss():
    algo = TABLE["dpsur"].make(0.0, math.inf)
    want, accepted = selective_sgd_reference(algo, 30)
    manual = replay(algo, 30)
    assert 0 < accepted < 30  # both outcomes occur on this seed
    assert manual.state.accepted == accepted
    for t, (got, expected) in enumerate(zip(manual.thetas, want)):
        assert torch.allclose(got, expected, rtol=0, atol=1e-10), t
    assert math.isinf(epsilon_of(algo.planned_event(N, 30), DELTA, ADD_REMOVE))


# ------------------------------------------------------------------------------ what is written


def test_the_accepted_count_is_written_and_no_validation_loss_is(capsys, tmp_path):
    """`dpopt run --algorithm dp-sur`: calibrated to ε = 1 with σ_v = 2σ, the same θ as the plan run in
    Python, ``final.accepted_steps`` written and classified private, and nothing else beyond the private
    metrics (no un-noised validation loss; a field like it would be refused by the classifier)."""
    out = tmp_path / "run"
    argv = ["run", "--algorithm", "dp-sur", "--dataset", "adult", "--epsilon", "1", "--steps", "20", "--lr", "0.3",
            "--batch-size", "500", "--val-rate", "0.02", "--noise-ratio", "2", "--threshold", "-0.001", "--seed", "4",
            "--json", "--out", str(out)]
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    written = json.loads((out / "history.json").read_text())
    for payload in (shown, written):
        assert outputs.unclassified(payload) == []
        assert set(payload["final"]) == set(outputs.PRIVATE_METRICS) | set(outputs.RELEASED_COUNTS)
    assert 0.99 <= shown["final"]["epsilon"] <= 1.0 and written["diagnostics"] is None
    adult = data.load("adult")
    problem = make("logistic", torch.as_tensor(adult.X_train), torch.as_tensor(adult.y_train), reg=1e-3)
    plan = plan_for(build("dp-sur", n=problem.n, lr=0.3, batch_size=500, val_rate=0.02, noise_ratio=2.0,
                          threshold=-0.001), n=problem.n, steps=20, delta=1e-5, epsilon=1.0)
    assert plan.algorithm.val_noise_multiplier == pytest.approx(2 * plan.algorithm.noise_multiplier, rel=1e-12)
    history = train.train(plan, problem, train.Options(seed=4))
    assert written["theta"] == history.theta.tolist()
    assert written["final"]["accepted_steps"] == history.final["accepted_steps"] == float(
        history.final["accepted_steps"]) and 0 <= history.final["accepted_steps"] <= 20
    assert outputs.unclassified({"final": {"accepted_steps": 3.0, "validation_loss": 0.2}}) == [
        "final.validation_loss"]


def test_the_accepted_count_is_the_number_of_steps_that_moved():
    algo = TABLE["dpsur"].make(1.0, 1.0)
    manual = replay(algo, 30)
    moved = sum(not torch.equal(a, b) for a, b in zip(manual.thetas, manual.thetas[1:]))
    assert manual.state.accepted == moved and 0 < moved < 30
    assert dpopt.run(algo, oracle(), steps=30, seed=SEED, delta=DELTA, log_every=30).final["accepted_steps"] == moved


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_a_torch_model_is_trained_by_name_on_each_engine(engine):
    """``dpopt.fit(..., algorithm="dp-sur")``: the test's losses are each record's alone on either engine."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=gen)
    y = (X[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    loss = lambda out, target: torch.nn.functional.cross_entropy(out, target, reduction="none")  # noqa: E731
    history = dpopt.fit(model, loss, (X, y), algorithm="dp-sur", epsilon=2.0, delta=1e-5, epochs=1, batch_size=40,
                        engine=engine, seed=1, val_rate=0.2)
    assert outputs.unclassified(history.to_dict()) == [] and 0 <= history.final["accepted_steps"] <= 5
    assert 0.99 * 2.0 <= history.final["epsilon"] <= 2.0


def test_bad_settings_by_name_are_one_line(capsys):
    assert main(["run", "--algorithm", "dp-sur", "--dataset", "adult", "--epsilon", "1", "--steps", "2",
                 "--sampling", "fixed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sampling='fixed' is refused for algorithm='dp-sur'" in err
    assert main(["run", "--algorithm", "dp-sur", "--dataset", "adult", "--epsilon", "1", "--steps", "2",
                 "--val-rate", "0"]) == 2
    assert "--val-rate=0.0 must be in (0, 1]" in capsys.readouterr().err
