"""Clipping: the only place a :class:`~dpopt.mechanisms.Bounded` value is made.

Per-record vectors arrive as a :class:`PerRecord` (dense ``[B, d]`` rows, or the lazy GLM form
``coef_i · x_i + shift`` that never materialises the matrix). Clipping scales row i by
``w_i = min(1, C / ‖row_i‖)``; rows that are not finite get ``w_i = 0`` (zeroed and counted, never
summed). The sensitivity of a sum of clipped rows is C under add/remove-one or replace-special
adjacency and 2C under replace-one (one row swapped for another anywhere in the C-ball).

Mixed precision: the functions that make a Bounded value, and the rows' norms and weighted sums
(:class:`Dense`, the ghost engine's rows), run with autocast off (:func:`exact`), whatever the
caller's ``torch.autocast`` context. Under a bf16 autocast the products of a clipped
sum (``w @ rows``) would otherwise be computed in bf16 (unit roundoff 2⁻⁸): a clipped record
would add up to ~0.4 % more than C (0.23 % measured on a GPT-2), beyond the rounding bounds the
norms are enlarged by (:mod:`dpopt.oracles.ghost.rounding`, stated for the rows' own dtype).
Autocast still applies to the model's forward and backward, which form the per-record rows.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar, cast

import torch
from dp_accounting import NeighboringRelation
from torch import Tensor

from .base import PerRecord, ShareOfBatch
from .mechanisms import _CLIPPING_TOKEN, Bounded

_NORM_CHUNK = 1 << 18  # columns per float64 chunk in Dense.norms
#: The device types whose autocast :func:`exact` turns off.
AUTOCAST_DEVICES = ("cpu", "cuda")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def exact(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run with ``torch.autocast`` off on every device type of :data:`AUTOCAST_DEVICES`: its
    norms, weights and sums are computed in the dtypes of the tensors it is given."""
    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        devices = [device for device in AUTOCAST_DEVICES if torch.is_autocast_enabled(device)]
        if not devices:  # the common case, a few microseconds cheaper than the context managers
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for device in devices:
                stack.enter_context(torch.autocast(device, enabled=False))
            return fn(*args, **kwargs)
    return run


@dataclass(frozen=True)
class Dense:
    """Per-record vectors materialised as a ``[B, d]`` tensor."""

    rows: Tensor

    @exact
    def norms(self) -> Tensor:
        """Row norms, in float64. Lower-precision rows are summed in float64 (in column chunks, to
        bound memory): a float32 sum over millions of entries can come out ~1e-3 too small, which
        would let a clipped row exceed C. float64 rows are scaled by their largest entry so that
        the sum of squares never overflows; a finite row whose norm itself exceeds float64's
        range (≳ 1.8e308) gets norm ∞ and is treated as non-finite (zeroed and counted)."""
        if self.rows.dtype != torch.float64:
            squares = sum(chunk.double().square().sum(dim=1) for chunk in self.rows.split(_NORM_CHUNK, dim=1))
            return torch.as_tensor(squares, dtype=torch.float64).reshape(len(self.rows)).sqrt()  # kept in float64
        scale = self.rows.abs().amax(dim=1, keepdim=True)
        safe = torch.where((scale > 0) & scale.isfinite(), scale, torch.ones_like(scale))
        return safe.squeeze(1) * (self.rows / safe).norm(dim=1)

    @exact
    def weighted_sum(self, weights: Tensor) -> Tensor:
        kept = weights != 0
        return weights_in(weights[kept], self.rows.dtype) @ self.rows[kept]

    def __sub__(self, other: Dense) -> Dense:
        return Dense(self.rows - other.rows)


@dataclass(frozen=True)
class Term:
    """``scale · clip(rows, clip)``: one summand of a per-record combination."""

    scale: float
    rows: PerRecord
    clip: float


def weights_in(weights: Tensor, dtype: torch.dtype) -> Tensor:
    """``weights`` in ``dtype`` rounded toward zero, so that casting a clip weight to a lower
    precision never lets a clipped row grow past its clip norm."""
    if weights.dtype == dtype:
        return weights
    cast = weights.to(dtype)
    return torch.where(cast.to(weights.dtype) > weights, torch.nextafter(cast, torch.zeros_like(cast)), cast)


def clip_weights(norms: Tensor, clip: float, *, all_finite: bool = False) -> Tensor:
    """``w_i = min(1, C/‖v_i‖) = C / max(C, ‖v_i‖)``; 1 for zero rows and for C = ∞; 0 for
    non-finite rows (C/∞ = 0, and NaN is mapped to 0) and for every row when C = 0 (a zero
    clip releases nothing). ``all_finite=True`` (the caller has checked that every norm is
    finite) skips the NaN mapping."""
    if clip == math.inf:
        return norms.isfinite().to(norms.dtype)
    if clip == 0:
        return torch.zeros_like(norms)
    weights = norms.clamp(min=clip).reciprocal_().mul_(clip)  # (Tensor.__rdiv__ is slow)
    return weights if all_finite else weights.nan_to_num_(0.0)


def relation_factor(relation: NeighboringRelation) -> float:
    """Sensitivity of a sum of vectors in the unit ball: 1 (add/remove, replace-special), 2 (replace-one)."""
    return 2.0 if relation == NeighboringRelation.REPLACE_ONE else 1.0


@exact
def clip_sum(terms: Sequence[Term], relation: NeighboringRelation) -> tuple[Bounded, int]:
    """``Σ_i Σ_k s_k · clip(v_{k,i}, C_k)``, with the count of non-finite records zeroed.

    Each record contributes a vector of norm ≤ S = Σ_k |s_k| C_k, so the sum has sensitivity
    S (add/remove-one) or 2S (replace-one). DP-SGD uses one term; DP-SRM uses two (the clipped
    gradient and the clipped gradient difference). A record whose vector is not finite in any
    term is dropped from every term.
    """
    norms = [term.rows.norms() for term in terms]
    all_finite = math.isfinite(math.fsum(float(norm.sum()) for norm in norms))  # one check, common case
    keep, dropped = None, 0
    if not all_finite:  # a record non-finite in one term is dropped from all
        keep = torch.stack([norm.isfinite() for norm in norms]).all(dim=0)
        dropped = int((~keep).sum())
    total, bound = None, 0.0
    for term, norm in zip(terms, norms):
        if term.scale == 0:  # 0 · ∞ clip has no bound
            continue
        weights = clip_weights(norm, term.clip, all_finite=all_finite)
        part = term.rows.weighted_sum(weights if keep is None else weights.where(keep, 0.0))
        if total is None:
            total = part if term.scale == 1 else part.mul_(term.scale)
        else:
            total.add_(part, alpha=term.scale)
        bound += abs(term.scale) * term.clip
    if total is None:
        raise ValueError("clip_sum needs at least one term with a non-zero scale")
    return Bounded(total, bound * relation_factor(relation), _CLIPPING_TOKEN), dropped


@exact
def count_within(rows: PerRecord, clip: float, relation: NeighboringRelation) -> Bounded:
    """``Σ_i (1[‖v_i‖ ≤ C] − ½)`` over the batch's records, as a one-entry float64 tensor: adaptive
    clipping's count (Andrew et al. 2021, arXiv 1905.03871). A record whose norm is not finite counts
    as clipped.

    Sensitivity **½** under add/remove-one (a record adds or removes a term in {−½, +½}; the −½
    keeps it so without knowing the realised, private, batch size) and **1** under replace-one
    (one term swapped for another). Data-parallel rows (:class:`~dpopt.base.ShareOfBatch`) count
    their own share and sum the counts over the processes."""
    norms = rows.norms()
    local = ((norms <= clip).sum(dtype=torch.float64) - 0.5 * len(norms)).reshape(1)
    total = cast(ShareOfBatch, rows).batch_total(local) if _shares(type(rows)) else local
    return Bounded(total, 0.5 * relation_factor(relation), _CLIPPING_TOKEN)


@functools.cache
def _shares(kind: type) -> bool:
    """Whether rows of type ``kind`` are one process's share (:class:`~dpopt.base.ShareOfBatch`),
    asked once per type (a protocol check costs tens of microseconds, every step would)."""
    return issubclass(kind, ShareOfBatch)


@exact
def clip_aggregate(value: Tensor, clip: float) -> Bounded:
    """``clip(v, λ) = v · min(1, λ/‖v‖)`` of an aggregate v over a batch (AClip's batch mean).

    Sensitivity **2λ** under every neighbouring relation: clip(v(S)) and clip(v(S′)) both lie
    in the λ-ball, and with unbounded per-record gradients one record can move v(S) anywhere,
    so the 2λ is attained (opposite points of the sphere). An aggregate that is not finite
    (a record's gradient overflowed) is released as 0, a point of the ball that does not
    depend on which record caused it.
    """
    norm = float(Dense(value.reshape(1, -1)).norms())  # in float64, whatever value's precision
    if not math.isfinite(norm):
        clipped = torch.zeros_like(value)
    elif norm <= clip:
        clipped = value.clone()
    else:  # in a lower precision, rounding can leave the product a hair above λ: shrink until not
        scale = weights_in(torch.tensor(clip / norm, dtype=torch.float64), value.dtype)
        clipped = value * scale
        while float(Dense(clipped.reshape(1, -1)).norms()) > clip:
            scale = torch.nextafter(scale, torch.zeros_like(scale))
            clipped = value * scale
    return Bounded(clipped, 2.0 * clip, _CLIPPING_TOKEN)


@exact
def clip_loss_sums(losses: Tensor, clip: float, *, public_offset: Tensor) -> Bounded:
    """``u_k = Σ_i min(max(ℓ_{i,k}, 0), C) + o_k`` for per-record losses ``[B, K]`` of K
    candidates and a data-independent offset o (DP-AGD's scores). Non-finite losses count as C.

    Sensitivity C under every relation: each record adds a value in [0, C] to every score, so
    replacing, adding or removing one record moves each u_k by at most C (a bound on every
    coordinate, which is what the exponential mechanism needs: :func:`~dpopt.mechanisms.noisy_argmin`).
    """
    bounded = torch.nan_to_num(losses, nan=clip, posinf=clip).clamp(min=0.0, max=clip)
    return Bounded(bounded.sum(dim=0) + public_offset, clip, _CLIPPING_TOKEN)
