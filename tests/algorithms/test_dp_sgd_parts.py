"""DP-SGD as parts (:mod:`dpopt.algorithms.parts`): a new variant is one new part. A toy clipping rule
defined here (a clip decaying on a public schedule) runs through ``ComposedSGD`` and the contract
checks that apply to it: the ledger equals the plan, and each release's clipped sum claims the
sensitivity of the step's clip. Each check is paired with a mutant rule it catches. ``DPSGD``'s own
choice of parts, composed by hand, is DPSGD bit for bit."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import NeighboringRelation

from dpopt import clipping, mechanisms
from dpopt._validate import DpoptError
from dpopt.accounting import PlanMismatch, canonical
from dpopt.algorithms import DPSGD
from dpopt.algorithms.dp_sgd import ComposedSGD
from dpopt.algorithms.parts import CyclicGroups, Correlated, FixedClip, Independent, NoisePart, Parts, Sampled
from dpopt.base import NoiseSource, PerRecord
from dpopt.sampling import FixedSize, Poisson

from tests.contracts.test_algorithms import DELTA, N, replay, run

STEPS = 20


@dataclass(frozen=True)
class DecayingClip:
    """C_t = ``clip``·``decay``^t: a public schedule, so the clip is post-processing of nothing; the
    sum is the only release, noised at the step's z; its sensitivity changes from step to step."""

    clip: float
    decay: float

    changes = "a decaying clip"

    @property
    def setting(self) -> str:
        return f"decay={self.decay!r}"

    def check(self, parts: Parts, noise_multiplier: float) -> None:
        if not 0 < self.decay <= 1:
            raise DpoptError(f"decay={self.decay!r} must be in (0, 1]")

    def start(self) -> float | None:
        return self.clip

    def current(self, clip: float | None) -> float:
        assert clip is not None
        return clip

    def multiplier(self, noise_multiplier: float, relation: NeighboringRelation) -> float:
        return noise_multiplier

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]:
        return clip * self.decay, gradient_event

    def release_event(self, gradient_event: dpa.DpEvent, noise: NoisePart, noise_multiplier: float,
                      relation: NeighboringRelation) -> dpa.DpEvent:
        return gradient_event


@dataclass(frozen=True)
class UnplannedCount(DecayingClip):
    """Mutant: also releases a noised count (like adaptive clipping) whose event the step records
    but the plan leaves out."""

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]:
        _, count_event = mechanisms.gaussian(clipping.count_within(rows, clip, relation), 2.0, source, noise.kind)
        return clip * self.decay, dpa.ComposedDpEvent([gradient_event, count_event])


@dataclass(frozen=True)
class GrowingClip(DecayingClip):
    """Mutant: moves the clip the wrong way (C_t = clip / decay^t), unlike the schedule it states."""

    def after(self, rows: PerRecord, clip: float, expected_size: float, gradient_event: dpa.DpEvent,
              noise: NoisePart, relation: NeighboringRelation,
              source: NoiseSource) -> tuple[float | None, dpa.DpEvent]:
        return clip / self.decay, gradient_event


def decaying(rule: Any = DecayingClip, sampling: Any = Poisson) -> ComposedSGD:
    return ComposedSGD(lr=0.5, noise_multiplier=1.3,
                       parts=Parts(Sampled(sampling, 40), rule(1.0, 0.9), Independent()))


@pytest.mark.parametrize("sampling", [Poisson, FixedSize])
def test_a_toy_clipping_rule_is_planned_as_it_is_recorded_and_the_check_catches_an_unplanned_release(sampling):
    """The contract table's double entry over 20 steps: the replayed ledger is the plan, T times
    ``wrap(Gaussian(1.3))``, and ``dpopt.run`` gives the replay's θ and ε. The mutant's ledger holds a
    second Gaussian per step that its plan lacks, and ``dpopt.run`` refuses it."""
    honest = decaying(sampling=sampling)
    planned = honest.planned_event(N, STEPS)
    assert planned == dpa.SelfComposedDpEvent(Sampled(sampling, 40).sampler(N, 0).wrap(dpa.GaussianDpEvent(1.3)), 20)
    manual, history = replay(honest, STEPS), run(honest, STEPS)
    assert manual.ledger.event() == canonical(planned)
    assert torch.equal(honest.output(manual.state), history.theta)
    assert history.final["epsilon"] == pytest.approx(manual.ledger.epsilon(DELTA), rel=1e-12)
    mutant = decaying(UnplannedCount, sampling)
    assert replay(mutant, STEPS).ledger.event() != canonical(mutant.planned_event(N, STEPS))
    with pytest.raises(PlanMismatch, match="the ledger is not a prefix of the planned event"):
        run(mutant, STEPS)


def claimed_sensitivities(algorithm: ComposedSGD, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sensitivity each release's clipped sum hands the Gaussian mechanism, step by step."""
    seen: list[float] = []
    gaussian = mechanisms.gaussian

    def spied(x: mechanisms.Bounded, z: float, source: Any, noise: Any = mechanisms.CONTINUOUS) -> Any:
        seen.append(x.sensitivity)
        return gaussian(x, z, source, noise)

    monkeypatch.setattr(mechanisms, "gaussian", spied)
    replay(algorithm, STEPS)
    return seen


@pytest.mark.parametrize(("sampling", "factor"), [(Poisson, 1.0), (FixedSize, 2.0)])
def test_each_release_claims_f_times_the_steps_clip_and_the_check_catches_a_clip_off_its_schedule(
        sampling, factor, monkeypatch):
    """Sensitivity of step t's clipped sum: f·0.9^t (f = 1 add/remove-one, 2 replace-one), as the
    contract table's formula; the mutant's claims f/0.9^t, off from step 1 on."""
    want = [factor * 0.9**t for t in range(STEPS)]
    assert claimed_sensitivities(decaying(sampling=sampling), monkeypatch) == pytest.approx(want, rel=1e-12)
    wrong = claimed_sensitivities(decaying(GrowingClip, sampling), monkeypatch)
    assert wrong[0] == factor and wrong[1] == pytest.approx(factor / 0.9, rel=1e-12)


def test_banded_noise_refuses_a_rule_that_changes_the_sensitivity():
    parts = Parts(CyclicGroups(4, 40), DecayingClip(1.0, 0.9), Correlated(4))
    with pytest.raises(DpoptError, match=re.escape("bands=4 (banded matrix factorisation) is refused with "
                                                   "decay=0.9: correlated noise needs the same sensitivity at every "
                                                   "step, and a decaying clip changes it")):
        ComposedSGD(lr=0.5, noise_multiplier=1.0, parts=parts)
    with pytest.raises(DpoptError, match=re.escape("bands=4 (cyclic Poisson groups) is refused with noise=")):
        ComposedSGD(lr=0.5, noise_multiplier=1.0, parts=Parts(CyclicGroups(4, 40), FixedClip(1.0), Independent()))
    with pytest.raises(DpoptError, match=re.escape("decay=1.5 must be in (0, 1]")):
        ComposedSGD(lr=0.5, noise_multiplier=1.0, parts=Parts(Sampled(Poisson, 40), DecayingClip(1.0, 1.5),
                                                              Independent()))


@pytest.mark.parametrize("options", [{}, {"bands": 4}, {"clip_quantile": 0.5, "count_noise": 10.0},
                                     {"sampling": FixedSize, "output_rule": "uniform"}])
def test_dpsgds_parts_composed_by_hand_are_dpsgd_bit_for_bit(options):
    """``ComposedSGD`` of the parts ``DPSGD`` picks: the same θ (torch.equal), the same ledger and the
    same planned event, over 20 steps."""
    algorithm = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.3, batch_size=40, **options)
    composed = ComposedSGD(lr=0.5, noise_multiplier=1.3, parts=algorithm.composition(),
                           output_rule=algorithm.output_rule)
    want, got = replay(algorithm, STEPS), replay(composed, STEPS)
    assert torch.equal(algorithm.output(want.state), composed.output(got.state))
    assert got.ledger.event() == want.ledger.event()
    assert composed.planned_event(N, STEPS) == algorithm.planned_event(N, STEPS)
