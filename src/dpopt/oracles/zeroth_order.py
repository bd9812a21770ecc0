"""The two-point zeroth-order gradient estimator on the sphere (Kornowski, Liu, Talwar, eq. 4).

For record ξ_i at x, with m directions y_ij uniform on the unit sphere S^{d−1}:

    ∇̃f(x; ξ_i) = (1/m) Σ_j (d / 2α) (f(x + α y_ij; ξ_i) − f(x − α y_ij; ξ_i)) y_ij,

an unbiased estimate of ∇f_α(x; ξ_i), the gradient of the α-smoothed loss
f_α(x) = E_{u ~ Unif(B_α)} f(x + u) (Fact 2.3(iv)). Each y_ij is used for both points of its
pair (the reuse the estimator is built on); different records and different calls draw fresh
directions. Evaluated for a whole batch at once, no loop over records or directions: one
``oracle.losses_along(x, directions, alpha, indices)`` call where the oracle has that fast path
(a GLM: f_i(x ± αy) depends on y only through ⟨a_i, y⟩, so the ``[B, 2m, d]`` points are never
formed), else one ``oracle.losses_at`` call on the points. Directions come from the caller's
``torch.Generator`` only. This module knows nothing of privacy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..base import AlongDirections, Oracle, Pointwise


def sphere(gen: torch.Generator, records: int, count: int, dim: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``[records, count, dim]`` i.i.d. directions uniform on the unit sphere: Gaussians normalised
    in ``dtype``. The Gaussians are drawn in float32 (torch's float32 sampler is ~8× faster than
    its float64 one, the zeroth-order methods' largest cost); the normalisation makes every
    direction a unit vector to ``dtype``'s precision, and its law is uniform up to the float32
    rounding of the Gaussians (relative 6e−8)."""
    y = torch.randn(records, count, dim, generator=gen, dtype=torch.float32).to(dtype)
    return y.div_(torch.linalg.vector_norm(y, dim=-1, keepdim=True))


def ball(gen: torch.Generator, records: int, count: int, dim: int, radius: float,
         dtype: torch.dtype = torch.float64) -> Tensor:
    """``[records, count, dim]`` i.i.d. points uniform in the ball of radius ``radius``
    (a sphere direction times radius·U^{1/d})."""
    scale = torch.rand(records, count, 1, generator=gen, dtype=dtype).pow_(1.0 / dim).mul_(radius)
    return sphere(gen, records, count, dim, dtype) * scale


#: Query points evaluated at once (records × 2m × d entries): bounds memory (and keeps the buffers
#: small enough to be reused by the allocator, which is faster); results do not depend on it.
CHUNK = 1 << 19


def two_point(oracle: Pointwise, x: Tensor, indices: Tensor, directions: Tensor, alpha: float) -> Tensor:
    """``[B, d]``: the estimator (4) of each record ``indices[i]`` at x, with its m directions
    ``directions[i] [m, d]`` (unit vectors) and smoothing radius ``alpha`` (records in chunks of
    at most :data:`CHUNK` query entries)."""
    records, m, dim = directions.shape
    along = oracle.losses_along if isinstance(oracle, AlongDirections) else None
    step = max(1, CHUNK // (2 * m * dim))
    parts = []
    for start in range(0, records, step):
        y, batch = directions[start : start + step], indices[start : start + step]
        if along is not None:
            values = along(x, y, alpha, batch)                                     # [b, 2m]
        else:
            points = torch.empty(len(y), 2 * m, dim, dtype=y.dtype)               # [b, 2m, d]: x ± αy
            torch.add(x, y, alpha=alpha, out=points[:, :m])
            torch.add(x, y, alpha=-alpha, out=points[:, m:])
            values = oracle.losses_at(points, batch)
        weights = (values[:, :m] - values[:, m:]).mul_(dim / (2 * alpha * m))     # [b, m]
        parts.append(torch.einsum("bm,bmd->bd", weights, y))
    return torch.cat(parts)


def two_point_loop(oracle: Oracle, x: Tensor, indices: Tensor, directions: Tensor, alpha: float) -> Tensor:
    """The same estimator, one record and one direction at a time through ``oracle.loss`` (the
    naive reference the vectorised :func:`two_point` is tested and benchmarked against)."""
    records, m, dim = directions.shape
    out = torch.zeros(records, dim, dtype=x.dtype)
    for i in range(records):
        record = indices[i : i + 1]
        for j in range(m):
            y = directions[i, j]
            gap = oracle.loss(x + alpha * y, record) - oracle.loss(x - alpha * y, record)
            out[i] += float(gap) * dim / (2 * alpha * m) * y
    return out
