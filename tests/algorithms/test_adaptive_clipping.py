"""Quantile adaptive clipping (``DPSGD(clip_quantile=γ)``, Andrew et al. 2021): the clip follows the
γ-quantile of the gradient norms, each step releases the clipped sum and the count from the
Gaussian mechanism at the multipliers Theorem 1 splits σ into, and the accountant reads the pair as
one Gaussian of multiplier σ. (Ledger = plan, checkpoints and release mutants: the contract table;
the un-noised count: ``tests/test_audit_beyond_dp_sgd.py``; data-parallel: ``tests/test_distributed.py``.)"""

from __future__ import annotations

import math
import re

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation

import dpopt
from dpopt import clipping, train
from dpopt._validate import DpoptError
from dpopt.accounting import combined_multiplier, epsilon_of
from dpopt.algorithms import DPSGD, quantile
from dpopt.algorithms.registry import build
from dpopt.base import Batch
from dpopt.mechanisms import SeededNoise
from dpopt.plan import Plan
from dpopt.sampling import FixedSize, FullBatch, Poisson

ADD_REMOVE, REPLACE = NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE


def test_the_clip_tracks_the_target_quantile_of_known_norms():
    """n = 10,000 least-squares records x = 1, y_i = 2(i + ½)/n, trained at lr = 1e-9 so θ stays at
    0 (to ~1e-8) and record i's gradient norm is y_i: norms uniform on (0, 2), whose median is 1.
    γ = 0.5, η = 0.2, expected batch B = 1,000 (q = 0.1), σ_b = B/20, C_0 = 0.1, 300 steps.

    Tolerance: near C* = 1, log C_t is an AR(1) process, x_{t+1} = (1 − ηF'(C*)C*)·x_t − η·ξ_t with
    F(C) = C/2 (so 1 − 0.1 = 0.9) and ξ_t = b̂_t − F(C_t), of std √((σ_b/B)² + 1/(4B)) ≈ 0.0525
    (the count noise and the Poisson batch): stationary std 0.2·0.0525/√(1 − 0.81) ≈ 0.024. ±10 %
    is ln(1.1) ≈ 0.095 (3.9 sd) above and 0.105 below, so over the 200 steps checked (about 20
    independent ones: the correlation time is 10 steps) a crossing has a chance of ~2e-3; the climb
    from C_0 takes ~25 steps and its residual decays as 0.9^t. (Measured over seeds 0–3: sd 0.023–0.031.)"""
    n = 10_000
    oracle = dpopt.oracles.LeastSquares(torch.ones(n, 1, dtype=torch.float64),
                                        2 * (torch.arange(n, dtype=torch.float64) + 0.5) / n)
    algorithm = DPSGD(lr=1e-9, clip=0.1, noise_multiplier=1.0, batch_size=1_000, clip_quantile=0.5)
    stepper = train.Stepper.start(Plan(algorithm, n=n, steps=300, delta=1e-5), oracle,
                                  theta0=torch.zeros(1, dtype=torch.float64), seed=4)
    clips = []
    for _ in range(300):
        stepper.step()
        clips.append(stepper.state.clip)
    assert abs(float(stepper.state.theta)) < 1e-6
    assert clips[10] < 0.8  # it climbed from 0.1 ...
    assert all(0.9 <= clip <= 1.1 for clip in clips[100:])  # ... and stays within 10 % of the median


def test_each_step_releases_the_sum_at_z_grad_c_t_and_the_count_at_z_count_over_two():
    """One step on a fixed batch, against the same step without gradient noise (σ = 0, the count still
    noised), with the noise source's draws replayed: the sum moves by z_grad·C_0·ξ (ξ the first d
    normals), the count by z_count·½·ξ' (the next one), read back from C_1 = C_0·exp(−η(ĉ/B + ½ − γ));
    the event is both Gaussians, wrapped."""
    data = dpopt.oracles.Logistic(torch.randn(200, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
                                  torch.where(torch.arange(200) % 2 == 0, 1.0, -1.0))
    noisy = DPSGD(lr=0.5, clip=0.3, noise_multiplier=1.7, batch_size=40, clip_quantile=0.6, count_noise=3.0)
    clean = DPSGD(lr=0.5, clip=0.3, noise_multiplier=0.0, batch_size=40, clip_quantile=0.6, count_noise=3.0)
    sampler = noisy.sampler(0, 200)
    batch = Batch(0, sampler.sample(torch.Generator().manual_seed(1)), sampler)
    theta0 = torch.full((5,), 0.2, dtype=torch.float64)
    (moved, event), (still, _) = (algo.step(algo.init(theta0, 3, torch.Generator()), batch, data, SeededNoise(8))
                                  for algo in (noisy, clean))
    gen = torch.Generator().manual_seed(8)
    xi = torch.randn(5, generator=gen, dtype=torch.float64)
    xi_count = float(torch.randn(1, generator=gen, dtype=torch.float64))
    z_grad, z_count = quantile.gradient_multiplier(1.7, 3.0, ADD_REMOVE), 6.0
    assert z_grad == 1 / math.sqrt(1.7**-2 - 6.0**-2)
    assert torch.allclose(moved.release - still.release, z_grad * 0.3 * xi, rtol=1e-12, atol=1e-15)
    exact = clipping.count_within(data.per_record(theta0, batch.indices), 0.3, ADD_REMOVE)
    released = (-math.log(moved.clip / 0.3) / 0.2 - 0.5 + 0.6) * 40
    assert released - float(exact.value) == pytest.approx(z_count * 0.5 * xi_count, rel=1e-9)
    assert event == sampler.wrap(dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_grad), dpa.GaussianDpEvent(6.0)]))
    assert noisy.release_variance(moved) == (z_grad * 0.3 / 40) ** 2


@pytest.mark.parametrize("sampling", [Poisson, FixedSize])
def test_the_pair_costs_one_gaussian_of_multiplier_sigma(sampling):
    """Theorem 1: z_grad⁻² + z_count⁻² = σ⁻² (z_count = σ_b/(f/2), f = 1 or 2), so the plan's ε is
    that of ``wrap(Gaussian(σ))``; the accountant reads the two Gaussians on one sampled batch as one."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=40, sampling=sampling, clip_quantile=0.5)
    relation = sampling.relation
    z_count = quantile.count_multiplier(algorithm.count_std, relation)
    assert z_count == 2.0 * 2 / (2 if sampling is FixedSize else 1)  # σ_b = 40/20 over the count's sensitivity
    assert combined_multiplier([quantile.gradient_multiplier(1.3, 2.0, relation), z_count]) == pytest.approx(
        1.3, rel=1e-15)
    single = dpa.SelfComposedDpEvent(algorithm.sampler(0, 400).wrap(dpa.GaussianDpEvent(1.3)), 30)
    assert epsilon_of(algorithm.planned_event(400, 30), 1e-5, relation) == pytest.approx(
        epsilon_of(single, 1e-5, relation), rel=1e-9)


def test_the_count_has_sensitivity_one_half_and_counts_non_finite_records_as_clipped():
    rows = clipping.Dense(torch.tensor([[0.5, 0.0], [3.0, 4.0], [math.nan, 0.0], [0.0, 1.0]], dtype=torch.float64))
    count = clipping.count_within(rows, 1.0, ADD_REMOVE)
    assert count.value.tolist() == [2 - 2.0] and count.sensitivity == 0.5
    assert clipping.count_within(rows, 1.0, REPLACE).sensitivity == 1.0


@pytest.mark.parametrize(("given", "reason"), [
    ({"bands": 4}, "correlated noise needs the same sensitivity at every step"),
    ({"sampling": FullBatch}, "accounted as one Gaussian on the step's sampled batch"),
    ({"noise_multiplier": 4.0}, "noise_multiplier=4.0 must be below the count's multiplier 4.0"),
    ({"clip": math.inf}, "clip=inf must be finite with clip_quantile"),
])
def test_what_adaptive_clipping_refuses_says_why(given, reason):
    with pytest.raises(DpoptError, match=re.escape(reason)):
        DPSGD(**{"lr": 0.5, "clip": 1.0, "noise_multiplier": 1.0, "batch_size": 40, "clip_quantile": 0.5} | given)


def test_the_registry_takes_adaptive_clipping_for_dp_sgd_only():
    algorithm = build("dp-sgd", n=400, batch_size=40, clip_quantile=0.7, clip_lr=0.1, count_noise=5.0)
    assert (algorithm.clip_quantile, algorithm.clip_lr, algorithm.count_std) == (0.7, 0.1, 5.0)
    for name in ("dp-srm", "aclip", "dp-agd"):
        with pytest.raises(DpoptError, match=re.escape(f"clip_quantile=0.5 (adaptive clipping) is refused for "
                                                       f"algorithm={name!r}")):
            build(name, n=400, batch_size=40, clip_quantile=0.5)
    with pytest.raises(DpoptError, match="accounted on sampled batches"):
        build("dp-gd", n=400, clip_quantile=0.5)
