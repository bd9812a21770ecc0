"""Every draw and every tensor of a step on the parameters' device, for each device present
(the CPU always; CUDA and MPS where available)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpopt import train
from dpopt.accounting import Ledger
from dpopt.algorithms import DPSGD
from dpopt.mechanisms import SeededNoise
from dpopt.oracles import TorchModel



def test_seeded_noise_is_drawn_on_the_device_of_its_tensor_and_reproducible(device):
    like = torch.zeros(4000, device=device)
    first, second = SeededNoise(7), SeededNoise(7)
    draws = first.gaussian(like, 2.0)
    assert draws.device == like.device and draws.dtype == like.dtype
    assert torch.equal(draws, second.gaussian(like, 2.0))  # the seed determines every draw
    assert not torch.equal(draws, first.gaussian(like, 2.0))  # the next draw is new
    assert abs(float(draws.std()) - 2.0) < 0.1
    gumbel = first.gumbel(like, 1.0)
    assert gumbel.device == like.device and abs(float(gumbel.mean()) - 0.5772) < 0.1


def test_on_the_cpu_the_draws_are_the_generator_s():
    """The CPU path draws from the run's generator itself: runs and checkpoints are unchanged."""
    assert torch.equal(SeededNoise(3).gaussian(torch.zeros(5, dtype=torch.float64), 1.5),
                       torch.randn(5, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 1.5)


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_a_dp_sgd_step_runs_on_the_device(device, engine):
    torch.manual_seed(0)
    dtype = torch.float32 if device == "mps" else torch.float64
    module = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(device, dtype)
    X, y = torch.randn(50, 3), torch.randint(0, 2, (50,))
    oracle = TorchModel(module, lambda out, t: F.cross_entropy(out, t, reduction="none"), X, y, engine=engine)
    algorithm = DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=10)
    gen = torch.Generator().manual_seed(0)
    theta = oracle.flat_params()
    state = algorithm.init(theta, 5, gen)
    ledger = Ledger(algorithm.relation())
    state, _ = train.step(algorithm, oracle, state, 0, ledger, gen, SeededNoise(1))
    assert state.theta.device == theta.device and state.theta.dtype == dtype
    assert not torch.equal(state.theta, theta)
