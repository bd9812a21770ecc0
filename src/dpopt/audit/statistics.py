"""What the adversary sees of a run (the threat model), and the score it computes from that.

Scores are oriented so that the canary raises them: the canary pulls its coordinate θ_r down.

* :class:`Final`: the adversary sees the output only; the score is −output_r.
* :class:`Releases`: the adversary sees every noised release. It observes the iterates θ_0, …,
  θ_T, a post-processing of the releases (for DP-SGD and DP-GD equivalent to them: each step
  moves θ by −η/b times the release), and scores the per-step movements x_t = θ_{t,r} − θ_{t+1,r}
  with a statistic fitted on the selection half of the runs (so fitting costs no confidence):

  - the matched filter Σ_t w_t (x_t − m⁰_t), w_t = (m¹_t − m⁰_t)/v⁰_t, from the per-step means
    m⁰, m¹ on D and D′ and the variance v⁰ on D: the likelihood ratio when the canary shifts
    Gaussian releases (DP-GD, every step; O2NC's single pass, the steps that use the canary);
  - for a sampler that includes the canary with probability q < 1 (Poisson), the likelihood
    ratio of the mixture Σ_t log(1 − q + q·exp((s_t (x_t − m⁰_t) − s_t²/2)/v⁰_t)), with the
    shift when sampled s_t = (m¹_t − m⁰_t)/q.

  Whichever gives the larger bound on the selection half is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import Tensor

#: A score: observations [runs, …] → scores [runs].
Score = Callable[[np.ndarray], np.ndarray]


class ThreatModel(Protocol):
    """What an adversary sees of a run and how it turns that into scores."""

    name: str

    def observes_steps(self) -> bool:
        """Whether the adversary sees every iterate (else only the output)."""
        ...

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        """Candidate scores, fitted on the selection halves ``out`` (D) and ``inside`` (D′)."""
        ...


@dataclass(frozen=True)
class Final:
    """The final-model adversary: observations are the outputs' canary coordinates."""

    name: str = "final"

    def observes_steps(self) -> bool:
        return False

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        return [lambda outputs: -outputs]


@dataclass(frozen=True)
class Releases:
    """The adversary of every release: observations are trajectories [runs, T + 1]."""

    name: str = "releases"

    def observes_steps(self) -> bool:
        return True

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        steps_out, steps_in = _moves(out), _moves(inside)
        base, shift = steps_out.mean(0), steps_in.mean(0) - steps_out.mean(0)
        # a floor for steps without noise (a non-private method), so that the weights stay finite
        var = np.maximum(steps_out.var(0), 1e-12 * np.max(shift ** 2, initial=0.0) + 1e-300)
        candidates: list[Score] = [lambda paths: (_moves(paths) - base) @ (shift / var)]
        if q < 1:
            sampled = shift / q

            def mixture(paths: np.ndarray) -> np.ndarray:
                exponent = (sampled * (_moves(paths) - base) - sampled ** 2 / 2) / var
                return np.logaddexp(np.log1p(-q), np.log(q) + exponent).sum(1)

            candidates.append(mixture)
        return candidates


def _moves(paths: np.ndarray) -> np.ndarray:
    """x_t = θ_t − θ_{t+1}: the per-step movement toward the canary's pull."""
    return paths[:, :-1] - paths[:, 1:]


THREAT_MODELS: dict[str, ThreatModel] = {model.name: model for model in (Final(), Releases())}


def observe(threat: ThreatModel, algorithm: Any, state: Any, slots: int) -> Tensor:
    """The canary coordinates the adversary sees now: the iterate (releases) or the output."""
    value = state.theta if threat.observes_steps() else algorithm.output(state)
    return value[:slots].detach()
