"""Correlated noise (dpopt.correlation): banded Toeplitz strategies and their optimisation, the
streaming noise of banded and BLT strategies, their events and calibration.

Privacy checks and the mutants they catch: the streamed noise's covariance is σ²·C⁻¹C⁻ᵀ, and
noise streamed with another strategy's C⁻¹ fails the same check; a BLT's sensitivity is the
largest over every participation pattern a cyclic batch can produce (brute force); the planned
event of cyclic Poisson sampling equals what the sampler's ``wrap`` records step by step (in
tests/test_sampling.py, with the membership mutant)."""

from __future__ import annotations

import functools
import itertools
import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import NeighboringRelation

from dpopt import checkpoint, clipping, mechanisms
from dpopt._validate import DpoptError
from dpopt.accounting import solve_noise
from dpopt.correlation.blt import BufferedToeplitz
from dpopt.correlation.events import banded_event, buffered_event
from dpopt.correlation.noise import banded_gaussian, banded_noise, buffered_gaussian, buffered_noise
from dpopt.correlation.strategy import PREFIX_SUMS, BandedToeplitz, Workload, inverse_series, squared_error


class Scripted:
    """A noise source returning preset standard normal draws, one tensor per call."""

    def __init__(self, draws: torch.Tensor) -> None:
        self.draws = iter(draws)
        self.generator = torch.Generator()

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        return next(self.draws).to(like.dtype).clone().mul_(std)

    def gumbel(self, like: torch.Tensor, scale: float) -> torch.Tensor:
        raise AssertionError("not used")


def bounded(value: torch.Tensor, clip: float = 1.0) -> mechanisms.Bounded:
    return clipping.clip_aggregate(value, clip)  # sensitivity 2·clip


def toeplitz(first_column: np.ndarray, steps: int) -> np.ndarray:
    column = np.zeros(steps)
    column[: min(steps, len(first_column))] = first_column[:steps]
    return np.array([[column[i - j] if i >= j else 0.0 for j in range(steps)] for i in range(steps)])


def workload_matrix(workload: Workload, steps: int) -> np.ndarray:
    beta = workload.momentum
    return toeplitz(np.array([(1 - beta ** (m + 1)) / (1 - beta) for m in range(steps)]), steps)


# ------------------------------------------------------------------------------------------ strategies

def test_one_band_is_the_identity_exactly():
    assert BandedToeplitz.optimal(1, 2000).coefficients == (1.0,)
    assert BandedToeplitz.optimal(1, 5, Workload(0.9)).coefficients == (1.0,)


@pytest.mark.parametrize("bands", [2, 3, 4, 8, 16])
def test_optimal_strategy_has_unit_column_norm_and_positive_diagonal(bands):
    c = BandedToeplitz.optimal(bands, 2000).coefficients
    assert len(c) == bands and c[0] > 0
    assert 1 - 1e-12 <= math.fsum(v * v for v in c) <= 1.0


def test_inverse_series_and_error_equal_their_dense_matrices():
    steps = 12
    c = np.array(BandedToeplitz.optimal(4, 50).coefficients)
    inverse = np.linalg.inv(toeplitz(c, steps))
    assert np.allclose(toeplitz(inverse_series(c, steps), steps), inverse, rtol=0, atol=1e-12)
    for workload in (PREFIX_SUMS, Workload(0.9)):
        dense = float(np.sum((workload_matrix(workload, steps) @ inverse) ** 2))
        assert squared_error(c, steps, workload) == pytest.approx(dense, rel=1e-12)


@pytest.mark.parametrize("workload", [PREFIX_SUMS, Workload(0.9)], ids=["prefix", "momentum"])
def test_optimal_beats_the_closed_form_and_dp_sgd_at_equal_noise(workload):
    """At the same per-step noise multiplier (the only comparison that is meaningful without
    the accounting): optimised ≤ banded square root < identity (b = 1), strictly for b ≥ 2.
    DP-SGD's prefix-sum error is Σ_m (T − m) = T(T + 1)/2."""
    steps = 2000
    identity = BandedToeplitz.optimal(1, steps).squared_error(steps, workload)
    if workload == PREFIX_SUMS:
        assert identity == steps * (steps + 1) / 2
    for bands in (2, 4, 16):
        closed = BandedToeplitz.square_root(bands).squared_error(steps, workload)
        best = BandedToeplitz.optimal(bands, steps, workload).squared_error(steps, workload)
        assert best <= closed < identity
    # measured: b = 4 prefix sums 514,080 against the closed form's 624,594 and DP-SGD's 2,001,000
    assert (BandedToeplitz.optimal(4, steps).squared_error(steps)
            < 0.85 * BandedToeplitz.square_root(4).squared_error(steps))


def test_optimal_strategy_is_a_local_minimum():
    """No step of ±1e-3 along any free coefficient (then renormalised) lowers the error: the
    optimiser did its job (the closed form, its start, fails this)."""
    steps, bands = 500, 6
    for strategy in (BandedToeplitz.optimal(bands, steps), BandedToeplitz.square_root(bands)):
        c = np.array(strategy.coefficients)
        base = squared_error(c, steps)
        lower = []
        for j, sign in itertools.product(range(1, bands), (-1, 1)):
            moved = c.copy()
            moved[j] += sign * 1e-3
            lower.append(squared_error(moved / np.linalg.norm(moved), steps) < base * (1 - 1e-9))
        assert any(lower) == (strategy != BandedToeplitz.optimal(bands, steps))


def test_strategy_input_is_validated():
    with pytest.raises(DpoptError, match=r"unit column norm"):
        BandedToeplitz((0.8, 0.8))
    with pytest.raises(DpoptError, match=r"c_0 > 0"):
        BandedToeplitz((-0.6, 0.8))
    with pytest.raises(DpoptError, match=r"bands=5 must be >= 1 and <= steps=4"):
        BandedToeplitz.optimal(5, 4)
    with pytest.raises(DpoptError, match=r"momentum=1.0 must be in \[0, 1\)"):
        Workload(1.0)


# ----------------------------------------------------------------------------------- streamed noise

def test_one_band_is_the_gaussian_mechanism_bit_for_bit():
    """Same draws, same fused add: torch.equal at every step, and the generators end equal."""
    like = torch.zeros(1000, dtype=torch.float32)
    plain, banded = mechanisms.SeededNoise(7), mechanisms.SeededNoise(7)
    state = banded_noise(like, BandedToeplitz.optimal(1, 20))
    for t in range(20):
        x = bounded(torch.randn(1000, generator=torch.Generator().manual_seed(t)), clip=3.0)
        z = 0.0 if t == 5 else 1.3
        expected, event = mechanisms.gaussian(x, z, plain)
        got, state, got_event = banded_gaussian(x, z, state, banded, step=t)
        assert torch.equal(got, expected) and got_event == event
    assert torch.equal(plain.generator.get_state(), banded.generator.get_state())


@pytest.mark.parametrize("bands", [2, 5])
def test_streamed_noise_is_the_inverse_of_c_applied_to_the_draws(bands):
    """Fed known draws z_0 … z_{T−1}, the stream's noise is exactly (to rounding) C⁻¹z · (z·Δ)."""
    steps, dim = 9, 3
    draws = torch.randn(steps, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    strategy = BandedToeplitz.optimal(bands, steps)
    x = bounded(torch.zeros(dim, dtype=torch.float64), clip=0.5)  # Δ = 1
    state, source, got = banded_noise(x.value, strategy), Scripted(draws), []
    for t in range(steps):
        value, state, _ = banded_gaussian(x, 2.0, state, source, step=t)
        got.append(value)
    expected = 2.0 * np.linalg.solve(toeplitz(np.array(strategy.coefficients), steps), draws.numpy())
    assert np.allclose(torch.stack(got).numpy(), expected, rtol=0, atol=1e-12)
    assert len(state.past) == bands - 1 and all(p.shape == (dim,) for p in state.past)


def covariance_deviation(generate: BandedToeplitz, claimed: BandedToeplitz) -> float:
    """The largest standardised deviation of the empirical covariance of N = 10⁴ streamed noise
    vectors over T = 8 steps (noise of ``generate``) from σ²·C⁻¹C⁻ᵀ of ``claimed``.

    Each of the N coordinates streams its own 8-vector x ~ N(0, Σ). With the mean known (0),
    S = XᵀX/N has E S = Σ and Var S_ij = (Σ_ij² + Σ_ii Σ_jj)/N exactly (Wishart); the deviation is
    max_ij |S_ij − Σ_ij| / √Var S_ij. S_ij is a mean of 10⁴ i.i.d. products, close to normal, so each
    entry exceeds 5 with probability ≈ 6e-7 and any of the 36 with ≤ 2e-5."""
    steps, count, sigma = 8, 10_000, 1.5
    x = bounded(torch.zeros(count // 2, 2, dtype=torch.float64), clip=0.5)  # 2 coordinates × 5000: Δ = 1
    state, source, rows = banded_noise(x.value, generate), mechanisms.SeededNoise(2024), []
    for t in range(steps):
        value, state, _ = banded_gaussian(x, sigma, state, source, step=t)
        rows.append(value.reshape(-1))
    samples = torch.stack(rows, dim=1).numpy()  # [N, T]
    inverse = np.linalg.inv(toeplitz(np.array(claimed.coefficients), steps))
    sigma_matrix = sigma**2 * inverse @ inverse.T
    empirical = samples.T @ samples / count
    spread = np.sqrt((sigma_matrix**2 + np.outer(np.diag(sigma_matrix), np.diag(sigma_matrix))) / count)
    return float(np.max(np.abs(empirical - sigma_matrix) / spread))


COVARIANCE_BOUND = 5  # standard deviations (see covariance_deviation)


def test_streamed_noise_covariance_is_sigma_squared_c_inverse_c_inverse_transposed():
    strategy = BandedToeplitz.optimal(3, 8)
    assert covariance_deviation(strategy, strategy) <= COVARIANCE_BOUND  # measured 2.8


@pytest.mark.parametrize("other", [(2, 8), (3, 2000), (1, 8)], ids=["2-bands", "other-horizon", "independent"])
def test_covariance_check_catches_noise_from_another_strategy(other):
    """Mutant: noise streamed with C⁻¹ of a different C while the strategy optimised for b = 3,
    T = 8 is claimed: the 2-band one, the 3-band one optimised for T = 2000, or independent noise
    (C = I). Measured deviations 42, 283 and 42."""
    claimed = BandedToeplitz.optimal(3, 8)
    assert covariance_deviation(BandedToeplitz.optimal(*other), claimed) > COVARIANCE_BOUND


def test_state_refuses_a_resume_without_it_and_a_change_of_scale():
    x = bounded(torch.zeros(4), clip=1.0)
    strategy = BandedToeplitz.optimal(3, 10)
    state, source = banded_noise(x.value, strategy), mechanisms.SeededNoise(0)
    for t in range(3):
        _, state, _ = banded_gaussian(x, 1.0, state, source, step=t)
    with pytest.raises(ValueError, match=r"step=3 but the correlated-noise state has made 0 releases"):
        banded_gaussian(x, 1.0, banded_noise(x.value, strategy), source, step=3)  # a fresh state on resume
    with pytest.raises(ValueError, match=r"drawn with \(noise_multiplier, sensitivity\)=\(1.0, 2.0\)"):
        banded_gaussian(x, 1.1, state, source, step=3)
    with pytest.raises(ValueError, match=r"drawn with \(noise_multiplier, sensitivity\)=\(1.0, 2.0\)"):
        banded_gaussian(bounded(torch.zeros(4), clip=2.0), 1.0, state, source, step=3)
    with pytest.raises(ValueError, match=r"shape \(4,\), the value has shape \(5,\)"):
        banded_gaussian(bounded(torch.zeros(5)), 1.0, state, source, step=3)


def test_checkpointed_state_resumes_bit_for_bit(tmp_path):
    """The state (strategy, past noise, count, committed scale) and the generator saved at step 4
    of 8 continue exactly as the uninterrupted run."""
    x = bounded(torch.randn(50, generator=torch.Generator().manual_seed(3)))
    state, source = banded_noise(x.value, BandedToeplitz.optimal(4, 8)), mechanisms.SeededNoise(11)
    releases = []
    for t in range(8):
        if t == 4:
            checkpoint.save(tmp_path / "state", (state, source.generator.get_state()))
        value, state, _ = banded_gaussian(x, 0.9, state, source, step=t)
        releases.append(value)
    saved, generator_state = checkpoint.load(tmp_path / "state")
    resumed = mechanisms.SeededNoise(0)
    resumed.generator.set_state(generator_state)
    for t in range(4, 8):
        value, saved, _ = banded_gaussian(x, 0.9, saved, resumed, step=t)
        assert torch.equal(value, releases[t])


# ---------------------------------------------------------------------------------------- accounting

@functools.cache
def calibrated(bands: int) -> float:
    """The noise multiplier of ε = 2, δ = 1e-5 for n = 50,000, T = 2,000, B = 500 (to 1e-4 in ε,
    on the PLD grid 1e-4, which resolves it; the ledger's coarser grid is for training runs)."""
    return solve_noise(lambda s: banded_event(s, bands * 500 / 50_000, 2000, bands), epsilon=2.0, delta=1e-5,
                       relation=NeighboringRelation.ADD_OR_REMOVE_ONE, tolerance=1e-4, grid=1e-4)[0]


@pytest.mark.parametrize("bands,expected", [(1, 1.149), (4, 1.981), (16, 3.751)])
def test_calibrated_multipliers_match_the_amplified_banded_recipe(bands, expected):
    assert round(calibrated(bands), 3) == expected


def test_banded_event_of_one_band_is_dp_sgds():
    z, q, steps = 1.2, 0.01, 77
    assert banded_event(z, q, steps, 1) == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    assert banded_event(z, q, steps, 4).count == 20  # ⌈77/4⌉ rounds of the busiest group


def test_optimised_four_bands_at_its_calibrated_noise_beats_dp_sgd():
    """The comparison at equal privacy: error σ_b²·‖A C_b⁻¹‖_F² with σ_b calibrated per b (ε = 2,
    n = 50,000, T = 2,000, B = 500). Measured: b = 4 1.981²·514,080 ≈ 2.02e6 against DP-SGD's
    1.149²·2,001,000 ≈ 2.64e6 (about 24 % lower)."""
    steps = 2000
    dp_sgd = calibrated(1) ** 2 * BandedToeplitz.optimal(1, steps).squared_error(steps)
    banded = calibrated(4) ** 2 * BandedToeplitz.optimal(4, steps).squared_error(steps)
    assert banded < 0.8 * dp_sgd


# ----------------------------------------------------------------------------------------------- BLT

BLT = BufferedToeplitz((0.9, 0.4), (0.35, 0.3))


def test_blt_stream_is_the_inverse_of_c_applied_to_the_draws():
    steps, dim = 10, 2
    draws = torch.randn(steps, dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x = bounded(torch.zeros(dim, dtype=torch.float64), clip=0.5)
    state, source, got = buffered_noise(x.value, BLT, steps=steps, period=3), Scripted(draws), []
    for t in range(steps):
        value, state, _ = buffered_gaussian(x, 1.0, state, source, step=t)
        got.append(value)
    expected = np.linalg.solve(toeplitz(BLT.coefficients(steps), steps), draws.numpy())
    assert np.allclose(torch.stack(got).numpy(), expected, rtol=0, atol=1e-12)
    assert np.allclose(BLT.inverse_coefficients(steps), np.linalg.inv(toeplitz(BLT.coefficients(steps), steps))[:, 0],
                       rtol=0, atol=1e-12)
    assert len(state.buffers) == 2


def test_blt_sensitivity_is_the_worst_participation_pattern():
    """Brute force over every set of steps < T = 13 with pairwise gaps ≥ m = 3 (which contains the
    cyclic batches' patterns): max_π √(Σ_{s,t∈π} |(CᵀC)_st|), the bound for vectors of norm ≤ 1
    (attained for C ≥ 0), equals :meth:`sensitivity`. A mutant counting one participation
    (the column norm) is far below it."""
    steps, period = 13, 3
    c = toeplitz(BLT.coefficients(steps), steps)
    gram = np.abs(c.T @ c)
    best = 0.0
    for size in range(1, steps // period + 2):
        for pattern in itertools.combinations(range(steps), size):
            if all(b - a >= period for a, b in zip(pattern, pattern[1:])):
                best = max(best, float(gram[np.ix_(pattern, pattern)].sum()))
    assert BLT.sensitivity(steps, period) == pytest.approx(math.sqrt(best), rel=1e-12)
    assert np.linalg.norm(c[:, 0]) < 0.6 * math.sqrt(best)


def test_blt_event_is_the_whole_run_at_the_first_release_and_nothing_after():
    steps, period, z = 6, 2, 1.7
    x = bounded(torch.zeros(3))
    state, source, events = buffered_noise(x.value, BLT, steps=steps, period=period), mechanisms.SeededNoise(0), []
    for t in range(steps):
        _, state, event = buffered_gaussian(x, z, state, source, step=t)
        events.append(event)
    assert events[0] == buffered_event(z, BLT.sensitivity(steps, period)) == dpa.GaussianDpEvent(
        z / BLT.sensitivity(steps, period))
    assert all(isinstance(e, dpa.NoOpDpEvent) for e in events[1:])
    with pytest.raises(ValueError, match=r"step=6 is past the strategy's steps=6"):
        buffered_gaussian(x, z, state, source, step=6)


def test_optimal_blt_beats_independent_noise_at_equal_privacy():
    """Un-amplified, every record in k = T/m = 20 steps: independent noise (C = I) has sensitivity
    √k and error T(T + 1)/2; the optimised BLT's sensitivity² · error is far lower (measured 65,616
    against 402,000 for T = 200, m = 10), and two buffers do no worse than one."""
    steps, period = 200, 10
    one, two = BufferedToeplitz.optimal(1, steps, period), BufferedToeplitz.optimal(2, steps, period)
    cost = [s.sensitivity(steps, period) ** 2 * s.squared_error(steps) for s in (one, two)]
    assert cost[1] <= cost[0] * (1 + 1e-9)
    assert cost[0] < 0.2 * (steps // period) * steps * (steps + 1) / 2


def test_blt_input_is_validated():
    with pytest.raises(DpoptError, match=r"decays=\(1.0,\) must be floats in \[0, 1\)"):
        BufferedToeplitz((1.0,), (0.5,))
    with pytest.raises(DpoptError, match=r"weights=\(0.6, 0.6\) must be floats >= 0 with sum <= 1"):
        BufferedToeplitz((0.5, 0.5), (0.6, 0.6))
