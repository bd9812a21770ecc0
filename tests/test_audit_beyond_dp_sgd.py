"""The privacy audit of DP-SGD's three new options: banded correlated noise, adaptive clipping and
DP-AdamBC. Each deliberate privacy bug is flagged while its honest twin is not; DP-AdamBC
subtracting more than the noise variance is post-processing, not a bug, and is not flagged.

Each case runs the audit of ``tests/test_audit.py`` (claim ε = 2, the algorithm calibrated on its
claim, the canary world of its registry name or the one given) on a configuration where the bug
is large, and states the audit's power (``smallest_refutable_epsilon``) for the honest twin.

* Banded MF sampling every record at every step while accounting cyclic Poisson: T = b = 4 steps
  at group rate q = b·B/n = 1, so the claim is one Gaussian of multiplier z (each record in one
  step). The mutant's record is in all four: its final model moves by 4C against noise of std
  z·C·‖1ᵀC⁻¹‖ = 1.53·z·C, a Gaussian-DP μ of 2.6/z against the claimed 1/z.
* Correlated noise of the wrong strategy: C⁻¹ of the 64-banded (full) strategy over b = 2 groups
  (T = 64, q = 1): a record's 32 participations, 2 steps apart, share columns of C. The final
  model moves by 32C against noise z·C·2.47 (the claimed 32 Gaussians: μ = √32/z = 5.7/z; the
  mutant's 13.0/z). A strategy of fewer bands than groups, or optimised for another horizon,
  would not be a bug: it is still b-banded with unit column norm (:mod:`dpopt.algorithms.banded`).
* Adaptive clipping with the count un-noised (one canary slot, 6 steps at q = 0.99): the next clip
  follows the exact count, which the canary (never within the clip) lowers by ½, so with it log C_t
  drifts by η/(2B) more per step (η = 8), against the batch size's own randomness (about ½ a count)
  instead of the honest count noise σ_b = 5; 98 background records clipped to C_t in the canary's
  coordinate make θ show C_t to about z/98.
* DP-AdamBC subtracting 4Φ instead of Φ: post-processing of the releases (a worse optimiser).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dpopt import audit, clipping
from dpopt.algorithms import DPSGD, quantile
from dpopt.algorithms.adam import AdamBC, AdamBCState, bias_corrected_step
from dpopt.audit import worlds
from dpopt.correlation.noise import banded_noise
from dpopt.correlation.strategy import BandedToeplitz

from tests.test_audit import TARGET, Case, flagged_and_twin_not, run_audit, swapped_in
from tests.test_sampling import AllRecords


@dataclass(frozen=True)
class EveryRecordEveryStep(DPSGD):
    """BandMF's sampling bug: every record Poisson-sampled at the group rate at every step, while
    each step's event (and the plan) still counts the busiest group's ⌈T/b⌉ rounds."""

    def batch_sampler(self, state: Any, t: int, n: int) -> Any:
        return AllRecords(n, self.batch_size, self.bands, t, state.banded.key)


@dataclass(frozen=True)
class MoreBandsThanGroups(DPSGD):
    """Correlated noise from the wrong strategy: C⁻¹ of the T-banded strategy over cyclic Poisson
    batches of b < T groups."""

    def init(self, theta0: torch.Tensor, steps: int, gen: torch.Generator) -> Any:
        state = super().init(theta0, steps, gen)
        wrong = banded_noise(theta0, BandedToeplitz.optimal(steps, steps))
        return state._replace(banded=state.banded._replace(noise=wrong))


@dataclass(frozen=True)
class CountWithoutNoise(DPSGD):
    """Adaptive clipping whose next clip follows the exact count, while the step's event still
    claims the count noised."""

    def step(self, state: Any, batch: Any, oracle: Any, source: Any) -> Any:
        moved, event = super().step(state, batch, oracle, source)
        exact = clipping.count_within(oracle.per_record(state.theta, batch.indices), state.clip,
                                      batch.sampler.relation)
        clip = quantile.next_clip(state.clip, float(exact.value), batch.sampler.expected_size, self.clip_quantile,
                                  self.clip_lr)
        return moved._replace(clip=clip), event


@dataclass(frozen=True)
class SubtractsTooMuch(AdamBC):
    """DP-AdamBC subtracting 4Φ from the second moment instead of Φ."""

    def step(self, state: AdamBCState, batch: Any, oracle: Any, source: Any) -> Any:
        inner, event = self.inner.step(state.inner, batch, oracle, source)
        theta, m, v = state.theta.clone(), state.m.clone(), state.v.clone()
        noise = bias_corrected_step(theta, self.inner.direction(inner), m, v, step=state.count + 1, noise=state.noise,
                                    variance=4 * self.inner.release_variance(inner), lr=self.lr, betas=self.betas,
                                    eps=self.eps, gamma=self.gamma)
        return AdamBCState(self.inner.moved(inner, theta), m, v, noise, state.count + 1), event


def subtracting_too_much(algo: AdamBC) -> SubtractsTooMuch:
    return SubtractsTooMuch(algo.inner, lr=algo.lr, betas=algo.betas, eps=algo.eps, gamma=algo.gamma)


FINAL = dict(threat=audit.Final(), runs=4_000)
#: one canary slot; 98 background records whose gradients (−10⁶ in the canary's coordinate) are
#: always clipped: their clipped sum shows C_t
ADAPTIVE = dict(steps=6, n=99, batch=99, runs=1_000, canary=worlds.Canary(background=1e6),
                options={"clip_quantile": 0.05, "clip_lr": 8.0, "count_noise": 5.0})
MUTANTS: dict[str, Case] = {
    "bandmf sampling every record": Case("dp-bandmf", swapped_in(EveryRecordEveryStep), steps=4, n=99, batch=25,
                                         **FINAL),
    "bandmf noise of more bands than groups": Case("dp-bandmf", swapped_in(MoreBandsThanGroups), steps=64, n=99,
                                                   batch=50, options={"bands": 2}, **FINAL),
    "adaptive clipping count without noise": Case("dp-sgd", swapped_in(CountWithoutNoise), **ADAPTIVE),
}


@pytest.mark.parametrize("key", list(MUTANTS))
def test_every_mutant_is_flagged_and_its_honest_twin_is_not(key):
    fixed = flagged_and_twin_not(MUTANTS[key])
    # the power: a true ε 25 % (4,000 separable canaries) or 52 % (1,000 single-canary runs) above the claim
    assert fixed.smallest_refutable_epsilon < 1.6 * TARGET


def test_adambc_subtracting_more_than_the_noise_variance_is_not_a_privacy_bug():
    """Post-processing: neither DP-AdamBC nor the over-correcting variant is flagged, by an audit
    that refutes a true ε of about 1.2 × the claim (Gaussian-DP bound, 10,000 canaries a side)."""
    case = Case("dp-sgd", subtracting_too_much, steps=20, n=99, batch=50, options={"optimizer": "adambc"})
    for twin in (False, True):
        result = run_audit(case, twin=twin)
        assert result.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
        assert not result.flagged, result
        assert result.smallest_refutable_epsilon < 1.25 * TARGET
