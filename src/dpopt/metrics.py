"""Measures of a point's quality beyond F and ‖∇F‖: Goldstein stationarity for nonsmooth losses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from scipy import optimize
from torch import Tensor

from . import _validate
from .oracles import zeroth_order as zo


@runtime_checkable
class HasGradient(Protocol):
    """What :func:`goldstein` asks of an oracle: ∇F(θ) on all records."""

    def gradient(self, theta: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class Goldstein:
    """An upper estimate ``value`` of ‖∂̄_α F(x)‖ from ``points`` gradients drawn with ``seed``."""

    value: float
    alpha: float
    points: int
    seed: int


def min_norm_in_hull(vectors: Tensor) -> float:
    """min ‖Σ_k λ_k v_k‖ over the simplex λ ≥ 0, Σλ = 1, exactly, by one non-negative least
    squares problem: μ* = argmin_{μ ≥ 0} ‖Vᵀμ‖² + (1ᵀμ − 1)². For μ on the ray 1ᵀμ = s the first
    term is at least s²r² (r the minimum norm), with equality at s·λ*, so the optimum has
    s = 1/(1 + r²) > 0 and λ* = μ*/1ᵀμ* (Lawson–Hanson active set, ``scipy.optimize.nnls``). The
    result is the norm of an actual hull point."""
    V = vectors.detach().double().cpu().numpy()
    count = len(V)
    A = np.vstack([V.T, np.ones((1, count))])
    b = np.zeros(A.shape[0])
    b[-1] = 1.0
    mu, _ = optimize.nnls(A, b)
    weights = mu / mu.sum() if mu.sum() > 0 else np.full(count, 1.0 / count)
    return float(np.linalg.norm(weights @ V))


def goldstein(F: HasGradient | Callable[[Tensor], Tensor], x: Tensor, alpha: float, *, points: int = 64,
              seed: int = 0) -> Goldstein:
    """Goldstein stationarity ‖∂̄_α F(x)‖ = min{‖g‖ : g ∈ conv ∪_{‖y−x‖≤α} ∂F(y)}, estimated from
    above by the minimum-norm point of the convex hull of full-data gradients ∇F at x and at
    ``points − 1`` points uniform in the α-ball around x (drawn from ``seed``): a hull of a subset
    of the Goldstein subdifferential, so the estimate is ≥ the true value and decreases as
    ``points`` grows. ``F``: an oracle (its ``gradient``) or a callable x ↦ ∇F(x)."""
    _validate.positive("alpha", alpha)
    _validate.positive_int("points", points)
    gradient = F if not isinstance(F, HasGradient) else F.gradient
    gen = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(x, dtype=torch.float64)
    offsets = zo.ball(gen, 1, points - 1, x.shape[0], alpha, x.dtype)[0]
    grads = torch.stack([gradient(x)] + [gradient(x + u) for u in offsets])
    return Goldstein(min_norm_in_hull(grads), alpha, points, seed)
