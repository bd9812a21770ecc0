"""The two-point sphere estimator (eq. 4): vectorised = per-record loop; unbiased for ∇f_α
(= ∇f for a linear loss, exactly, and within a CLT bound for a smooth one); directions uniform."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpopt.oracles import NonconvexLogistic, Ridge, TorchModel, TruncatedAbsolute
from dpopt.oracles import zeroth_order as zo


def data(n: int = 30, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)


def rounding_bound(oracle, x: torch.Tensor, indices: torch.Tensor, directions: torch.Tensor, alpha: float,
                   estimate: torch.Tensor) -> float:
    """How far two float64 evaluations of the estimator in different summation orders can be apart.

    A loss value f_i(z) is computed from a d-term dot product ⟨a_i, z⟩, a shift by y_i and a few
    elementwise operations (and a regulariser of d terms): each evaluation is within κu·F of the
    exact value, u = 2⁻⁵³, κ = 2(d + 4), F the magnitude of what enters it (⟨|a_i|, |z|⟩ + |y_i| +
    |f_i(z)|). A weight is the difference of two values (2κuF), scaled by d/(2αm), and m weights
    times unit vectors are summed: two evaluations differ by at most (d/2α)·4κuF, plus the
    rounding of the scaling and the sum, (m + 2)u·|estimate|.
    """
    records, m, dim = directions.shape
    points = torch.cat([x + alpha * directions, x - alpha * directions], dim=1)
    values = oracle.losses_at(points, indices)
    magnitude = torch.einsum("bd,bkd->bk", oracle.A[indices].abs(), points.abs()) + oracle.y[indices, None].abs()
    u, kappa = 2.0**-53, 2 * (dim + 4)
    return (dim / (2 * alpha)) * 4 * kappa * u * float((magnitude + values.abs()).max()) + (
        (m + 2) * u * float(estimate.abs().max()))


@pytest.mark.parametrize("kind", ["truncated-absolute", "nonconvex-logistic"])
def test_vectorised_estimator_equals_the_per_record_loop(kind, monkeypatch):
    """Also with a regulariser (evaluated at each record's own points). The loop, the vectorised
    form and its chunked evaluation sum in different orders: equal up to float64 rounding."""
    X, y = data()
    oracle = (TruncatedAbsolute(X, y, cap=1.5) if kind == "truncated-absolute"
              else NonconvexLogistic(X, torch.where(y > 0, 1.0, -1.0).double(), reg=0.3))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, generator=gen, dtype=torch.float64)
    indices = torch.tensor([3, 0, 17, 29])
    directions = zo.sphere(gen, 4, 5, 6)
    got = zo.two_point(oracle, x, indices, directions, 0.1)
    want = zo.two_point_loop(oracle, x, indices, directions, 0.1)
    bound = rounding_bound(oracle, x, indices, directions, 0.1, want)
    assert bound < 1e-11 * float(want.abs().max())  # the bound is a rounding bound, not a loose one
    assert float((got - want).abs().max()) <= bound
    monkeypatch.setattr(zo, "CHUNK", 2 * 5 * 6 * 3)  # three records per chunk: the same estimates
    assert float((zo.two_point(oracle, x, indices, directions, 0.1) - got).abs().max()) <= bound


def test_torch_model_losses_and_gradients_at_per_record_points_match_the_glm():
    """A linear module with squared loss is Ridge (λ = 0): losses_at and gradients_at agree."""
    X, y = data()
    module = nn.Linear(6, 1, bias=False).double()
    torch_oracle = TorchModel(module, lambda out, t: 0.5 * (out.squeeze(-1) - t) ** 2, X, y, engine="vmap",
                              microbatch_size=3)
    glm = Ridge(X, y)
    points = torch.randn(7, 4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    indices = torch.arange(7) * 4
    assert torch.allclose(torch_oracle.losses_at(points, indices), glm.losses_at(points, indices), atol=1e-12)
    assert torch.allclose(torch_oracle.gradients_at(points, indices), glm.gradients_at(points, indices), atol=1e-12)
    regularised = NonconvexLogistic(X, torch.where(y > 0, 1.0, -1.0).double(), reg=0.3)
    for i, k in ((0, 0), (6, 3)):
        leaf = points[i, k].clone().requires_grad_(True)
        (want,) = torch.autograd.grad(regularised.loss(leaf, indices[i : i + 1]), leaf)
        assert torch.allclose(regularised.gradients_at(points, indices)[i, k], want, atol=1e-12)


def test_directions_are_unit_and_isotropic():
    """E[y yᵀ] = I/d for y uniform on the sphere: with 40,000 draws in d = 4 every entry of the
    sample second moment is within 6 standard errors (entry variance ≤ 1/d² for unit vectors)."""
    y = zo.sphere(torch.Generator().manual_seed(3), 40_000, 1, 4).squeeze(1)
    assert torch.allclose(y.norm(dim=1), torch.ones(40_000, dtype=torch.float64), atol=1e-12)
    moment = y.T @ y / 40_000
    assert (moment - torch.eye(4, dtype=torch.float64) / 4).abs().max() < 6 * (1 / 4) / math.sqrt(40_000)
    r = zo.ball(torch.Generator().manual_seed(4), 40_000, 1, 3, 0.5).squeeze(1).norm(dim=1)
    assert float(r.max()) <= 0.5
    # P(‖u‖ ≤ r) = (r/0.5)^3: the median radius is 0.5·2^{-1/3}
    assert float(r.median()) == pytest.approx(0.5 * 2 ** (-1 / 3), abs=0.005)


def test_estimator_is_unbiased():
    """On a linear loss f(x; ξ) = ⟨a, x⟩ the smoothed gradient is a; the mean over 20,000
    directions is within 5 standard errors of it (per coordinate std ≤ √d·‖a‖/√m, since
    (d/2α)(f(x+αy) − f(x−αy)) y = d⟨a, y⟩y)."""
    a = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    oracle = Ridge(a, torch.zeros(1, dtype=torch.float64))  # ½⟨a, x⟩² is smooth; its gradient at x is ⟨a,x⟩a
    x = torch.tensor([0.3, 0.1, -0.2], dtype=torch.float64)
    m = 20_000
    got = zo.two_point(oracle, x, torch.tensor([0]), zo.sphere(torch.Generator().manual_seed(5), 1, m, 3), 0.05)[0]
    # ∇(½⟨a, ·⟩²)_α (x) = ⟨a, x⟩a exactly (smoothing a quadratic shifts it by a constant)
    want = float(a[0] @ x) * a[0]
    bound = 5 * math.sqrt(3) * float(a.norm()) * (abs(float(a[0] @ x)) + 0.05 * float(a.norm())) / math.sqrt(m)
    assert (got - want).abs().max() < bound


def test_glm_fast_path_equals_losses_at_the_formed_points():
    """``losses_along`` (margins ⟨a, x⟩ ± α⟨a, y⟩) = ``losses_at`` on the points x ± αy, with and
    without a regulariser, and ``two_point`` on an oracle without the fast path agrees."""
    X, y = data()
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, generator=gen, dtype=torch.float64)
    directions, indices = zo.sphere(gen, 4, 5, 6), torch.arange(4)
    regularised = NonconvexLogistic(X, torch.where(y > 0, 1.0, -1.0).double(), reg=0.3)
    for oracle in (TruncatedAbsolute(X, y, cap=1.5), regularised):
        points = torch.cat([x + 0.1 * directions, x - 0.1 * directions], dim=1)
        assert torch.allclose(oracle.losses_along(x, directions, 0.1, indices), oracle.losses_at(points, indices),
                              rtol=1e-13, atol=1e-13)

    class PointsOnly:  # the same oracle seen without its fast path
        losses_at = TruncatedAbsolute(X, y, cap=1.5).losses_at

    fast = zo.two_point(TruncatedAbsolute(X, y, cap=1.5), x, indices, directions, 0.1)
    assert torch.allclose(zo.two_point(PointsOnly(), x, indices, directions, 0.1), fast, rtol=1e-12, atol=1e-12)
