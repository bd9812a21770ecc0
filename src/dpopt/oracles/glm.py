"""Closed-form oracles for generalised linear models: the fast path.

For a loss ℓ(⟨x_i, θ⟩; y_i) plus a regulariser r(θ), every per-record gradient has the form

    ∇f_i(θ) = c_i(θ) · x_i + ∇r(θ),        c_i = ℓ'(⟨x_i, θ⟩; y_i),

so a batch of them is the lazy :class:`LinearRows` (``coef``, ``X``, ``shift``), never a
``[B, d]`` matrix: norms cost O(B) after one matrix-vector product, and a clipped sum is
``Xᵀ(w ∘ c) + (Σ w_i) ∇r``. The difference of two such batches at θ and θ′ (DP-SRM) has the
same form. Losses (per record, averaged):

* :class:`Logistic`: log(1 + exp(−y⟨x, θ⟩)), y ∈ {−1, +1};
* :class:`NonconvexLogistic`: logistic + λ Σ_j θ_j²/(1 + θ_j²) (the DP-SRM experiment);
* :class:`Ridge`: ½(⟨x, θ⟩ − y)² + (λ/2)‖θ‖²; :class:`LeastSquares` is Ridge with λ = 0;
* :class:`TruncatedAbsolute`: min(|⟨x, θ⟩ − y|, τ) (nonsmooth, nonconvex; DP-O2NC's experiments).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import _validate
from .digest import sha256_of

#: Products with fewer entries than this run on one thread (see :func:`product`).
PARALLEL_MIN = 1 << 16


def product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``, on one thread when the operands are small.

    The BLAS wakes its worker threads for any product, and for a batch-sized matrix-vector
    product (256 × 22) the wake-up costs several times the arithmetic (measured here: 20–30 µs
    with passive OpenMP waiting, against 3 µs on one thread). Switching the thread count costs
    under 1 µs.
    """
    threads = torch.get_num_threads()
    if threads == 1 or a.numel() + b.numel() >= PARALLEL_MIN:
        return a @ b
    torch.set_num_threads(1)
    try:
        return a @ b
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class LinearRows:
    """Rows ``coef_i · a_i + shift`` of a GLM batch (``a_norms_i = ‖a_i‖``); ``shift`` is None
    when there is no regulariser (rows ``coef_i · a_i``, the cheapest case)."""

    A: Tensor
    a_norms: Tensor
    coef: Tensor
    shift: Tensor | None

    def norms(self) -> Tensor:
        """‖c_i a_i + s‖ from c_i²‖a_i‖² + 2c_i⟨a_i, s⟩ + ‖s‖²; where that cancels (c_i a_i ≈ −s),
        the rows are recomputed densely, so a norm is never underestimated by rounding."""
        if self.shift is None:
            return self.coef.abs().mul_(self.a_norms)
        scale = (self.coef * self.a_norms) ** 2 + self.shift @ self.shift
        squared = scale + 2 * self.coef * product(self.A, self.shift)
        norms = squared.clamp(min=0).sqrt()
        cancelled = squared <= 1e-4 * scale
        if cancelled.any():
            norms[cancelled] = (self.coef[cancelled, None] * self.A[cancelled] + self.shift).norm(dim=1)
        return norms

    def weighted_sum(self, weights: Tensor) -> Tensor:
        # w_i = 0 marks a dropped row whose c_i may be ±∞ or NaN: 0 · c_i must be 0, not NaN
        scaled = (weights * self.coef).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        total = product(scaled, self.A)
        return total if self.shift is None else total.add_(self.shift, alpha=float(weights.sum()))

    def dense(self) -> Tensor:
        """The ``[B, d]`` matrix (for tests and small batches)."""
        rows = self.coef[:, None] * self.A
        return rows if self.shift is None else rows + self.shift

    def __sub__(self, other: LinearRows) -> LinearRows:
        if other.shift is None:
            shift = self.shift
        else:
            shift = -other.shift if self.shift is None else self.shift - other.shift
        return LinearRows(self.A, self.a_norms, self.coef - other.coef, shift)


class GLM:
    """Data ``X [n, d]``, targets ``y [n]``, in the canonical form f_i(θ) = φ(⟨a_i, θ⟩; y_i) + r(θ).

    Subclasses give the design rows a_i (:meth:`_design`; default a_i = x_i), φ and φ′ as functions
    of the margin u_i = ⟨a_i, θ⟩, and the regulariser r. Every per-record gradient is
    φ′(u_i; y_i) · a_i + ∇r(θ).
    """

    #: gradients are closed-form: training steps run under ``torch.inference_mode``
    closed_form = True  #: dpopt.base.ClosedForm: steps run in inference mode

    def __init__(self, X: Tensor, y: Tensor, *, reg: float = 0.0) -> None:
        self.X = torch.as_tensor(X, dtype=torch.float64)
        self.y = torch.as_tensor(y, dtype=torch.float64)
        if self.X.ndim != 2 or self.y.shape != (self.X.shape[0],):
            raise _validate.DpoptError(f"X.shape={tuple(self.X.shape)} and y.shape={tuple(self.y.shape)} "
                                       "must be [n, d] and [n]")
        if not (self.X.isfinite().all() and self.y.isfinite().all()):
            raise _validate.DpoptError("data must be finite: X or y contains NaN or inf")
        self.reg = _validate.non_negative("reg", reg)
        self.n, self.dim = self.X.shape
        self.A = self._design(self.X, self.y)
        self.a_norms = self.A.norm(dim=1)
        self._everyone = torch.arange(self.n)
        # one gather per batch: [A | y | ‖a‖]
        self._table = torch.cat([self.A, self.y[:, None], self.a_norms[:, None]], dim=1)

    def _design(self, X: Tensor, y: Tensor) -> Tensor:
        """The rows a_i whose margins ⟨a_i, θ⟩ the loss depends on."""
        return X

    @functools.cached_property
    def data_digest(self) -> str:
        """sha256 of the training data (X and y), computed once: checkpoints of other data differ."""
        return sha256_of(self.X, self.y)

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        """Per-record loss φ(u; y) at margins u = ⟨a, θ⟩."""
        raise NotImplementedError

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        """Its derivative φ′(u; y)."""
        raise NotImplementedError

    def _rows(self, indices: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(A, y, ‖a‖) of ``indices``; all records in place (no copy) for None or ``arange(n)``."""
        if indices is None or (indices.shape[0] == self.n and torch.equal(indices, self._everyone)):
            return self.A, self.y, self.a_norms
        rows = self._table.index_select(0, indices)
        return rows[:, : self.dim], rows[:, self.dim], rows[:, self.dim + 1]

    def regulariser(self, theta: Tensor) -> Tensor:
        """r(θ), the data-independent part of F (0 here)."""
        return theta.new_zeros(())

    def _regulariser_gradient(self, theta: Tensor) -> Tensor | None:
        """∇r(θ), or None when there is no regulariser."""
        return None

    def _shift(self, theta: Tensor) -> Tensor:
        """∇r(θ) of an oracle that has a regulariser."""
        shift = self._regulariser_gradient(theta)
        assert shift is not None
        return shift

    def per_record(self, theta: Tensor, indices: Tensor) -> LinearRows:
        """Per-record gradients of the records ``indices`` (distinct). A batch of every record
        uses the data in place (the set, not the order, determines every clipped sum)."""
        A, y, a_norms = self._rows(indices)
        return LinearRows(A, a_norms, self._slope(product(A, theta), y), self._regulariser_gradient(theta))

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: the data loss φ(⟨a_i, θ_k⟩; y_i) of records ``indices`` at K points ``thetas [K, d]``
        (one matrix product; the regulariser, which does not depend on the data, is excluded)."""
        A, y, _ = self._rows(indices)
        return self._value(product(A, thetas.T), y[:, None])

    def losses_at(self, points: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: the whole loss f_i(θ_ik) = φ(⟨a_i, θ_ik⟩; y_i) + r(θ_ik) of record i at its own
        K points ``points [B, K, d]`` (the zeroth-order oracle's queries)."""
        A, y, _ = self._rows(indices)
        values = self._value(torch.einsum("bd,bkd->bk", A, points), y[:, None])
        if self._regulariser_gradient(points[0, 0]) is None:  # no regulariser
            return values
        return values + torch.vmap(torch.vmap(self.regulariser))(points)

    def losses_along(self, x: Tensor, directions: Tensor, alpha: float, indices: Tensor) -> Tensor:
        """``[B, 2m]``: f_i(x + α y_ij) for j < m, then f_i(x − α y_ij), for record ``indices[i]``
        and its directions ``directions [B, m, d]`` — :meth:`losses_at` of the points x ± α y_ij
        without forming them: the margins are ⟨a_i, x⟩ ± α ⟨a_i, y_ij⟩ (the regulariser, which
        needs the points, falls back to :meth:`losses_at`)."""
        if self._regulariser_gradient(x) is not None:
            return self.losses_at(torch.cat([x + alpha * directions, x - alpha * directions], dim=1), indices)
        A, y, _ = self._rows(indices)
        along = torch.einsum("bd,bmd->bm", A, directions).mul_(alpha)
        centre = (A @ x)[:, None]
        return self._value(torch.cat([centre + along, centre - along], dim=1), y[:, None])

    def gradients_at(self, points: Tensor, indices: Tensor) -> Tensor:
        """``[B, K, d]``: ∇f_i(θ_ik) of record i at its own K points ``points [B, K, d]``."""
        A, y, _ = self._rows(indices)
        grads = self._slope(torch.einsum("bd,bkd->bk", A, points), y[:, None])[:, :, None] * A[:, None, :]
        if self._regulariser_gradient(points[0, 0]) is None:
            return grads
        return grads + torch.vmap(torch.vmap(self._shift))(points)

    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        """F(θ) = mean_i φ(⟨a_i, θ⟩; y_i) + r(θ) over ``indices`` (default all records)."""
        A, y, _ = self._rows(indices)
        return self._value(product(A, theta), y).mean() + self.regulariser(theta)

    def gradient_sum(self, theta: Tensor, indices: Tensor | None) -> Tensor:
        """Σ_{i ∈ indices} ∇f_i(θ) (all records for None) in one pass, without per-record rows:
        ``φ′(Aθ; y) @ A + |indices| · ∇r(θ)``."""
        A, y, _ = self._rows(indices)
        total = product(self._slope(product(A, theta), y), A)
        shift = self._regulariser_gradient(theta)
        return total if shift is None else total.add_(shift, alpha=A.shape[0])

    def gradient(self, theta: Tensor) -> Tensor:
        """∇F(θ) over all records."""
        return self.gradient_sum(theta, None) / self.n

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        """Test error: misclassification rate (classification) or mean squared error."""
        raise NotImplementedError


class Logistic(GLM):
    """Logistic loss log(1 + exp(−y⟨x, θ⟩)); labels y ∈ {−1, +1}.

    Canonical form a_i = −y_i x_i: φ(u) = log(1 + eᵘ) = softplus(u), φ′(u) = σ(u) ∈ (0, 1), so a
    per-record gradient is σ(⟨a_i, θ⟩) a_i (two tensor operations per batch).
    """

    def _design(self, X: Tensor, y: Tensor) -> Tensor:
        if not ((y == 1) | (y == -1)).all():
            raise _validate.DpoptError(f"y must hold only -1.0 and +1.0 for {type(self).__name__}; "
                                       f"found {sorted(set(y.unique().tolist()))[:5]}")
        return -y[:, None] * X

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        return torch.nn.functional.softplus(margin)

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        return torch.sigmoid(margin)

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        X = torch.as_tensor(X, dtype=torch.float64)
        predicted = torch.where(X @ theta >= 0, 1.0, -1.0)
        return float((predicted != torch.as_tensor(y, dtype=torch.float64)).double().mean())


class NonconvexLogistic(Logistic):
    """Logistic loss + λ Σ_j θ_j²/(1 + θ_j²); ∇r = 2λ θ/(1 + θ²)²."""

    def regulariser(self, theta: Tensor) -> Tensor:
        sq = theta**2
        return self.reg * (sq / (1 + sq)).sum()

    def _regulariser_gradient(self, theta: Tensor) -> Tensor | None:
        return 2 * self.reg * theta / (1 + theta**2) ** 2 if self.reg else None


class Ridge(GLM):
    """Squared loss ½(m − y)² + (λ/2)‖θ‖² (a_i = x_i)."""

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        return 0.5 * (margin - y) ** 2

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        return margin - y

    def regulariser(self, theta: Tensor) -> Tensor:
        return 0.5 * self.reg * theta @ theta

    def _regulariser_gradient(self, theta: Tensor) -> Tensor | None:
        return self.reg * theta if self.reg else None

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        X = torch.as_tensor(X, dtype=torch.float64)
        return float(((X @ theta - torch.as_tensor(y, dtype=torch.float64)) ** 2).mean())


class LeastSquares(Ridge):
    """Ridge with λ = 0."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        super().__init__(X, y, reg=0.0)


class TruncatedAbsolute(GLM):
    """Robust regression with the truncated absolute loss min(|⟨x, θ⟩ − y|, τ), τ = ``cap``: nonsmooth
    (kinks at residuals 0 and ±τ), nonconvex, and ‖x_i‖-Lipschitz in θ.
    φ′(u) = sign(u − y)·1[|u − y| < τ] (the convention at the kinks is immaterial: a null set)."""

    def __init__(self, X: Tensor, y: Tensor, *, cap: float = 1.0) -> None:
        super().__init__(X, y)
        self.cap = _validate.positive("cap", cap)

    def _value(self, margin: Tensor, y: Tensor) -> Tensor:
        return (margin - y).abs().clamp(max=self.cap)

    def _slope(self, margin: Tensor, y: Tensor) -> Tensor:
        residual = margin - y
        return residual.sign() * (residual.abs() < self.cap)

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        X = torch.as_tensor(X, dtype=torch.float64)
        return float((X @ theta - torch.as_tensor(y, dtype=torch.float64)).abs().mean())


MODELS = {"logistic": Logistic, "nonconvex-logistic": NonconvexLogistic, "ridge": Ridge}


def make(model: str, X: Tensor, y: Tensor, *, reg: float = 0.0) -> GLM:
    """The GLM oracle named ``model`` ("logistic", "nonconvex-logistic", "ridge")."""
    _validate.one_of("model", model, MODELS)
    return MODELS[model](X, y, reg=reg)
