"""The planned events of correlated-noise runs (no torch: the accounting commands use them).

* :func:`banded_event`: a b-banded strategy (:class:`~dpopt.correlation.strategy.BandedToeplitz`)
  with cyclic Poisson sampling (:class:`dpopt.sampling.CyclicPoisson`), add/remove-one;
* :func:`buffered_event`: a buffered linear Toeplitz strategy
  (:class:`~dpopt.correlation.blt.BufferedToeplitz`) over fixed cyclic batches, replace-one, no
  amplification.
"""

from __future__ import annotations

import dp_accounting as dpa

from .. import _validate


def banded_rounds(steps: int, bands: int) -> int:
    """⌈T/b⌉: the steps the busiest group (group 0: steps 0, b, 2b, …) takes part in."""
    return -(-_validate.positive_int("steps", steps) // _validate.positive_int("bands", bands))


def banded_event(noise_multiplier: float, rate: float, steps: int, bands: int) -> dpa.DpEvent:
    """The event of ``steps`` releases through a b-banded strategy with cyclic Poisson sampling
    at group rate q = ``rate`` (= b·B/n): ``SelfComposed(PoissonSampled(q, Gaussian(z)), ⌈T/b⌉)``
    under add/remove-one.

    Why (Choquette-Choo et al., NeurIPS 2023, arXiv 2306.08153, amplification for b-banded
    matrices): the run is C·G + Z read through C⁻¹ (post-processing), Z i.i.d. N(0, (zΔ)²), G the
    steps' clipped sums. A record in group g enters G only at steps g, g + b, g + 2b, …, each time
    independently with probability q; in C·G step s's column touches rows s … s + b − 1, so its
    participations touch disjoint blocks of rows, each with L2 norm ≤ Δ (unit column norm). The
    blocks are then ⌈(T − g)/b⌉ ≤ ⌈T/b⌉ adaptively composed Poisson-subsampled Gaussian
    mechanisms of multiplier z. b = 1 is DP-SGD's event exactly.
    """
    _validate.non_negative("noise_multiplier", noise_multiplier)
    _validate.unit_interval("rate", rate)
    step = dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(noise_multiplier))
    return dpa.SelfComposedDpEvent(step, banded_rounds(steps, bands))


def buffered_event(noise_multiplier: float, sensitivity: float) -> dpa.DpEvent:
    """The event of a whole run of a buffered linear Toeplitz strategy whose matrix C has
    sensitivity ``sensitivity`` for the run's participation pattern
    (:meth:`~dpopt.correlation.blt.BufferedToeplitz.sensitivity`): C·G + Z is one Gaussian
    mechanism, its input moving by at most Δ·sensitivity, so its multiplier is z/sensitivity."""
    _validate.non_negative("noise_multiplier", noise_multiplier)
    _validate.positive("sensitivity", sensitivity)
    return dpa.GaussianDpEvent(noise_multiplier / sensitivity if noise_multiplier > 0 else 0.0)

