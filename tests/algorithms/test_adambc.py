"""DP-AdamBC (Tang et al. 2024): the update (one implementation, :func:`dpopt.algorithms.adam.
bias_corrected_step`) against a hand computation, the wrapper algorithm around DP-SGD, the noise
variance each algorithm states, and the registry's ``optimizer="adambc"``. (Ledger = plan and
checkpoints: the contract table; with ``dpopt.Private`` and ``dpopt.optim.AdamBC``:
``tests/test_private.py``; over-correcting is not a privacy bug: ``tests/test_audit_beyond_dp_sgd.py``.)"""

from __future__ import annotations

import math
import re

import dp_accounting as dpa
import numpy as np
import pytest
import torch

import dpopt
from dpopt import accounting
from dpopt._validate import DpoptError
from dpopt.algorithms import DPSGD, AdamBC
from dpopt.algorithms.adam import bias_corrected_step
from dpopt.algorithms.registry import build
from dpopt.base import Batch
from dpopt.correlation.strategy import BandedToeplitz
from dpopt.mechanisms import SeededNoise
from dpopt.plan import Plan
from dpopt.sampling import FixedSize

BETAS, LR, GAMMA = (0.9, 0.99), 0.1, 1e-3


def by_hand(theta: list[float], grads: list[list[float]], variances: list[float], eps: float = 0.0) -> list[float]:
    """Algorithm 1 of the paper, coordinate by coordinate in Python floats, with the noise's share
    φ_t = β2 φ_{t−1} + (1 − β2)Φ_t of v_t bias-corrected like v (φ̂ = Φ for a constant Φ)."""
    b1, b2 = BETAS
    m, v, phi = [0.0] * len(theta), [0.0] * len(theta), 0.0
    theta = list(theta)
    for t, (grad, variance) in enumerate(zip(grads, variances), start=1):
        phi = b2 * phi + (1 - b2) * variance
        for j, g in enumerate(grad):
            m[j] = b1 * m[j] + (1 - b1) * g
            v[j] = b2 * v[j] + (1 - b2) * g * g
            m_hat, v_hat, phi_hat = m[j] / (1 - b1**t), v[j] / (1 - b2**t), phi / (1 - b2**t)
            theta[j] -= LR * m_hat / (math.sqrt(max(v_hat - phi_hat, GAMMA)) + eps)
    return theta


@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_the_update_is_the_hand_computation(eps):
    """Three steps on three coordinates; the second coordinate's corrected second moment falls
    below the floor γ (its gradients are mostly noise), so the max(·, γ) is exercised."""
    grads = [[0.5, 0.05, -2.0], [0.4, -0.04, -1.5], [0.6, 0.03, -1.0]]
    variances = [0.01, 0.02, 0.015]
    theta, m, v, noise = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.zeros(3, dtype=torch.float64), \
        torch.zeros(3, dtype=torch.float64), 0.0
    for t, (grad, variance) in enumerate(zip(grads, variances), start=1):
        noise = bias_corrected_step(theta, torch.tensor(grad, dtype=torch.float64), m, v, step=t, noise=noise,
                                    variance=variance, lr=LR, betas=BETAS, eps=eps, gamma=GAMMA)
    want = by_hand([1.0, -1.0, 0.5], grads, variances, eps)
    assert theta.tolist() == pytest.approx(want, rel=1e-14, abs=1e-15)
    assert grads[0][1] ** 2 - variances[0] < GAMMA  # v̂ − φ̂ at t = 1: the floor binds on the second coordinate
    assert noise == pytest.approx(0.01 * 0.99**2 * 0.01 + 0.01 * 0.99 * 0.02 + 0.01 * 0.015, rel=1e-14)


def logistic() -> dpopt.oracles.Logistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(400, 5, generator=gen, dtype=torch.float64)
    return dpopt.oracles.Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0))


def test_the_wrapper_moves_theta_by_adam_on_the_inner_release():
    """One step of ``AdamBC(DPSGD)``: the inner step's release and event, and
    θ_1 = θ_0 − lr·m̂/√max(v̂ − Φ, γ) with g̃ the inner's direction and Φ = (z·C/b)²."""
    inner = DPSGD(lr=0.5, clip=0.7, noise_multiplier=1.3, batch_size=40)
    wrapped = AdamBC(inner, lr=LR, betas=BETAS, gamma=GAMMA)
    theta0 = torch.full((5,), 0.2, dtype=torch.float64)
    sampler = inner.sampler(0, 400)
    batch = Batch(0, sampler.sample(torch.Generator().manual_seed(1)), sampler)
    alone, event = inner.step(inner.init(theta0, 3, torch.Generator()), batch, logistic(), SeededNoise(8))
    state, wrapped_event = wrapped.step(wrapped.init(theta0, 3, torch.Generator()), batch, logistic(), SeededNoise(8))
    assert wrapped_event == event and torch.equal(wrapped.direction(state), inner.direction(alone))
    assert wrapped.release_variance(state) == inner.release_variance(alone) == (1.3 * 0.7 / 40) ** 2
    want = by_hand(theta0.tolist(), [inner.direction(alone).tolist()], [(1.3 * 0.7 / 40) ** 2])
    assert state.theta.tolist() == pytest.approx(want, rel=1e-14)
    assert state.count == 1 and wrapped.output(state) is state.theta


def test_each_algorithm_states_the_variance_of_its_release():
    """Φ per coordinate of g̃: (z·f·C/b)² (f = 2 under replace-one); with bands, times Σ_{m≤t} d_m²,
    the squared norm of row t of C⁻¹ (against the dense inverse); AClip's (z·2λ)², with bands times
    the same row's."""
    theta0 = torch.zeros(5, dtype=torch.float64)
    fixed = DPSGD(lr=0.5, clip=0.7, noise_multiplier=1.3, batch_size=40, sampling=FixedSize)
    sampler = fixed.sampler(0, 400)
    state, _ = fixed.step(fixed.init(theta0, 3, torch.Generator()), Batch(0, sampler.sample(torch.Generator()),
                                                                          sampler), logistic(), SeededNoise(1))
    assert fixed.release_variance(state) == (1.3 * 2 * 0.7 / 40) ** 2
    banded = DPSGD(lr=0.5, clip=0.7, noise_multiplier=1.3, batch_size=40, bands=4)
    stepper = dpopt.train.Stepper.start(Plan(banded, n=400, steps=12, delta=1e-5), logistic(), theta0=theta0, seed=2)
    strategy = BandedToeplitz.optimal(4, 12)
    dense = np.zeros((12, 12))
    for i in range(12):
        for j, c in enumerate(strategy.coefficients):
            if i + j < 12:
                dense[i + j, i] = c
    rows = np.linalg.norm(np.linalg.inv(dense), axis=1) ** 2
    for t in range(12):
        stepper.step()
        assert banded.release_variance(stepper.state) == pytest.approx((1.3 * 0.7 / 40) ** 2 * rows[t], rel=1e-12)
    assert rows[0] < rows[-1]  # the rows of C⁻¹ grow: Φ_t changes from step to step
    aclip = dpopt.AClip(lr=0.5, clip=0.25, noise_multiplier=1.3, batch_size=40)
    assert aclip.release_variance(aclip.init(theta0, 3, torch.Generator())) == (1.3 * 0.5) ** 2
    aclip = dpopt.AClip(lr=0.5, clip=0.25, noise_multiplier=1.3, batch_size=40, bands=4)
    stepper = dpopt.train.Stepper.start(Plan(aclip, n=400, steps=12, delta=1e-5), logistic(), theta0=theta0, seed=2)
    for _ in range(7):
        stepper.step()
    assert aclip.release_variance(stepper.state) == pytest.approx((1.3 * 0.5) ** 2 * rows[6], rel=1e-12)


def test_calibrating_the_wrapper_calibrates_the_inner_algorithm():
    inner = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40)
    alone = Plan(inner, n=400, steps=30, delta=1e-5).calibrated(1.0)
    wrapped = Plan(AdamBC(inner), n=400, steps=30, delta=1e-5).calibrated(1.0)
    assert wrapped.algorithm == AdamBC(alone.algorithm) and accounting.noise_of(wrapped.algorithm) == {
        "noise_multiplier": alone.algorithm.noise_multiplier}
    assert wrapped.epsilon() == alone.epsilon()


def test_the_registry_wraps_the_algorithms_that_state_their_noise_variance():
    made = build("dp-bandmf", n=400, batch_size=40, lr=0.01, optimizer="adambc", adam_gamma=1e-6)
    assert isinstance(made, AdamBC) and (made.lr, made.gamma) == (0.01, 1e-6)
    assert made.inner == build("dp-bandmf", n=400, batch_size=40, lr=0.01)
    assert dpopt.train.keyed(made) and made.planned_event(400, 30) == made.inner.planned_event(400, 30)
    with pytest.raises(DpoptError, match=re.escape("must be an algorithm whose update is θ − η·g̃ and whose g̃ "
                                                   "has a stated noise variance")):
        build("dp-srm", n=400, batch_size=40, optimizer="adambc")
    with pytest.raises(DpoptError, match=re.escape("optimizer='adam' must be one of")):
        build("dp-sgd", n=400, batch_size=40, optimizer="adam")


def test_the_event_is_the_inner_algorithms():
    inner = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.1, batch_size=40)
    assert AdamBC(inner).planned_event(400, 10) == dpa.SelfComposedDpEvent(
        inner.sampler(0, 400).wrap(dpa.GaussianDpEvent(1.1)), 10)
