"""What the adversary sees of a run (the threat model), and the score it computes from that.

Scores are oriented so that the canary raises them: the canary pulls its coordinate θ_r down.

An observation has k coordinates (``[runs, k]`` outputs, ``[runs, T + 1, k]`` trajectories): the
canary's own coordinate θ_r in the audit's linear world (k = 1), every coordinate of θ on a
user's module (where the canary moves the release in directions the audit does not choose).

* :class:`Final`: the adversary sees the output only; the score is −output_r (k = 1), else the
  matched filter below on the output's coordinates.
* :class:`Releases`: the adversary sees every noised release. It observes the iterates θ_0, …,
  θ_T, a post-processing of the releases (for DP-SGD and DP-GD equivalent to them: each step
  moves θ by −η/b times the release), and scores the per-step movements x_t = θ_t − θ_{t+1}
  with a statistic fitted on the selection half of the runs (so fitting costs no confidence):

  - the matched filter Σ_{t,j} w_tj (x_tj − m⁰_tj), w = (m¹ − m⁰)/v⁰, from the means m⁰, m¹ of
    each step's movement in each coordinate on D and D′ and the variance v⁰ on D: the likelihood
    ratio when the canary shifts Gaussian releases with independent coordinates (DP-GD, every
    step; O2NC's single pass, the steps that use the canary);
  - for a sampler that includes the canary with probability q < 1 (Poisson), the likelihood
    ratio of the mixture Σ_t log(1 − q + q·exp((s_t (x_t − m⁰_t) − s_t²/2)/v⁰_t)), with the
    shift when sampled s_t = (m¹_t − m⁰_t)/q.

  Whichever gives the larger bound on the selection half is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    from ..base import S, Algorithm

#: A score: observations [runs, …] → scores [runs].
Score = Callable[[np.ndarray], np.ndarray]


class ThreatModel(Protocol):
    """What an adversary sees of a run and how it turns that into scores."""

    @property
    def name(self) -> str: ...

    def observes_steps(self) -> bool:
        """Whether the adversary sees every iterate (else only the output)."""
        ...

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        """Candidate scores, fitted on the selection halves ``out`` (D) and ``inside`` (D′)."""
        ...


@dataclass(frozen=True)
class Final:
    """The final-model adversary: observations are the outputs' watched coordinates [runs, k]."""

    name: str = "final"

    def observes_steps(self) -> bool:
        return False

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        if out.shape[1] == 1:
            return [lambda outputs: -outputs[:, 0]]
        return [_matched_filter(out, inside, lambda outputs: outputs)]


@dataclass(frozen=True)
class Releases:
    """The adversary of every release: observations are trajectories [runs, T + 1, k]."""

    name: str = "releases"

    def observes_steps(self) -> bool:
        return True

    def scores(self, out: np.ndarray, inside: np.ndarray, q: float) -> list[Score]:
        candidates: list[Score] = [_matched_filter(out, inside, _moves)]
        if q < 1:
            base, shift, var = _moments(_moves(out), _moves(inside))
            sampled = shift / q

            def mixture(paths: np.ndarray) -> np.ndarray:
                exponent = (sampled * (_moves(paths) - base) - sampled ** 2 / 2) / var
                return np.logaddexp(np.log1p(-q), np.log(q) + exponent).sum(1)

            candidates.append(mixture)
        return candidates


def _moves(paths: np.ndarray) -> np.ndarray:
    """x_t = θ_t − θ_{t+1}: the per-step movement (toward the canary's pull), ``[runs, T·k]``."""
    return (paths[:, :-1] - paths[:, 1:]).reshape(len(paths), -1)


def _moments(out: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """m⁰, m¹ − m⁰ and v⁰ per column, v⁰ with a floor for columns without noise (a non-private
    method, or a release that repeats its noise), so that the weights stay finite."""
    base, shift = out.mean(0), inside.mean(0) - out.mean(0)
    var = np.maximum(out.var(0), 1e-12 * np.max(shift ** 2, initial=0.0) + 1e-300)
    return base, shift, var


def _matched_filter(out: np.ndarray, inside: np.ndarray, features: Callable[[np.ndarray], np.ndarray]) -> Score:
    """Σ_j w_j (f_j − m⁰_j), w = (m¹ − m⁰)/v⁰, on the columns f of ``features(observations)``."""
    base, shift, var = _moments(features(out), features(inside))
    return lambda observed: (features(observed) - base) @ (shift / var)


THREAT_MODELS: dict[str, ThreatModel] = {model.name: model for model in (Final(), Releases())}


class Iterate(Protocol):
    """An algorithm's state: every one holds the current iterate θ_t as ``theta``."""

    @property
    def theta(self) -> Tensor: ...


def observe(threat: ThreatModel, algorithm: Algorithm[S], state: S) -> Tensor:
    """What the adversary sees now: the iterate (releases) or the output."""
    return (cast(Iterate, state).theta if threat.observes_steps() else algorithm.output(state)).detach()
