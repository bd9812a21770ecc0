"""Closed-form oracles for generalised linear models: the fast path.

For a loss ℓ(⟨x_i, θ⟩; y_i) plus a regulariser r(θ), every per-record gradient has the form

    ∇f_i(θ) = c_i(θ) · x_i + ∇r(θ),        c_i = ℓ'(⟨x_i, θ⟩; y_i),

so a batch of them is the lazy :class:`LinearRows` (``coef``, ``X``, ``shift``), never a
``[B, d]`` matrix: norms cost O(B) after one matrix-vector product, and a clipped sum is
``Xᵀ(w ∘ c) + (Σ w_i) ∇r``. The difference of two such batches at θ and θ′ (DP-SRM) has the
same form. Losses (per record, averaged):

* :class:`Logistic`: log(1 + exp(−y⟨x, θ⟩)), y ∈ {−1, +1};
* :class:`NonconvexLogistic`: logistic + λ Σ_j θ_j²/(1 + θ_j²) (the DP-SRM experiment);
* :class:`Ridge`: ½(⟨x, θ⟩ − y)² + (λ/2)‖θ‖²; :class:`LeastSquares` is Ridge with λ = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from .. import _validate
from ..clipping import PerRecord


class Oracle(Protocol):
    """What an algorithm may ask about the training data."""

    n: int
    dim: int

    def per_record(self, theta: Tensor, indices: Tensor) -> PerRecord: ...

    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor: ...

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor: ...

    def regulariser(self, theta: Tensor) -> Tensor: ...

    def gradient(self, theta: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class LinearRows:
    """Rows ``coef_i · x_i + shift`` of a GLM batch (``sq_norms_i = ‖x_i‖²``); ``shift`` is None
    when there is no regulariser (rows ``coef_i · x_i``, the cheapest case)."""

    X: Tensor
    sq_norms: Tensor
    coef: Tensor
    shift: Tensor | None

    def norms(self) -> Tensor:
        """‖c_i x_i + s‖ from c_i²‖x_i‖² + 2c_i⟨x_i, s⟩ + ‖s‖²; where that cancels (c_i x_i ≈ −s),
        the rows are recomputed densely, so a norm is never underestimated by rounding."""
        if self.shift is None:
            return self.coef.abs() * self.sq_norms.sqrt()
        scale = self.coef**2 * self.sq_norms + self.shift @ self.shift
        squared = scale + 2 * self.coef * (self.X @ self.shift)
        norms = squared.clamp(min=0).sqrt()
        cancelled = squared <= 1e-4 * scale
        if cancelled.any():
            norms[cancelled] = (self.coef[cancelled, None] * self.X[cancelled] + self.shift).norm(dim=1)
        return norms

    def weighted_sum(self, weights: Tensor) -> Tensor:
        scaled = torch.where(weights != 0, weights * self.coef, torch.zeros_like(self.coef))
        total = self.X.T @ scaled
        return total if self.shift is None else total + weights.sum() * self.shift

    def dense(self) -> Tensor:
        """The ``[B, d]`` matrix (for tests and small batches)."""
        rows = self.coef[:, None] * self.X
        return rows if self.shift is None else rows + self.shift

    def __sub__(self, other: LinearRows) -> LinearRows:
        if other.shift is None:
            shift = self.shift
        else:
            shift = -other.shift if self.shift is None else self.shift - other.shift
        return LinearRows(self.X, self.sq_norms, self.coef - other.coef, shift)


class GLM:
    """Data ``X [n, d]``, targets ``y [n]``; subclasses give ℓ, ℓ′ and the regulariser."""

    def __init__(self, X: Tensor, y: Tensor, *, reg: float = 0.0) -> None:
        self.X = torch.as_tensor(X, dtype=torch.float64)
        self.y = torch.as_tensor(y, dtype=torch.float64)
        if self.X.ndim != 2 or self.y.shape != (self.X.shape[0],):
            raise _validate.DpoptError(f"X.shape={tuple(self.X.shape)} and y.shape={tuple(self.y.shape)} must be [n, d] and [n]")
        if not (self.X.isfinite().all() and self.y.isfinite().all()):
            raise _validate.DpoptError("data must be finite: X or y contains NaN or inf")
        self.reg = _validate.non_negative("reg", reg)
        self.n, self.dim = self.X.shape
        self.sq_norms = (self.X**2).sum(dim=1)
        self._all = torch.arange(self.n)
        # one gather per batch: [X | y | ‖x‖²]
        self._table = torch.cat([self.X, self.y[:, None], self.sq_norms[:, None]], dim=1)

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        """Per-record loss ℓ(m; y) at margins m = ⟨x, θ⟩."""
        raise NotImplementedError

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        """Its derivative ℓ′(m; y)."""
        raise NotImplementedError

    def _rows(self, indices: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(X, y, ‖x‖²) of ``indices``; all records in place (no copy) for None or ``arange(n)``."""
        if indices is None or (len(indices) == self.n and torch.equal(indices, self._all)):
            return self.X, self.y, self.sq_norms
        rows = self._table.index_select(0, indices)
        return rows[:, : self.dim], rows[:, self.dim], rows[:, self.dim + 1]

    def _regulariser(self, theta: Tensor) -> tuple[Tensor, Tensor | None]:
        """r(θ) and ∇r(θ) (None: no regulariser)."""
        return theta.new_zeros(()), None

    def per_record(self, theta: Tensor, indices: Tensor) -> LinearRows:
        """Per-record gradients of the records ``indices`` (distinct). A batch of every record
        uses the data in place (the set, not the order, determines every clipped sum)."""
        X, y, sq_norms = self._rows(indices)
        return LinearRows(X, sq_norms, self._slope(X @ theta, y), self._regulariser(theta)[1])

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: the data loss ℓ(⟨x_i, θ_k⟩; y_i) of records ``indices`` at K points ``thetas [K, d]``
        (one matrix product; the regulariser, which does not depend on the data, is excluded)."""
        X, y, _ = self._rows(indices)
        return self._value(X @ thetas.T, y[:, None])

    def regulariser(self, theta: Tensor) -> Tensor:
        """r(θ), the data-independent part of F."""
        return self._regulariser(theta)[0]

    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        """F(θ) = mean_i ℓ(⟨x_i, θ⟩; y_i) + r(θ) over ``indices`` (default all records)."""
        X, y, _ = self._rows(indices)
        return self._value(X @ theta, y).mean() + self._regulariser(theta)[0]

    def gradient(self, theta: Tensor) -> Tensor:
        """∇F(θ) over all records."""
        data_part = self.X.T @ self._slope(self.X @ theta, self.y) / self.n
        shift = self._regulariser(theta)[1]
        return data_part if shift is None else data_part + shift

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        """Test error: misclassification rate (classification) or mean squared error."""
        raise NotImplementedError


class Logistic(GLM):
    """Logistic loss log(1 + exp(−y m)); labels y ∈ {−1, +1}."""

    def __init__(self, X: Tensor, y: Tensor, *, reg: float = 0.0) -> None:
        super().__init__(X, y, reg=reg)
        if not ((self.y == 1) | (self.y == -1)).all():
            raise _validate.DpoptError(f"y must hold only -1.0 and +1.0 for {type(self).__name__}; "
                                       f"found {sorted(set(self.y.unique().tolist()))[:5]}")

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        return torch.nn.functional.softplus(-y * margin)

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        return -y * torch.sigmoid(-y * margin)

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        X = torch.as_tensor(X, dtype=torch.float64)
        predicted = torch.where(X @ theta >= 0, 1.0, -1.0)
        return float((predicted != torch.as_tensor(y, dtype=torch.float64)).double().mean())


class NonconvexLogistic(Logistic):
    """Logistic loss + λ Σ_j θ_j²/(1 + θ_j²); ∇r = 2λ θ/(1 + θ²)²."""

    def _regulariser(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        sq = theta**2
        return self.reg * (sq / (1 + sq)).sum(), 2 * self.reg * theta / (1 + sq) ** 2


class Ridge(GLM):
    """Squared loss ½(m − y)² + (λ/2)‖θ‖²."""

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        return 0.5 * (margin - y) ** 2

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        return margin - y

    def _regulariser(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        return 0.5 * self.reg * theta @ theta, self.reg * theta

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        X = torch.as_tensor(X, dtype=torch.float64)
        return float(((X @ theta - torch.as_tensor(y, dtype=torch.float64)) ** 2).mean())


class LeastSquares(Ridge):
    """Ridge with λ = 0."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        super().__init__(X, y, reg=0.0)


MODELS = {"logistic": Logistic, "nonconvex-logistic": NonconvexLogistic, "ridge": Ridge}


def make(model: str, X: Tensor, y: Tensor, *, reg: float = 0.0) -> GLM:
    """The GLM oracle named ``model`` ("logistic", "nonconvex-logistic", "ridge")."""
    _validate.one_of("model", model, MODELS)
    return MODELS[model](X, y, reg=reg)
