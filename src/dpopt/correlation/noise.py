"""Correlated Gaussian releases, the noise x = C⁻¹z generated online one step at a time.

Each mechanism follows :mod:`dpopt.mechanisms`: a :class:`~dpopt.mechanisms.Bounded` clipped sum
in (sensitivity Δ), the noised sum and the event of that release out, every draw from the run's
:class:`~dpopt.mechanisms.NoiseSource`. Step t draws z_t = ``source.gaussian(x.value, 1.0)``, turns
it into x_t (unit scale, in the value's dtype and on its device) and releases
``x.value.add(x_t, alpha=z·Δ)``: the noise of the whole run is (zΔ)·C⁻¹Z, Z i.i.d. N(0, I).

The past noise lives in a state (a NamedTuple: the strategy, the past vectors, the count of
releases, the committed (z, Δ)) that the algorithm keeps in its own state, so every checkpoint
holds it. A resume without it is impossible by construction: x_t depends on noise that exists
nowhere else (it is secret and never re-drawn), and a release is refused unless its step t
equals the state's count of releases, so a fresh state cannot stand in for a run's saved one.
The (z, Δ) of the first release is committed: C⁻¹ correlates noise of one scale, and the event
of the run (per group round, or the whole run for BLT) is that of this one multiplier.

* :func:`banded_gaussian`: a b-banded strategy (:class:`~dpopt.correlation.strategy.BandedToeplitz`),
  x_t = (z_t − Σ_{j=1}^{b−1} c_j x_{t−j}) / c_0 from the last b − 1 noise vectors: (b − 1)·d
  numbers of extra memory. b = 1 is :func:`dpopt.mechanisms.gaussian` with continuous noise,
  bit for bit (the same draw, the same fused add).
* :func:`buffered_gaussian`: a BLT strategy (:class:`~dpopt.correlation.blt.BufferedToeplitz`)
  from its buffers: buffers·d numbers of extra memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate
from ..base import NoiseSource
from ..mechanisms import Bounded, check_finite
from .blt import BufferedToeplitz
from .events import buffered_event
from .strategy import BandedToeplitz


class BandedNoise(NamedTuple):
    """The streaming state of C⁻¹z for a banded strategy."""

    strategy: BandedToeplitz
    past: tuple[Tensor, ...]  # x_{t−b+1}, …, x_{t−1}, oldest first, unit scale (zeros before the first step)
    step: int = 0  # releases made: the t of the next one
    committed: tuple[float, float] | None = None  # (z, Δ) of the releases, fixed by the first one


class BufferedNoise(NamedTuple):
    """The streaming state of C⁻¹z for a BLT strategy over ``steps`` steps whose records take
    part every ``period`` steps (fixed cyclic batches)."""

    strategy: BufferedToeplitz
    steps: int
    period: int
    buffers: tuple[Tensor, ...]  # s_i(t) = Σ_{j≥1} θ_i^{j−1} x_{t−j}, unit scale
    step: int = 0
    committed: tuple[float, float] | None = None


def _subtract(noise: Tensor, vectors: Sequence[Tensor], weights: Sequence[float]) -> None:
    """``noise −= Σ_k w_k·v_k`` in place, in that order (memory-bound: each vector is read once;
    cutting ``noise`` into cache-sized chunks measured no faster)."""
    for vector, weight in zip(vectors, weights):
        noise.sub_(vector, alpha=weight)


def banded_noise(like: Tensor, strategy: BandedToeplitz) -> BandedNoise:
    """The state before the first release of values shaped like ``like`` (dtype, device)."""
    zero = torch.zeros_like(like)  # one tensor until the ring fills: the first b − 1 steps add no memory
    return BandedNoise(strategy, (zero,) * (strategy.bands - 1))


def buffered_noise(like: Tensor, strategy: BufferedToeplitz, *, steps: int, period: int) -> BufferedNoise:
    """The state before the first release; ``steps`` is the run's length T and ``period`` m the
    number of cyclic batches (each record takes part at steps j, j + m, … < T)."""
    _validate.positive_int("steps", steps)
    _validate.positive_int("period", period)
    zero = torch.zeros_like(like)
    return BufferedNoise(strategy, steps, period, (zero,) * strategy.buffers)


def _checked(state: BandedNoise | BufferedNoise, vectors: tuple[Tensor, ...], step: int, x: Bounded,
             noise_multiplier: float) -> tuple[float, float]:
    """The (z, Δ) to commit: ``step`` must be the state's next, the state's ``vectors`` shaped like
    the value, and (z, Δ) the committed ones."""
    if step != state.step:
        raise ValueError(f"step={step} but the correlated-noise state has made {state.step} releases: a run "
                         "continues only from the state saved with it (its past noise exists nowhere else)")
    if vectors and vectors[0].shape != x.value.shape:
        raise ValueError(f"the noise state holds vectors of shape {tuple(vectors[0].shape)}, the value has "
                         f"shape {tuple(x.value.shape)}")
    settings = (float(noise_multiplier), float(x.sensitivity))
    if state.committed is not None and state.committed != settings:
        raise ValueError(f"correlated noise was drawn with (noise_multiplier, sensitivity)={state.committed}; "
                         f"a release with {settings} would not match the strategy's event")
    if noise_multiplier > 0:
        check_finite(x, noise_multiplier)
    return settings


def banded_gaussian(x: Bounded, noise_multiplier: float, state: BandedNoise, source: NoiseSource, *,
                    step: int) -> tuple[Tensor, BandedNoise, dpa.DpEvent]:
    """Release step t = ``step`` of a banded strategy: ``x.value + z·Δ·x_t``, the next state, and
    ``GaussianDpEvent(z)``, the event of one column of C·G + Z. The amplification that column
    earns (a Poisson round of the record's group every b steps) is the sampler's to add:
    :class:`dpopt.sampling.CyclicPoisson` wraps it. With z = 0 the value is released exactly and the
    event is non-private. b = 1 commits nothing (no noise is correlated) and draws and adds
    exactly as :func:`dpopt.mechanisms.gaussian`."""
    bands = state.strategy.bands
    settings = _checked(state, state.past, step, x, noise_multiplier)
    committed = settings if bands > 1 else None
    event = dpa.GaussianDpEvent(noise_multiplier)
    if noise_multiplier == 0:
        return x.value, state._replace(step=step + 1, committed=committed), event
    noise = source.gaussian(x.value, 1.0)
    past = state.past
    if bands > 1:
        c = state.strategy.coefficients
        _subtract(noise, past[::-1], c[1:])  # x_{t−1}, …, x_{t−b+1} against c_1, …, c_{b−1}
        noise.div_(c[0])
        past = past[1:] + (noise,)
    released = x.value.add(noise, alpha=noise_multiplier * x.sensitivity)
    return released, BandedNoise(state.strategy, past, step + 1, committed), event


def buffered_gaussian(x: Bounded, noise_multiplier: float, state: BufferedNoise, source: NoiseSource, *,
                      step: int) -> tuple[Tensor, BufferedNoise, dpa.DpEvent]:
    """Release step t = ``step`` of a BLT strategy: ``x.value + z·Δ·x_t``, the next state, and the
    event: at t = 0 the event of the whole run, ``buffered_event(z, C's sensitivity for the
    state's steps and period)``; ``NoOpDpEvent`` after (nothing more is spent). A release past the
    state's ``steps`` is refused (the event does not cover it), as is a change of (z, Δ)."""
    if step >= state.steps:
        raise ValueError(f"step={step} is past the strategy's steps={state.steps}: its event does not cover it")
    settings = _checked(state, state.buffers, step, x, noise_multiplier)
    event = (buffered_event(noise_multiplier, state.strategy.sensitivity(state.steps, state.period)) if step == 0
             else dpa.NoOpDpEvent())
    if noise_multiplier == 0:
        return x.value, state._replace(step=step + 1, committed=settings), event
    noise = source.gaussian(x.value, 1.0)
    _subtract(noise, state.buffers, state.strategy.weights)
    buffers = tuple(buffer.mul(decay).add_(noise) for buffer, decay in zip(state.buffers, state.strategy.decays))
    released = x.value.add(noise, alpha=noise_multiplier * x.sensitivity)
    return released, state._replace(buffers=buffers, step=step + 1, committed=settings), event
