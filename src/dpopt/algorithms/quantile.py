"""Quantile adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021, arXiv
1905.03871): the clip norm C_t follows a private estimate of a quantile γ of the per-record
gradient norms, so it stops being a hyper-parameter.

Step t, at the clip C_t (a released value: it depends only on earlier releases), releases two
Gaussians on the same sampled batch:

* the clipped gradient sum Σ_i clip(g_i, C_t), sensitivity Δ = f·C_t, noise multiplier z_grad;
* the count Σ_i (1[‖g_i‖ ≤ C_t] − ½), sensitivity f/2 (:func:`dpopt.clipping.count_within`), noise
  of std σ_b (``count_noise``), so multiplier z_count = σ_b/(f/2) = 2σ_b/f;

with f = 1 under add/remove-one (Poisson batches) and 2 under replace-one (fixed-size batches).
Then b̂ = (noised count)/B + ½ (B the public expected batch) and C_{t+1} = C_t·exp(−η(b̂ − γ)).

Privacy (Theorem 1 of Andrew et al.): the pair is one Gaussian mechanism of multiplier σ when
z_grad⁻² + z_count⁻² = σ⁻², so the gradient is noised at z_grad = (σ⁻² − z_count⁻²)^(−1/2) and σ
is what calibration scales (``noise_multiplier``). Each step records both events,
``wrap(Composed([Gaussian(z_grad), Gaussian(z_count)]))``, and the plan writes the same from the
hyper-parameters; the accountant reads the two Gaussians on one sampled batch as
``wrap(Gaussian(σ))`` (:func:`dpopt.accounting.combined_multiplier`, exact). σ must be below
z_count (the count alone would cost more). Unsampled (full-batch) steps are refused: the pair is
accounted as one release on a sampled batch.
"""

from __future__ import annotations

import math

from dp_accounting import NeighboringRelation

from .. import _validate
from ..clipping import relation_factor

#: The default count noise σ_b: the expected batch size over this (Andrew et al.'s suggestion).
COUNT_NOISE_DIVISOR = 20.0


def count_multiplier(count_noise: float, relation: NeighboringRelation) -> float:
    """z_count = σ_b / (f/2): the count's noise over its sensitivity."""
    return count_noise / (0.5 * relation_factor(relation))


def gradient_multiplier(noise_multiplier: float, count_noise: float, relation: NeighboringRelation) -> float:
    """z_grad = (σ⁻² − z_count⁻²)^(−1/2), the gradient's multiplier when the pair costs σ (0 for σ = 0:
    a non-private reference)."""
    if noise_multiplier == 0:
        return 0.0
    return 1.0 / math.sqrt(noise_multiplier**-2 - count_multiplier(count_noise, relation) ** -2)


def check(noise_multiplier: float, count_noise: float, relation: NeighboringRelation) -> None:
    """σ < z_count, else no gradient noise makes the pair cost σ."""
    z_count = count_multiplier(count_noise, relation)
    if not noise_multiplier < z_count:
        raise _validate.DpoptError(
            f"noise_multiplier={noise_multiplier!r} must be below the count's multiplier {z_count!r} "
            f"(count_noise={count_noise!r} over the count's sensitivity): the noised count alone costs what a Gaussian "
            "of that multiplier costs, so the pair cannot cost only noise_multiplier; raise count_noise")


def next_clip(clip: float, noised_count: float, expected_size: float, quantile: float, lr: float) -> float:
    """C_{t+1} = C_t·exp(−η(b̂ − γ)), b̂ = noised count / B + ½: the geometric update (post-processing)."""
    return clip * math.exp(-lr * (noised_count / expected_size + 0.5 - quantile))
