"""Clipping: the only place a :class:`~dpopt.mechanisms.Bounded` value is made.

Per-record vectors arrive as a :class:`PerRecord` (dense ``[B, d]`` rows, or the lazy GLM form
``coef_i · x_i + shift`` that never materialises the matrix). Clipping scales row i by
``w_i = min(1, C / ‖row_i‖)``; rows that are not finite get ``w_i = 0`` (zeroed and counted, never
summed). The sensitivity of a sum of clipped rows is C under add/remove-one or replace-special
adjacency and 2C under replace-one (one row swapped for another anywhere in the C-ball).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from dp_accounting import NeighboringRelation
from torch import Tensor

from .mechanisms import _CLIPPING_TOKEN, Bounded


class PerRecord(Protocol):
    """Per-record vectors of one batch, possibly in a lazy form."""

    def norms(self) -> Tensor:
        """``[B]``: the L2 norm of each record's vector."""

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """``Σ_i w_i · row_i`` as a ``[d]`` tensor; rows with ``w_i = 0`` contribute exactly 0."""


@dataclass(frozen=True)
class Dense:
    """Per-record vectors materialised as a ``[B, d]`` tensor."""

    rows: Tensor

    def norms(self) -> Tensor:
        """Row norms, scaled by the largest entry so that finite rows never overflow."""
        scale = self.rows.abs().amax(dim=1, keepdim=True)
        safe = torch.where((scale > 0) & scale.isfinite(), scale, torch.ones_like(scale))
        return safe.squeeze(1) * (self.rows / safe).norm(dim=1)

    def weighted_sum(self, weights: Tensor) -> Tensor:
        kept = weights != 0
        return weights[kept] @ self.rows[kept]

    def __sub__(self, other: Dense) -> Dense:
        return Dense(self.rows - other.rows)


@dataclass(frozen=True)
class Term:
    """``scale · clip(rows, clip)``: one summand of a per-record combination."""

    scale: float
    rows: PerRecord
    clip: float


def clip_weights(norms: Tensor, clip: float) -> Tensor:
    """``w_i = min(1, C/‖v_i‖)``; 1 for zero rows and for C = ∞; 0 for non-finite rows."""
    weights = (norms.reciprocal() * clip).clamp(max=1.0)
    return weights.where(norms.isfinite(), weights.new_zeros(()))


def relation_factor(relation: NeighboringRelation) -> float:
    """Sensitivity of a sum of vectors in the unit ball: 1 (add/remove, replace-special), 2 (replace-one)."""
    return 2.0 if relation == NeighboringRelation.REPLACE_ONE else 1.0


def clip_sum(terms: Sequence[Term], relation: NeighboringRelation) -> tuple[Bounded, int]:
    """``Σ_i Σ_k s_k · clip(v_{k,i}, C_k)``, with the count of non-finite records zeroed.

    Each record contributes a vector of norm ≤ S = Σ_k |s_k| C_k, so the sum has sensitivity
    S (add/remove-one) or 2S (replace-one). DP-SGD uses one term; DP-SRM uses two (the clipped
    gradient and the clipped gradient difference). A record whose vector is not finite in any
    term is dropped from every term.
    """
    norms = [term.rows.norms() for term in terms]
    used = [(term, norm) for term, norm in zip(terms, norms) if term.scale != 0]  # 0 · ∞ clip has no bound
    weights = [clip_weights(norm, term.clip) for term, norm in used]  # zero for the term's own non-finite rows
    if len(terms) == 1:
        finite = norms[0].isfinite()
    else:  # a record non-finite in one term is dropped from all
        finite = torch.stack([norm.isfinite() for norm in norms]).all(dim=0)
        weights = [weight * finite for weight in weights]
    total = sum(term.scale * term.rows.weighted_sum(weight) for (term, _), weight in zip(used, weights))
    bound = sum(abs(term.scale) * term.clip for term, _ in used) * relation_factor(relation)
    return Bounded(total, bound, _CLIPPING_TOKEN), int((~finite).sum())
