"""Noise sources: the OS-CSPRNG Gaussian and the exact discrete Gaussian, and their events.

Draws from the OS CSPRNG cannot be seeded, so their tests use bounds whose failure probability
under the right distribution is stated (and astronomically small); the discrete sampler itself
is tested with a seeded ``random.Random``.
"""

from __future__ import annotations

import math
import random

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import NeighboringRelation
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

import dpopt
from dpopt import accounting, clipping, mechanisms
from dpopt._validate import DpoptError
from dpopt.mechanisms import SeededNoise, SystemNoise, discrete_gaussian, secure_normals

N = 25_000
#: DKW: P(sup|F_n − F| > x) ≤ 2·exp(−2·N·x²); at x = 0.02 that is 2e^{−20} ≈ 4e-9.
KS_BOUND = 0.02


def zero_bounded(clip: float, dim: int) -> mechanisms.Bounded:
    rows = clipping.Dense(torch.zeros(1, dim, dtype=torch.float64))
    return clipping.clip_sum([clipping.Term(1.0, rows, clip)], NeighboringRelation.ADD_OR_REMOVE_ONE)[0]


def test_secure_normals_are_standard_normal_and_wrong_scales_are_rejected():
    samples = secure_normals(N)
    assert samples.shape == (N,) and np.isfinite(samples).all()
    assert stats.kstest(samples, "norm").statistic < KS_BOUND
    # scale s ∈ {2/3, 3/2}: sup|Φ(x) − Φ(x/s)| = 0.0968, and the empirical statistic is within
    # KS_BOUND of it (same DKW event), so D ≥ 0.076 > KS_BOUND.
    for wrong in (2 / 3, 3 / 2):
        assert stats.kstest(samples, "norm", args=(0.0, wrong)).statistic > 0.0968 - KS_BOUND


def test_secure_gaussian_mechanism_has_std_z_times_sensitivity_and_no_seed():
    z, clip = 1.3, 0.7
    x = zero_bounded(clip, N)
    noised, event = mechanisms.gaussian(x, z, SystemNoise())
    assert event == dpa.GaussianDpEvent(z)
    assert stats.kstest(noised.numpy(), "norm", args=(0.0, z * clip)).statistic < KS_BOUND
    again, _ = mechanisms.gaussian(x, z, SystemNoise())
    assert not torch.equal(noised, again)  # not from the seed: equal draws have probability ~0


def exact_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    """N_Z(0, σ²) on ``support``, normalised over |y| ≤ 60σ (the rest has mass < e^{−1800})."""
    everything = np.arange(-math.ceil(60 * sigma), math.ceil(60 * sigma) + 1)
    total = np.exp(-everything**2 / (2 * sigma**2)).sum()
    return np.exp(-support.astype(float) ** 2 / (2 * sigma**2)) / total


@pytest.mark.parametrize("sigma", [0.8, 3.0, 10.5])
def test_discrete_gaussian_matches_its_pmf(sigma):
    """Chi-square goodness of fit of 20,000 seeded draws: bins y for |y| ≤ 3σ, tails merged.
    Under the right pmf the p-value is Uniform(0, 1) (fixed seed: a priori 0.1 % chance of < 1e-3);
    the pmf of 1.25σ leaves ≥ 0.01 per bin in total variation, a χ² of thousands, p < 1e-9."""
    rng = random.Random(17)
    draws = np.array([discrete_gaussian(sigma, rng) for _ in range(20_000)])
    edge = max(1, math.floor(3 * sigma))
    inner = np.arange(-edge, edge + 1)
    observed = np.array([(draws < -edge).sum(), *[(draws == y).sum() for y in inner], (draws > edge).sum()])

    def expected(s: float) -> np.ndarray:
        mass = exact_pmf(s, inner)
        tail = (1 - mass.sum()) / 2
        return len(draws) * np.array([tail, *mass, tail])

    assert stats.chisquare(observed, expected(sigma)).pvalue > 1e-3
    assert stats.chisquare(observed, expected(1.25 * sigma)).pvalue < 1e-9


def test_bernoulli_exp_is_exact_in_frequency():
    """P(True) = e^{−γ}: 40,000 draws within 5 standard errors (chance of failing ~6e-7)."""
    from fractions import Fraction

    rng = random.Random(3)
    for gamma in (Fraction(3, 10), Fraction(17, 10), Fraction(5, 2)):
        p = math.exp(-float(gamma))
        hits = sum(mechanisms._bernoulli_exp(gamma, rng) for _ in range(40_000))
        assert abs(hits / 40_000 - p) < 5 * math.sqrt(p * (1 - p) / 40_000)


@pytest.mark.parametrize(("sigma", "shift"), [(0.7, 1), (2.0, 1), (2.0, 3), (5.5, 4)])
def test_discrete_gaussian_renyi_divergence_is_within_the_zcdp_event(sigma, shift):
    """The event ZCDp(Δ²/(2σ²)) claims D_α(N_Z(0,σ²) ‖ N_Z(Δ,σ²)) ≤ α·Δ²/(2σ²) for every α > 1;
    computed here by summing over the integers (CKS 2020, Theorem 14)."""
    y = np.arange(-math.ceil(60 * sigma) - shift, math.ceil(60 * sigma) + shift + 1).astype(float)
    log_p = -y**2 / (2 * sigma**2)
    log_q = -(y - shift) ** 2 / (2 * sigma**2)
    log_z = np.logaddexp.reduce(log_p)
    rho = shift**2 / (2 * sigma**2)
    for alpha in (1.5, 2.0, 4.0, 16.0, 64.0):
        divergence = np.logaddexp.reduce(alpha * log_p + (1 - alpha) * log_q - log_z) / (alpha - 1)
        assert divergence <= alpha * rho * (1 + 1e-9)


@given(st.integers(1, 6), st.floats(0.01, 10.0), st.data())
def test_rounding_to_the_grid_adds_at_most_sqrt_d(dim, sensitivity, data):
    """‖round(x/γ) − round(x′/γ)‖ ≤ ‖x − x′‖/γ + √d: the grid sensitivity the noise is scaled to."""
    step = mechanisms.grid_step(sensitivity, dim)
    assert step <= sensitivity / (1024 * math.sqrt(dim)) and math.log2(step).is_integer()
    x = torch.tensor(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=dim, max_size=dim)), dtype=torch.float64)
    direction = torch.tensor(data.draw(st.lists(st.floats(-1, 1), min_size=dim, max_size=dim)), dtype=torch.float64)
    if float(direction.norm()) > 0:
        direction = direction / direction.norm() * sensitivity * data.draw(st.floats(0, 1))
    other = x + direction
    moved = float((torch.round(x / step) - torch.round(other / step)).norm())
    assert moved <= float((x - other).norm()) / step + math.sqrt(dim) + 1e-9


def test_discrete_mechanism_releases_grid_points_with_the_right_spread_and_event():
    z, clip, dim = 0.9, 0.5, 2_000
    x = zero_bounded(clip, dim)
    noised, event = mechanisms.gaussian(x, z, SeededNoise(0), mechanisms.DISCRETE)
    step = mechanisms.grid_step(clip, dim)
    assert event == dpa.ZCDpEvent(1 / (2 * z**2))
    assert torch.equal(noised / step, torch.round(noised / step))  # exact grid points
    sigma = z * (clip + math.sqrt(dim) * step)  # σ on the grid, times γ
    # variance within 6 standard errors (σ²·√(2/n)); the discrete variance is below σ² by < 1e-12 here
    assert abs(float(noised.var()) - sigma**2) < 6 * sigma**2 * math.sqrt(2 / dim)


def test_discrete_event_is_the_gaussian_rdp_curve():
    """Unsampled, ZCDp(1/(2z²)) and Gaussian(z) have the same RDP curve, so the same ε under RDP."""
    for z in (0.6, 1.0, 3.0):
        for relation in (NeighboringRelation.REPLACE_ONE, NeighboringRelation.ADD_OR_REMOVE_ONE):
            zcdp = dpa.SelfComposedDpEvent(mechanisms.DISCRETE.event(z), 20)
            gauss = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 20)
            assert accounting.epsilon_of(zcdp, 1e-5, relation, "rdp") == pytest.approx(
                accounting.epsilon_of(gauss, 1e-5, relation, "rdp"), rel=1e-12)
    assert mechanisms.DISCRETE.event(0.0) == dpa.GaussianDpEvent(0.0)


def test_discrete_noise_refuses_sampled_batches():
    discrete = mechanisms.DISCRETE
    with pytest.raises(DpoptError, match=r"noise=Discrete\(\) needs sampling=FullBatch, not sampling=<class "
                                         r"'dpopt.sampling.Poisson'>"):
        dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=4, noise=discrete)
    with pytest.raises(DpoptError, match=r"noise=Discrete\(\) needs sampling=FullBatch"):
        dpopt.AClip(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=4, noise=discrete)
    with pytest.raises(DpoptError,
                       match="noise='fast' must be dpopt.mechanisms.CONTINUOUS or dpopt.mechanisms.DISCRETE"):
        dpopt.dp_gd(lr=0.1, clip=1.0, noise_multiplier=1.0, noise="fast")
    with pytest.raises(DpoptError, match="noise='fast' must be one of: torch, secure, discrete"):
        dpopt.algorithms.registry.build("dp-gd", n=10, batch_size=2, noise="fast")
    with pytest.raises(DpoptError, match="noise='discrete' must be one of: torch, secure"):
        dpopt.algorithms.registry.build("storm", n=10, batch_size=2, noise="discrete")


def _problem() -> dpopt.oracles.Logistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    y = torch.where(X[:, 0] > 0, 1.0, -1.0)
    return dpopt.oracles.Logistic(X, y)


@pytest.mark.parametrize("name", ["dp-gd", "dp-agd"])
@pytest.mark.parametrize("noise", ["secure", "discrete"])
def test_calibrated_runs_with_hardened_noise_account_their_plan(name, noise):
    """Each full-batch algorithm calibrated to ε = 1 with each hardened source: ε ≤ target. For
    DP-GD the whole budget, and the noise does not come from the run's seed (two runs with one
    seed differ). DP-AGD is a privacy filter: what it spends, and where it moves, depends on its
    noisy choices, so only the budget is asserted."""
    oracle = _problem()
    algo = accounting.calibrate(dpopt.algorithms.registry.build(name, n=oracle.n, noise=noise), epsilon=1.0,
                                delta=1e-5, n=oracle.n, steps=10)
    source = dpopt.mechanisms.source_named(noise)
    first = dpopt.run(algo, oracle, steps=10, seed=0, noise_source=source)
    second = dpopt.run(algo, oracle, steps=10, seed=0, noise_source=source)
    assert first.final["epsilon"] <= 1.0 and second.final["epsilon"] <= 1.0
    if name == "dp-gd":
        assert 0.99 <= first.final["epsilon"] == second.final["epsilon"]
        assert first.accountant == ("rdp" if noise == "discrete" else "pld")
        assert not torch.equal(first.theta, second.theta)


def test_secure_uniforms_are_uniform_on_the_open_interval():
    draws = mechanisms.secure_uniforms(N)
    assert ((draws > 0) & (draws < 1)).all()
    assert stats.kstest(draws, "uniform").statistic < KS_BOUND  # DKW, as above
