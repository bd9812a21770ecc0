"""AClipped-dpSGD: the honest 2λ sensitivity of the clipped mean, restarts, and the paper's noise."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dpopt
from dpopt import accounting, cli, clipping, sampling
from dpopt._validate import DpoptError
from dpopt.base import Batch
from dpopt.algorithms.aclip import paper_noise
from dpopt.oracles import LeastSquares
from dpopt.mechanisms import SeededNoise

LAM, LR = 0.5, 0.1


def released_step(X: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """−(θ⁺ − θ)/γ for one noiseless AClip step on all records of (X, y): the released clip(mean)."""
    algo = dpopt.AClip(lr=LR, clip=LAM, noise_multiplier=0.0, batch_size=len(y))
    oracle = LeastSquares(X, y)
    sampler = sampling.Poisson(len(y), 1.0)  # the whole batch; the mean divides by n
    state = algo.init(theta, 1, torch.Generator())
    moved, _ = algo.step(state, Batch(0, torch.arange(len(y)), sampler), oracle, SeededNoise(0))
    return (theta - moved.theta) / LR


def test_one_changed_record_moves_the_release_by_two_lambda():
    """Three records pull the mean one way; replacing the fourth by an outlier flips it: the two
    released clipped means are opposite points of the λ-sphere, 2λ apart (λ would be wrong)."""
    theta = torch.zeros(2, dtype=torch.float64)
    X = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([-4.0, -4.0, -4.0, -4.0], dtype=torch.float64)  # gradient (θ·x − y)x = +4 e1 each
    neighbour_y = y.clone()
    neighbour_y[3] = 1e6  # one record's gradient: −1e6 e1
    here, there = released_step(X, y, theta), released_step(X, neighbour_y, theta)
    assert torch.allclose(here, torch.tensor([LAM, 0.0], dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(there, torch.tensor([-LAM, 0.0], dtype=torch.float64), rtol=1e-12)
    assert float((here - there).norm()) == pytest.approx(2 * LAM, rel=1e-12)
    assert clipping.clip_aggregate(here, LAM).sensitivity == 2 * LAM


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@given(rows=st.lists(st.tuples(finite, finite, finite), min_size=1, max_size=6),
       replacement=st.tuples(finite, finite, finite), which=st.integers(0, 5),
       theta=st.tuples(st.floats(-10, 10), st.floats(-10, 10)))
def test_the_release_never_moves_more_than_two_lambda(rows, replacement, which, theta):
    """Any data, any replaced record (adversarial magnitudes): ‖Δ release‖ ≤ 2λ, and each
    release lies in the λ-ball."""
    data = torch.tensor(rows, dtype=torch.float64)
    changed = data.clone()
    changed[which % len(rows)] = torch.tensor(replacement, dtype=torch.float64)
    point = torch.tensor(theta, dtype=torch.float64)
    here = released_step(data[:, :2], data[:, 2], point)
    there = released_step(changed[:, :2], changed[:, 2], point)
    assert float(here.norm()) <= LAM * (1 + 1e-12) and float(there.norm()) <= LAM * (1 + 1e-12)
    assert float((here - there).norm()) <= 2 * LAM * (1 + 1e-12)


def test_a_non_finite_mean_is_released_as_zero():
    bounded = clipping.clip_aggregate(torch.tensor([math.inf, 1.0], dtype=torch.float64), LAM)
    assert torch.equal(bounded.value, torch.zeros(2, dtype=torch.float64)) and bounded.sensitivity == 2 * LAM


def test_aclip_computes_no_per_record_gradients():
    """The step asks the oracle for one batch sum (gradient_sum) and never for per-record rows."""
    class SumOnly(LeastSquares):
        def per_record(self, theta, indices):  # pragma: no cover - must not be called
            raise AssertionError("AClip must not compute per-record gradients")

    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 3, generator=gen, dtype=torch.float64), torch.randn(50, generator=gen, dtype=torch.float64)
    history = dpopt.run(dpopt.AClip(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10), SumOnly(X, y), steps=20)
    assert history.steps_done == 20 and bool(history.theta.isfinite().all())


def test_restarted_variant_composes_stages_exactly():
    stages = (dpopt.Stage(30, 20, 1.0, 0.1), dpopt.Stage(50, 40, 0.5, 0.05))
    algo = dpopt.RestartedAClip(stages=stages, noise_multiplier=2.0)
    planned = algo.planned_event(1000, 80)
    want = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(2.0)), 30),
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.04, dpa.GaussianDpEvent(2.0)), 50)])
    assert planned == want
    relation = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    assert accounting.epsilon_of(planned, 1e-5, relation) > accounting.epsilon_of(want.events[1], 1e-5, relation)
    with pytest.raises(DpoptError, match="steps=79 must equal the stages' total, 80"):
        algo.init(torch.zeros(2, dtype=torch.float64), 79, torch.Generator())
    assert algo.sampler(29, 1000).rate == 0.02 and algo.sampler(30, 1000).rate == 0.04


def test_paper_noise_is_half_the_multiplier_the_paper_assumes():
    """σ̂/λ = m√(N ln(1/δ))/(nε); the honest multiplier is half of it and spends more ε, both
    accounted exactly (the same PLD as accounting.epsilon_of on the composed event)."""
    result = paper_noise(epsilon=1.0, delta=1e-5, n=10_000, batch_size=100, steps=2_000)
    want = 100 * math.sqrt(2_000 * math.log(1e5)) / 10_000
    paper, honest = result["rows"]
    assert paper["noise_multiplier"] == pytest.approx(want, rel=1e-12)
    assert honest["noise_multiplier"] == pytest.approx(want / 2, rel=1e-12)
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(want / 2)), 2_000)
    assert honest["epsilon"] == pytest.approx(
        accounting.epsilon_of(event, 1e-5, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE), rel=1e-12)
    assert honest["epsilon"] > paper["epsilon"]


def test_paper_noise_with_restarts_uses_the_advanced_composition_split():
    result = paper_noise(epsilon=2.0, delta=1e-5, n=10_000, batch_size=100, steps=500, restarts=4)
    assert result["stage_epsilon"] == pytest.approx(2.0 / (2 * math.sqrt(8 * math.log(2e5))), rel=1e-12)
    assert result["stage_delta"] == pytest.approx(1e-5 / 8, rel=1e-12)
    # advanced composition is loose: the exact ε of all 4·500 steps is far below the claimed 2
    assert result["rows"][1]["epsilon"] < 1.0


def test_cli_explains_the_paper_noise(capsys):
    argv = ["account", "--explain", "aclip", "--epsilon", "1", "--delta", "1e-5", "--dataset-size", "10000",
            "--batch-size", "100", "--steps", "2000", "--json"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(paper_noise(epsilon=1.0, delta=1e-5, n=10_000, batch_size=100,
                                                        steps=2_000)))
    assert cli.main(argv[:-1]) == 0
    human = capsys.readouterr().out.splitlines()  # a table: one row per sensitivity (the CLI's human convention)
    assert human[0].split()[:3] == ["sensitivity", "noise", "multiplier"]
    assert any(row.startswith("2λ (honest)") for row in human)
    assert any(row.startswith("λ (the paper's") for row in human)
    assert cli.main(["account", "--explain", "aclip", "--delta", "1e-5", "--steps", "10"]) == 2
    assert "--explain aclip needs --epsilon" in capsys.readouterr().err


@given(st.integers(min_value=0, max_value=2**31 - 1), st.floats(min_value=1e-3, max_value=1e3))
@settings(max_examples=200, deadline=None)
def test_a_float32_aggregate_is_clipped_to_at_most_lambda(seed: int, lam: float) -> None:
    """In float32 the product v · (λ/‖v‖) can round above λ; the clipped aggregate never does."""
    value = torch.randn(257, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 100
    clipped = clipping.clip_aggregate(value, lam).value
    assert clipped.dtype == torch.float32
    assert float(clipped.double().norm()) <= lam
