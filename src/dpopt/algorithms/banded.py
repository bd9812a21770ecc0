"""Banded matrix factorisation for an algorithm that releases one noised sum per step (DP-SGD, AClip): the
pieces it keeps and calls, so that its step stays its own.

A run with b > 1 bands (Choquette-Choo et al., NeurIPS 2023, arXiv 2306.08153):

* **strategy**: C = :meth:`BandedToeplitz.optimal(b, T) <dpopt.correlation.strategy.BandedToeplitz.optimal>`
  for the run's T (prefix-sum workload, computed once at ``init`` and cached; min(b, T) bands for
  a run shorter than b steps: a strategy of fewer bands than groups keeps the argument below);
* **sampling**: cyclic Poisson (:class:`~dpopt.sampling.CyclicPoisson`): the records in b groups
  drawn from a secret key, group t mod b Poisson-sampled at step t at rate q = b·B/n;
* **noise**: x_t = (C⁻¹z)_t streamed from a ring of the last b − 1 noise vectors
  (:func:`~dpopt.correlation.noise.banded_gaussian`), released as sum_t + z·Δ·x_t;
* **event**: ``banded_event(z, q, T, b)`` = SelfComposed(PoissonSampled(q, Gaussian(z)), ⌈T/b⌉):
  a record takes part only in its group's steps, b apart, whose columns of C have disjoint
  supports, so the run is dominated by the busiest group's ⌈T/b⌉ Poisson-sampled Gaussian rounds
  (:func:`dpopt.correlation.events.banded_event` gives the argument).

The argument needs the same z and sensitivity Δ at every step (one strategy correlates noise of
one scale: :func:`~dpopt.correlation.noise.banded_gaussian` commits them at the first release),
which is why adaptive clipping and DP-SRM's two-stage release are refused with it.

The key and the ring live in the algorithm's state (:class:`Banded`), so every checkpoint holds
them: the groups of a resumed run are the run's, and its noise continues C⁻¹z (the ring's past
noise exists nowhere else, and a release at another step than the ring's is refused).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import dp_accounting as dpa
import numpy as np
import torch
from torch import Tensor

from ..correlation.events import banded_event
from ..correlation import noise as correlated
from ..correlation.noise import BandedNoise, banded_noise
from ..correlation.strategy import BandedToeplitz, inverse_series
from ..mechanisms import Bounded
from ..base import NoiseSource, Sampler
from ..sampling import BatchSampling, CyclicPoisson


class Banded(NamedTuple):
    """What a banded run keeps: the secret group ``key`` and the noise ring."""

    key: int
    noise: BandedNoise


def start(like: Tensor, bands: int, steps: int, gen: torch.Generator) -> Banded:
    """The state before step 0 of a ``steps``-step run: the key drawn from ``gen`` (the run's secret
    sampling generator) and an empty ring of values shaped like ``like`` (its dtype and device)."""
    return Banded(CyclicPoisson.secret_key(gen), ring(like, bands, steps))


def ring(like: Tensor, bands: int, steps: int) -> BandedNoise:
    """An empty noise ring of the strategy for a ``steps``-step run (min(b, T) bands), of values shaped
    like ``like``."""
    return banded_noise(like, BandedToeplitz.optimal(min(bands, steps), steps))


def sampler(plain: BatchSampling, n: int, batch_size: int, bands: int, t: int, state: Banded | None = None) -> Sampler:
    """Step t's sampler: ``plain.of(n, batch_size)`` for one band, else cyclic Poisson over the groups
    of the ``state``'s key (without a state, for planning: it refuses to draw)."""
    if bands == 1:
        return plain.of(n, batch_size)
    return CyclicPoisson(n, batch_size, bands, t, None if state is None else state.key)


def release(x: Bounded, noise_multiplier: float, state: Banded, source: NoiseSource,
            t: int) -> tuple[Tensor, Banded, dpa.DpEvent]:
    """Step t's release ``x.value + z·Δ·x_t``, the next state and ``Gaussian(z)`` (the step's
    sampler wraps it into its group's round)."""
    noised, noise, event = correlated.banded_gaussian(x, noise_multiplier, state.noise, source, step=t)
    return noised, state._replace(noise=noise), event


def planned_event(noise_multiplier: float, n: int, batch_size: int, bands: int, steps: int) -> dpa.DpEvent:
    """The run's event, written from the hyper-parameters alone: ``banded_event(z, b·B/n, T, b)``."""
    return banded_event(noise_multiplier, CyclicPoisson(n, batch_size, bands).rate, steps, bands)


def noise_scale(state: Banded, t: int) -> float:
    """The standard deviation of x_t = (C⁻¹z)_t per coordinate, z ~ N(0, I): √(Σ_{m≤t} d_m²), d the
    first column of C⁻¹ (row t of C⁻¹ holds d_t, …, d_0)."""
    return math.sqrt(_cumulative_squares(state.noise.strategy.coefficients, _length(t))[t])


def _length(t: int) -> int:
    """A power of two above t: the series is computed for a few lengths per run, not every step."""
    return 1 << max(6, (t + 1).bit_length())


@functools.lru_cache(maxsize=16)
def _cumulative_squares(coefficients: tuple[float, ...], length: int) -> np.ndarray:
    """Σ_{m≤t} d_m² for t < ``length``."""
    return np.cumsum(inverse_series(np.array(coefficients), length) ** 2)
