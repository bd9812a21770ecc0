"""DP-AGD (Lee & Kifer 2018): budget filter accounting, calibration, non-private reference."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
import torch

from dpopt import accounting, clipping, mechanisms, train
from dpopt._validate import DpoptError
from dpopt.algorithms import DPAGD
from dpopt.base import Batch
from dpopt.algorithms.dp_agd import _candidate_scores, _round
from dpopt.mechanisms import SeededNoise
from dpopt.oracles import Logistic, NonconvexLogistic

DELTA = 1e-5


def _data(n: int = 200, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    X = X / X.norm(dim=1, keepdim=True).clamp(min=1.0)
    w = 2 * torch.randn(d, generator=gen, dtype=torch.float64)
    y = torch.where(X @ w + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return X, y


@pytest.fixture(scope="module")
def oracle() -> Logistic:
    return Logistic(*_data())


def _algo(**overrides) -> DPAGD:
    settings = dict(noise_multiplier=0.5, clip=1.0, obj_clip=1.0, grad_fraction=0.02, select_fraction=0.03)
    return DPAGD(**(settings | overrides))


def _run_with_ledger(algo: DPAGD, oracle, steps: int, seed: int = 0):
    """train.run's loop, keeping the ledger and every state."""
    ledger = accounting.Ledger(algo.relation(), "rdp")
    source = SeededNoise(seed)
    state = algo.init(torch.zeros(oracle.dim, dtype=torch.float64), steps, source.generator)
    states, events = [state], []
    for t in range(steps):
        sampler = algo.sampler(t, oracle.n)
        state, event = algo.step(state, Batch(t, sampler.sample(source.generator), sampler), oracle, source)
        ledger.record(event)
        states.append(state)
        events.append(event)
    return ledger, states, events


def _rho_sum(event: dpa.DpEvent) -> float:
    """Σρ of the recorded events: the Gaussians' 1/(2z²) and the noisy argmins' ZCDpEvent(ρ)."""
    total = 0.0
    for atom, count in accounting.run_length([event]):
        assert isinstance(atom, dpa.ZCDpEvent | dpa.GaussianDpEvent), atom
        total += count * (atom.rho if isinstance(atom, dpa.ZCDpEvent) else 1 / (2 * atom.noise_multiplier**2))
    return total


RETRYING = dict(noise_multiplier=2.0, grad_fraction=0.002, select_fraction=0.03, num_candidates=5, gamma=0.5)


@pytest.mark.parametrize("overrides", [{}, RETRYING], ids=["default", "retrying"])
def test_exhausted_budget_spends_exactly_the_planned_rho(oracle, overrides):
    algo, steps = _algo(**overrides), 80
    ledger, states, events = _run_with_ledger(algo, oracle, steps)
    if overrides:  # the line search failed at least once: GradAvg releases were recorded
        assert any(isinstance(e, dpa.ComposedDpEvent) and len(e.events) > 2 for e in events)
    assert states[-1].exhausted and states[-1].remaining == 0.0
    assert math.isclose(_rho_sum(ledger.event()), algo.rho_total, rel_tol=1e-12)
    planned = algo.planned_event(oracle.n, steps)
    assert planned == dpa.ZCDpEvent(algo.rho_total)
    expected = accounting.epsilon_of(planned, DELTA, algo.relation())
    assert ledger.accountant == "rdp"
    assert ledger.epsilon(DELTA) == pytest.approx(expected, rel=1e-9)
    # after exhaustion: no-ops, θ frozen
    first = next(t for t, s in enumerate(states) if s.exhausted)
    assert first < steps
    assert all(isinstance(e, dpa.NoOpDpEvent) for e in events[first:])
    assert all(torch.equal(s.theta, states[first].theta) for s in states[first:])


def test_train_run_ledger_epsilon_equals_planned(oracle):
    algo, steps = _algo(), 80
    history = train.run(algo, oracle, steps=steps, seed=3, delta=DELTA)
    expected = accounting.epsilon_of(algo.planned_event(oracle.n, steps), DELTA, algo.relation())
    assert history.accountant == "rdp" and history.neighboring_relation == "replace-one"
    assert history.final["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert float(oracle.loss(history.theta)) < float(oracle.loss(torch.zeros(oracle.dim, dtype=torch.float64)))


def test_last_round_spends_exactly_the_remainder():
    assert _round(10.0, 1.0, 2.0) == (1.0, 2.0, False)        # 2c = 6 <= 10: nominal
    grad, select, last = _round(5.0, 1.0, 2.0)                # 5 < 6: last, scaled up
    assert last and grad == pytest.approx(5 / 3) and grad + select == 5.0
    grad, select, last = _round(0.3, 1.0, 2.0)                # less than c left: scaled down
    assert last and grad == pytest.approx(0.1) and grad + select == 0.3


def test_unfinished_run_spends_at_most_the_budget(oracle):
    algo = _algo(grad_fraction=0.001, select_fraction=0.002)
    ledger, states, _ = _run_with_ledger(algo, oracle, steps=5)
    assert not states[-1].exhausted
    spent = _rho_sum(ledger.event())
    assert 0 < spent < algo.rho_total
    assert math.isclose(spent + states[-1].remaining, algo.rho_total, rel_tol=1e-12)


def test_calibrate_reaches_target_epsilon(oracle):
    steps = 50
    calibrated = accounting.calibrate(_algo(noise_multiplier=1.0), epsilon=1.0, delta=DELTA, n=oracle.n, steps=steps)
    achieved = accounting.epsilon_of(calibrated.planned_event(oracle.n, steps), DELTA, calibrated.relation())
    assert 0.99 <= achieved <= 1.0
    assert calibrated.grad_fraction == 0.02 and calibrated.obj_clip == 1.0


def _reference_gd_line_search(oracle, steps, *, max_step, num_candidates, adapt_every, step_growth):
    """Non-private DP-AGD: normalised GD, exact argmin of F over Φ, same Φ adaptation."""
    theta = torch.zeros(oracle.dim, dtype=torch.float64)
    alpha_max, chosen, iterates = max_step, [], []
    for t in range(steps):
        grad = oracle.gradient(theta)
        direction = grad / grad.norm()
        alphas = torch.linspace(0.0, alpha_max, num_candidates + 1, dtype=torch.float64)
        losses = torch.stack([oracle.loss(theta - alpha * direction) for alpha in alphas])
        best = int(torch.argmin(losses))
        if best > 0:
            theta = theta - alphas[best] * direction
            chosen.append(float(alphas[best]))
        if (t + 1) % adapt_every == 0:
            if chosen:
                alpha_max = min((1 + step_growth) * max(chosen), max_step)
            chosen = []
        iterates.append(theta.clone())
    return iterates


@pytest.mark.parametrize("make", [lambda X, y: Logistic(X, y), lambda X, y: NonconvexLogistic(X, y, reg=0.05)],
                         ids=["logistic", "nonconvex-logistic"])
def test_noise_zero_reproduces_non_private_line_search(make):
    oracle = make(*_data(seed=1))
    settings = dict(max_step=4.0, num_candidates=8, adapt_every=3, step_growth=0.2)
    algo = DPAGD(noise_multiplier=0.0, clip=math.inf, obj_clip=math.inf, **settings)
    assert isinstance(algo.planned_event(oracle.n, 10), dpa.NonPrivateDpEvent)
    steps = 15
    _, states, events = _run_with_ledger(algo, oracle, steps)
    reference = _reference_gd_line_search(oracle, steps, **settings)
    assert all(math.isinf(accounting.epsilon_of(e, 1e-5, algo.relation())) for e in events)
    assert any(s.max_step != settings["max_step"] for s in states)  # the Φ update ran
    for t, (state, expected) in enumerate(zip(states[1:], reference)):
        torch.testing.assert_close(state.theta, expected, rtol=0, atol=1e-10, msg=f"step {t}")


def test_noisy_min_is_the_exponential_mechanism(oracle):
    """P(k) ∝ exp(−u_k/b) with b = C_obj/√(2ρ): the law the ρ = ε²/8 accounting assumes; the
    mechanism returns ZCDpEvent(ρ)."""
    algo = _algo()
    losses = torch.tensor([[3.0, 2.0, 2.5, 6.0]], dtype=torch.float64) / 10
    scores = clipping.clip_loss_sums(losses, algo.obj_clip, public_offset=torch.zeros(4, dtype=torch.float64))
    rho = 0.5
    source = SeededNoise(7)
    draws = 6000
    counts = torch.zeros(4)
    for _ in range(draws):
        pick, event = mechanisms.noisy_argmin(scores, rho, source)
        counts[pick] += 1
    assert event == dpa.ZCDpEvent(rho) and scores.sensitivity == algo.obj_clip
    scores = scores.value
    scale = algo.obj_clip / math.sqrt(2 * rho)
    expected = torch.softmax(-scores / scale, dim=0)
    assert torch.allclose(counts / draws, expected.float(), atol=0.02)


def test_candidate_scores_have_bounded_sensitivity(oracle):
    """Replacing one record moves every clipped score by at most C_obj."""
    X, y = _data()
    neighbour_X, neighbour_y = X.clone(), y.clone()
    neighbour_X[0], neighbour_y[0] = 100 * X[0], -y[0]
    thetas = torch.randn(6, X.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    indices = torch.arange(len(y))
    a = _candidate_scores(Logistic(X, y), thetas, indices, 0.7, len(y))
    b = _candidate_scores(Logistic(neighbour_X, neighbour_y), thetas, indices, 0.7, len(y))
    assert a.sensitivity == b.sensitivity == 0.7
    assert (a.value - b.value).abs().max() <= 0.7 + 1e-12


@pytest.mark.parametrize("overrides, name", [
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"clip": 0.0}, "clip"),
    ({"obj_clip": -1.0}, "obj_clip"),
    ({"clip": math.inf}, "clip"),
    ({"obj_clip": math.inf}, "obj_clip"),
    ({"grad_fraction": 0.0}, "grad_fraction"),
    ({"select_fraction": 1.5}, "select_fraction"),
    ({"grad_fraction": 0.6, "select_fraction": 0.6}, "grad_fraction"),
    ({"gamma": 0.0}, "gamma"),
    ({"max_step": math.inf}, "max_step"),
    ({"num_candidates": 0}, "num_candidates"),
    ({"adapt_every": 1.5}, "adapt_every"),
    ({"step_growth": -0.1}, "step_growth"),
])
def test_invalid_hyper_parameters_name_the_argument(overrides, name):
    with pytest.raises(DpoptError, match=name):
        _algo(**overrides)
