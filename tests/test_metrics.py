"""Goldstein stationarity: ≈ ‖∇F(x)‖ on a smooth function with a tiny α; ≈ 0 at the kink of |x|."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpopt.metrics import goldstein, min_norm_in_hull
from dpopt.oracles import Ridge, TruncatedAbsolute


def test_smooth_function_with_tiny_alpha_gives_the_gradient_norm():
    """F = least squares (‖∇²F‖ ≤ λ_max(XᵀX/n) ≈ 2.5 here): every gradient in the α-ball is within
    α·λ_max of ∇F(x), so the hull's min norm is within that of ‖∇F(x)‖ (below, never above)."""
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 4, generator=gen, dtype=torch.float64), torch.randn(50, generator=gen, dtype=torch.float64)
    F = Ridge(X, y)
    x = torch.tensor([0.5, -1.0, 2.0, 0.3], dtype=torch.float64)
    smoothness = float(torch.linalg.eigvalsh(X.T @ X / 50).max())
    result = goldstein(F, x, 1e-6, points=16, seed=3)
    exact = float(F.gradient(x).norm())
    assert exact - 1e-6 * smoothness - 1e-9 <= result.value <= exact + 1e-9
    assert (result.points, result.seed, result.alpha) == (16, 3, 1e-6)


def test_kink_of_absolute_value_is_goldstein_stationary():
    """F(x) = |x| (one record, x=1, y=0, cap ∞): the α-ball around 0 holds gradients −1 and +1, so
    0 is in the hull; all 64 points on one side has probability 2⁻⁶³. Away from the kink (x = 0.5,
    α = 0.1) every gradient is +1."""
    F = TruncatedAbsolute(torch.ones(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), cap=1e9)
    assert goldstein(F, torch.zeros(1), 0.1).value < 1e-6
    assert goldstein(F, torch.tensor([0.5]), 0.1).value == pytest.approx(1.0, abs=1e-12)


def test_min_norm_point_of_a_segment():
    """The hull of (1, 1) and (1, −1) is the segment x = 1: min norm 1 at the midpoint; of (2, 0)
    and (0, 2) it is (1, 1): √2."""
    assert min_norm_in_hull(torch.tensor([[1.0, 1.0], [1.0, -1.0]])) == pytest.approx(1.0, abs=1e-6)
    assert min_norm_in_hull(torch.tensor([[2.0, 0.0], [0.0, 2.0]])) == pytest.approx(2**0.5, abs=1e-6)


def test_min_norm_point_matches_a_direct_qp_on_random_hulls():
    """Against SLSQP on the simplex (which can only err upwards): never larger, and equal within 1e-6."""
    from scipy import optimize

    gen = torch.Generator().manual_seed(0)
    for shift in (0.0, 0.5, 2.0):  # hulls containing 0 or not
        V = torch.randn(12, 5, generator=gen, dtype=torch.float64) + shift
        G = (V @ V.T).numpy()
        qp = optimize.minimize(lambda w: w @ G @ w, np.full(12, 1 / 12), jac=lambda w: 2 * G @ w, method="SLSQP",
                               bounds=[(0, 1)] * 12, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
                               options={"ftol": 1e-16, "maxiter": 500})
        assert min_norm_in_hull(V) <= float(np.sqrt(max(qp.fun, 0.0))) + 1e-6
        assert min_norm_in_hull(V) == pytest.approx(float(np.sqrt(max(qp.fun, 0.0))), abs=1e-6)
