"""GLM oracles: per-record gradients against autograd, losses against plain formulas, errors."""

from __future__ import annotations

import math

import pytest
import torch

from dpopt._validate import DpoptError
from dpopt.oracles import glm

MODELS = [glm.Logistic, glm.NonconvexLogistic, glm.Ridge]


def data(n: int = 400, d: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    y = torch.where(X @ w + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return X, y, gen


def plain_loss(model, x: list[float], y: float, theta: list[float], reg: float) -> float:
    """The per-record loss f_i(θ) written out in Python floats."""
    m = sum(a * b for a, b in zip(x, theta))
    if model is glm.Ridge:
        return 0.5 * (m - y) ** 2 + 0.5 * reg * sum(t * t for t in theta)
    z = y * m
    value = math.log1p(math.exp(-z)) if z > -30 else -z + math.log1p(math.exp(z))
    if model is glm.NonconvexLogistic:
        value += reg * sum(t * t / (1 + t * t) for t in theta)
    return value


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("theta_scale", [0.0, 1.0, 30.0])
def test_per_record_gradient_equals_autograd(model, theta_scale):
    X, y, gen = data()
    oracle = model(X, y, reg=0.7)
    theta = theta_scale * torch.randn(oracle.dim, generator=gen, dtype=torch.float64)
    idx = torch.tensor([0, 3, 3, 17, 250, 399])
    rows = oracle.per_record(theta, idx).dense()
    assert rows.shape == (len(idx), oracle.dim)
    for k, i in enumerate(idx.tolist()):
        point = theta.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(oracle.loss(point, torch.tensor([i])), point)
        assert torch.allclose(rows[k], grad, rtol=1e-10, atol=1e-12), (i, rows[k], grad)
        # The loss itself against the formula in plain floats.
        want = plain_loss(model, X[i].tolist(), float(y[i]), theta.tolist(), 0.7)
        assert float(oracle.loss(theta, torch.tensor([i]))) == pytest.approx(want, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("model", MODELS)
def test_full_loss_and_gradient_consistent(model):
    X, y, gen = data()
    oracle = model(X, y, reg=0.2)
    theta = torch.randn(oracle.dim, generator=gen, dtype=torch.float64)
    point = theta.clone().requires_grad_(True)
    loss = oracle.loss(point)
    (autograd,) = torch.autograd.grad(loss, point)
    assert torch.allclose(oracle.gradient(theta), autograd, rtol=1e-10, atol=1e-13)
    rows = oracle.per_record(theta, torch.arange(oracle.n)).dense()
    assert torch.allclose(rows.mean(dim=0), oracle.gradient(theta), rtol=1e-10, atol=1e-13)
    mean = sum(plain_loss(model, X[i].tolist(), float(y[i]), theta.tolist(), 0.2) for i in range(oracle.n)) / oracle.n
    assert float(loss.detach()) == pytest.approx(mean, rel=1e-12)
    # A central difference along a random direction (O(h²) error, h = 1e-5): agreement to 1e-7.
    direction = torch.randn(oracle.dim, generator=gen, dtype=torch.float64)
    h = 1e-5
    slope = (float(oracle.loss(theta + h * direction)) - float(oracle.loss(theta - h * direction))) / (2 * h)
    assert slope == pytest.approx(float(oracle.gradient(theta) @ direction), rel=1e-7, abs=1e-9)


def test_logistic_is_stable_at_huge_margins():
    X = torch.tensor([[1000.0], [-1000.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0], dtype=torch.float64)
    oracle = glm.Logistic(X, y)
    theta = torch.tensor([1.0], dtype=torch.float64)
    rows = oracle.per_record(theta, torch.arange(2)).dense()
    assert rows[:, 0].tolist() == pytest.approx([-1000.0 * math.exp(-1000.0), 1000.0], rel=1e-12, abs=1e-300)
    # ℓ = log(1 + e^{−1000}) ≈ 0 and log(1 + e^{1000}) ≈ 1000: mean 500.
    assert float(oracle.loss(theta)) == pytest.approx(500.0, rel=1e-12)


def test_nonconvex_regulariser_values():
    X, y, _ = data(n=10, d=3)
    theta = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    plain, nonconvex = glm.Logistic(X, y), glm.NonconvexLogistic(X, y, reg=0.5)
    # r(θ) = λ Σ θ²/(1+θ²) = 0.5·(0 + 1/2 + 4/5) = 0.65; ∇r = 2λθ/(1+θ²)² = (0, 1/4, −2/25).
    assert float(nonconvex.loss(theta) - plain.loss(theta)) == pytest.approx(0.65, rel=1e-14)
    shift = nonconvex.per_record(theta, torch.tensor([0])).shift
    assert shift.tolist() == pytest.approx([0.0, 0.25, -0.08], rel=1e-14)


def test_ridge_and_least_squares():
    X = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0], dtype=torch.float64)
    theta = torch.tensor([3.0, 1.0], dtype=torch.float64)
    ridge, ls = glm.Ridge(X, y, reg=0.1), glm.LeastSquares(X, y)
    assert ls.reg == 0.0
    # residuals (2, 1): ½·(4 + 1)/2 = 1.25; regulariser 0.05·10 = 0.5.
    assert float(ls.loss(theta)) == pytest.approx(1.25, rel=1e-15)
    assert float(ridge.loss(theta)) == pytest.approx(1.75, rel=1e-15)
    # per-record: r_i x_i + λθ = (2,0)+(0.3,0.1) and (0,2)+(0.3,0.1).
    rows = ridge.per_record(theta, torch.arange(2)).dense()
    assert torch.allclose(rows, torch.tensor([[2.3, 0.1], [0.3, 2.1]], dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_error_values():
    X = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    theta = torch.tensor([1.0, 1.0], dtype=torch.float64)
    for model in (glm.Logistic, glm.NonconvexLogistic):
        oracle = model(X, y)
        assert oracle.error(theta, X, y) == 0.25  # only the last point is misclassified
        assert oracle.error(-theta, X, y) == 0.75
        # A margin of exactly 0 predicts +1.
        assert oracle.error(torch.zeros(2, dtype=torch.float64), X, y) == 0.25
    ridge = glm.Ridge(X, y)
    # predictions (1, −1, 1, −1) against (1, −1, 1, 1): squared errors (0, 0, 0, 4): MSE 1.
    assert ridge.error(theta, X, y) == 1.0
    # Error accepts plain lists/float32 inputs.
    assert glm.Logistic(X, y).error(theta, X.float(), y.tolist()) == 0.25


def test_input_validation():
    X, y, _ = data(n=10, d=3)
    with pytest.raises(DpoptError, match=r"X.shape=\(10, 3\) and y.shape=\(9,\) must be \[n, d\] and \[n\]"):
        glm.Logistic(X, y[:9])
    bad = X.clone()
    bad[2, 1] = math.nan
    with pytest.raises(DpoptError, match="data must be finite"):
        glm.Ridge(bad, y)
    with pytest.raises(DpoptError, match=r"reg=-1.0 must be >= 0 and finite"):
        glm.NonconvexLogistic(X, y, reg=-1.0)
    with pytest.raises(DpoptError, match=r"model='svm' must be one of: logistic, nonconvex-logistic, ridge"):
        glm.make("svm", X, y)
    made = glm.make("nonconvex-logistic", X, y, reg=0.3)
    assert isinstance(made, glm.NonconvexLogistic) and made.reg == 0.3 and (made.n, made.dim) == (10, 3)


@pytest.mark.parametrize("kind", ["permuted", "repeats"])
def test_row_k_is_the_gradient_of_record_indices_k_for_any_batch(kind):
    """Row k of ``per_record(θ, indices)`` belongs to record ``indices[k]``, also when the batch
    has n entries (a permutation of all records, or repeats), and its sum is that multiset's."""
    X, y, gen = data(n=50, d=3)
    oracle = glm.NonconvexLogistic(X, y, reg=0.4)
    theta = torch.randn(3, generator=gen, dtype=torch.float64)
    every = oracle.per_record(theta, torch.arange(50)).dense()
    indices = {"permuted": torch.randperm(50, generator=gen), "repeats": torch.arange(50) % 7}[kind]
    rows = oracle.per_record(theta, indices)
    assert rows.dense().shape == (50, 3)
    worst = float((rows.dense() - every[indices]).abs().max())
    assert worst <= 1e-14, f"indices {indices[:4].tolist()}…: rows differ by {worst}"
    ones = torch.ones(50, dtype=torch.float64)
    assert torch.allclose(rows.weighted_sum(ones), every[indices].sum(dim=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model", MODELS)
def test_per_record_loss_and_regulariser(model):
    X, y, gen = data(n=30, d=4)
    oracle = model(X, y, reg=0.25)
    thetas = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    idx = torch.tensor([1, 1, 29, 4])
    losses = oracle.per_record_loss(thetas, idx)
    assert losses.shape == (4, 3)
    for k in range(3):
        reg = float(oracle.regulariser(thetas[k]))
        want_reg = plain_loss(model, [0.0] * 4, 0.0, thetas[k].tolist(), 0.25) - plain_loss(
            model, [0.0] * 4, 0.0, [0.0] * 4, 0.25)  # f at x = 0, y = 0 minus its data part
        assert reg == pytest.approx(want_reg, rel=1e-12, abs=1e-15)
        for b, i in enumerate(idx.tolist()):
            want = plain_loss(model, X[i].tolist(), float(y[i]), thetas[k].tolist(), 0.25) - reg
            assert float(losses[b, k]) == pytest.approx(want, rel=1e-10, abs=1e-13)
        assert float(losses[:, k].mean()) + reg == pytest.approx(float(oracle.loss(thetas[k], idx)), rel=1e-12)


def test_logistic_refuses_labels_outside_plus_minus_one() -> None:
    X = torch.zeros(3, 2, dtype=torch.float64)
    with pytest.raises(DpoptError, match=r"y must hold only -1.0 and \+1.0 for Logistic; found \[0.0, 1.0, 2.0\]"):
        glm.Logistic(X, torch.tensor([0.0, 1.0, 2.0]))
