"""The Gaussian mechanism: distribution of the noise, its event, and where randomness comes from."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation
from scipy import stats

from dpopt import clipping, mechanisms
from dpopt.mechanisms import SeededNoise

#: ≥ 20,000 samples, as in jax_privacy's noise_addition_test.
SAMPLES = 25_000


def zero_bounded(clip: float, relation: NeighboringRelation, dim: int = SAMPLES) -> mechanisms.Bounded:
    """A zero clipped sum of known sensitivity, made the only legal way: through clipping."""
    rows = clipping.Dense(torch.zeros(3, dim, dtype=torch.float64))
    bounded, dropped = clipping.clip_sum([clipping.Term(1.0, rows, clip)], relation)
    assert dropped == 0
    return bounded


@pytest.mark.parametrize(
    ("clip", "relation", "factor"),
    [(0.7, NeighboringRelation.ADD_OR_REMOVE_ONE, 1.0), (0.7, NeighboringRelation.REPLACE_ONE, 2.0)],
)
def test_noise_is_gaussian_with_std_z_times_sensitivity(clip, relation, factor):
    z = 1.3
    x = zero_bounded(clip, relation)
    assert x.sensitivity == pytest.approx(factor * clip, rel=1e-15)
    noised, event = mechanisms.gaussian(x, z, SeededNoise(11))
    sigma = z * factor * clip
    samples = noised.numpy()
    assert samples.shape == (SAMPLES,)
    # Under H0 (noise ~ N(0, σ²)) the KS p-value is Uniform(0,1): with this fixed seed the
    # chance a priori of p <= 0.01 is 1 %.
    assert stats.kstest(samples, "norm", args=(0.0, sigma)).pvalue > 0.01
    # Wrong scale s·σ, s ∈ {2/3, 3/2}: the true-vs-claimed CDF distance sup_x |Φ(x) − Φ(x/s)| is
    # 0.0968 for both s (computed numerically). The empirical KS statistic of n = 25,000 samples
    # is within ~1.95/√n ≈ 0.012 of that distance (99.9 % DKW band), so D ≥ 0.085 and
    # p ≈ 2·exp(−2·n·D²) ≈ 2·exp(−361) ≪ 1e-6.
    for wrong in (2 / 3, 3 / 2):
        assert stats.kstest(samples, "norm", args=(0.0, wrong * sigma)).pvalue < 1e-6
    assert event == dpa.GaussianDpEvent(z)


def test_sample_moments_match_sigma():
    """Mean within 5 standard errors (σ/√n), variance within 5 s.e. (σ²·√(2/n)) of the target."""
    z, clip = 0.8, 2.0
    noised, _ = mechanisms.gaussian(zero_bounded(clip, NeighboringRelation.ADD_OR_REMOVE_ONE), z, SeededNoise(3))
    sigma = z * clip
    assert abs(float(noised.mean())) < 5 * sigma / math.sqrt(SAMPLES)
    assert abs(float(noised.var()) - sigma**2) < 5 * sigma**2 * math.sqrt(2 / SAMPLES)


def test_event_is_gaussian_event_of_the_multiplier():
    for z in (0.0, 0.5, 4.0):
        _, event = mechanisms.gaussian(zero_bounded(1.0, NeighboringRelation.ADD_OR_REMOVE_ONE, dim=4), z,
                                       SeededNoise(0))
        assert event == dpa.GaussianDpEvent(z)
        assert event.noise_multiplier == z


def test_zero_noise_releases_value_exactly_even_with_infinite_clip():
    rows = clipping.Dense(torch.tensor([[3.0, 4.0], [1.0, -1.0]], dtype=torch.float64))
    x, _ = clipping.clip_sum([clipping.Term(1.0, rows, math.inf)], NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert math.isinf(x.sensitivity)
    noised, event = mechanisms.gaussian(x, 0.0, SeededNoise(0))
    assert torch.equal(noised, torch.tensor([4.0, 3.0], dtype=torch.float64))
    assert event == dpa.GaussianDpEvent(0.0)


def test_positive_noise_with_infinite_sensitivity_raises():
    rows = clipping.Dense(torch.ones(2, 3, dtype=torch.float64))
    x, _ = clipping.clip_sum([clipping.Term(1.0, rows, math.inf)], NeighboringRelation.ADD_OR_REMOVE_ONE)
    with pytest.raises(ValueError, match="noise_multiplier=0.5"):
        mechanisms.gaussian(x, 0.5, SeededNoise(0))


def test_bounded_cannot_be_constructed_outside_clipping():
    with pytest.raises(TypeError, match="only by dpopt.clipping"):
        mechanisms.Bounded(torch.zeros(3), 1.0)
    with pytest.raises(TypeError):  # a forged token (message depends on how the token is passed)
        mechanisms.Bounded(torch.zeros(3), 1.0, object())


def test_bounded_sensitivity_cannot_be_reasserted_by_dataclasses_replace():
    """``dataclasses.replace`` copies the private token, so it can shrink the sensitivity of a
    legitimately clipped value: a value whose sensitivity is merely asserted (docs/design.md, the four parts)."""
    x = zero_bounded(1.0, NeighboringRelation.ADD_OR_REMOVE_ONE, dim=3)
    with pytest.raises(TypeError, match="only by dpopt.clipping"):
        dataclasses.replace(x, sensitivity=1e-9)


def test_noise_comes_from_the_passed_source_only():
    x = zero_bounded(1.0, NeighboringRelation.ADD_OR_REMOVE_ONE, dim=50)
    torch.manual_seed(1)
    global_state = torch.get_rng_state()
    first, _ = mechanisms.gaussian(x, 2.0, SeededNoise(42))
    # The global RNG was neither read in a way that matters nor advanced.
    assert torch.equal(torch.get_rng_state(), global_state)
    torch.manual_seed(999)
    second, _ = mechanisms.gaussian(x, 2.0, SeededNoise(42))
    assert torch.equal(first, second)
    third, _ = mechanisms.gaussian(x, 2.0, SeededNoise(43))
    assert not torch.equal(first, third)
    # Exactly σ times the generator's standard normals: nothing else is mixed in.
    expected = 2.0 * 1.0 * torch.randn(50, generator=torch.Generator().manual_seed(42), dtype=torch.float64)
    assert torch.equal(first, expected)
    # A source advances: two draws from one source differ.
    source = SeededNoise(42)
    a, _ = mechanisms.gaussian(x, 2.0, source)
    b, _ = mechanisms.gaussian(x, 2.0, source)
    assert torch.equal(a, first) and not torch.equal(a, b)


def test_noise_keeps_dtype_and_shape():
    rows = clipping.Dense(torch.zeros(2, 7, dtype=torch.float32))
    x, _ = clipping.clip_sum([clipping.Term(1.0, rows, 1.0)], NeighboringRelation.ADD_OR_REMOVE_ONE)
    noised, _ = mechanisms.gaussian(x, 1.0, SeededNoise(0))
    assert noised.dtype == torch.float32 and noised.shape == (7,)
