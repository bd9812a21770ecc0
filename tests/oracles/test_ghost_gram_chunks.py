"""The Linear rule's Gram form from float64 copies of a few records at a time, and the rule that
chooses it.

* The chunked Gram norms equal the direct form's rows and autograd's per-record gradients to 1e−10
  in float64, for T ∈ {1, 5, 64}, small and large p, q, with chunk boundaries that do not divide
  the batch; in float32 they stay upper bounds of the norm of what the sum adds, within the
  stated rounding bound. Two mutants are caught by the same measurement: a chunked Gram that
  drops the last partial chunk, and one formed in float32 (without a bound for it).
* The rule picks the Gram form for augmentation multiplicity's views (T = 5, p = 3,969, q = 10,
  float32) and keeps the direct form for the other shapes the project runs.
"""

from __future__ import annotations

import pytest
import torch

from dpopt.oracles import ghost
from dpopt.oracles.ghost import layers, rounding

F64 = torch.float64

#: (T, p, q): one position, the views' layer (narrowed), many positions; small and large p, q.
SHAPES = [(1, 3, 4), (1, 700, 2), (5, 3969, 10), (5, 6, 300), (64, 9, 5), (64, 120, 40)]


def autograd_norms(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """‖∂/∂W Σ_t ⟨g_t, W a_t⟩‖ per record by autograd, in float64: the gradient is Σ_t g_t a_tᵀ."""
    norms = []
    for A, G in zip(a.double(), g.double()):
        W = torch.zeros(G.shape[1], A.shape[1], dtype=F64, requires_grad=True)
        (grad,) = torch.autograd.grad(((A @ W.T) * G).sum(), W)
        norms.append(grad.norm())
    return torch.stack(norms)


def direct_sq(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The direct form's squared norms in float64: rows Σ_t g_t a_tᵀ, squared and summed."""
    return torch.einsum("btq,btp->bqp", g.double(), a.double()).square().sum((1, 2))


def inputs(T: int, p: int, q: int, dtype: torch.dtype, B: int = 37, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, p, generator=gen, dtype=F64).to(dtype), torch.randn(B, T, q, generator=gen,
                                                                                   dtype=F64).to(dtype)


def three_records(monkeypatch, T: int, p: int) -> None:
    """Copies of the inputs of three records at a time: 13 chunks of the 37 records, the last one
    partial (the output gradients, q ≤ p, in chunks of at least three records too)."""
    monkeypatch.setattr(rounding, "GRAM_BYTES", 3 * 8 * T * p)


@pytest.mark.parametrize(("T", "p", "q"), SHAPES)
def test_chunked_gram_norms_equal_the_direct_form_and_autograd_in_float64(monkeypatch, T, p, q):
    """float32 inputs (their float64 casts are exact), their Gram matrices formed a few records at
    a time: the squared norms agree with the direct form and autograd on the same numbers to 1e−10."""
    three_records(monkeypatch, T, max(p, q))
    a, g = inputs(T, p, q, torch.float32)
    sq, bound = ghost.gram_sq_norms([(a, g)])
    assert sq.dtype == F64
    torch.testing.assert_close(sq, direct_sq(a, g), rtol=1e-10, atol=0)
    torch.testing.assert_close(sq.sqrt(), autograd_norms(a, g), rtol=1e-10, atol=0)
    want_bound = (a.double().norm(dim=2) * g.double().norm(dim=2)).sum(1).square()
    torch.testing.assert_close(bound, want_bound, rtol=1e-10, atol=0)


@pytest.mark.parametrize(("T", "p", "q"), SHAPES)
def test_chunked_gram_of_stacked_pairs_equals_the_direct_difference(monkeypatch, T, p, q):
    """The stacked form of a difference at two points (two pairs, their cross Gram matrices chunked
    too) equals the norm of the difference of the rows."""
    three_records(monkeypatch, T, max(p, q))
    a, g = inputs(T, p, q, torch.float32)
    a2, g2 = inputs(T, p, q, torch.float32, seed=1)
    sq, bound = ghost.gram_sq_norms([(a, g - g2), (a - a2, g2)])
    rows = (torch.einsum("btq,btp->bqp", (g - g2).double(), a.double())
            + torch.einsum("btq,btp->bqp", g2.double(), (a - a2).double()))
    enlargement = rounding.gamma(p + q + (2 * T) ** 2 + 8, rounding.U64) * bound  # its rounding bound, added
    torch.testing.assert_close(sq - enlargement, rows.square().sum((1, 2)), rtol=1e-10, atol=0)


def float32_verdict(a: torch.Tensor, g: torch.Tensor) -> tuple[bool, float]:
    """Whether the layer's float32 bounds cover the norms of what its sum adds for each record —
    ``fl(Σ_t fl(w·g_t) a_tᵀ)`` with w = 1, the backward product, in float32 — and stay within the
    stated rounding above the exact norms (γ_{T+3}·Σ_t ‖a_t‖‖g_t‖ plus 1e−6 relative); and the
    largest relative excess over the exact norm."""
    B, T = a.shape[:2]
    bounds = rounding.gram_bounds([(a, g)], B, 1, T, a.dtype)  # the Gram form's, as a Layer takes it
    added = torch.stack([(G.T @ A).double().norm() for A, G in zip(a, g)])  # what the sum adds, in float32
    exact = direct_sq(a, g).sqrt()
    slack = rounding.gamma(T + 3, rounding.unit(torch.float32)) * (a.double().norm(dim=2)
                                                                   * g.double().norm(dim=2)).sum(1)
    ok = bool((bounds >= added).all() and (bounds >= exact).all() and (bounds <= exact * (1 + 1e-6) + slack).all())
    return ok, float((bounds / exact - 1).max())


@pytest.mark.parametrize(("T", "p", "q"), [(5, 3969, 10), (64, 120, 40), (5, 2**15, 3)])
def test_float32_chunked_gram_bounds_cover_the_sum_within_the_rounding_bound(monkeypatch, T, p, q):
    """Positive float32 inputs (their rounding errors add up, none cancel): every bound covers the
    float32 contribution and the exact norm, and exceeds the exact norm by at most the stated bound."""
    three_records(monkeypatch, T, p)
    gen = torch.Generator().manual_seed(3)
    a, g = torch.rand(37, T, p, generator=gen), torch.rand(37, T, q, generator=gen)
    ok, excess = float32_verdict(a, g)
    assert ok and 0 <= excess < 1e-5


def drops_the_last_partial_chunk(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Mutant: a chunked Gram whose loop stops before the last, partial chunk (those records' Gram
    matrices stay zero)."""
    R, T, n = X.shape
    step = max(1, rounding.GRAM_BYTES // (8 * T * n))
    out = X.new_zeros(R, T, T, dtype=F64)
    for start in range(0, R - R % step, step):
        out[start:start + step] = X[start:start + step].double() @ Y[start:start + step].double().mT
    return out


def float32_gram(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Mutant: the Gram matrices formed in float32 (each entry off by up to n·2⁻²⁴·‖x_s‖‖y_t‖), with
    no bound for that rounding."""
    return (X @ Y.mT).double()


@pytest.mark.parametrize("mutant", [drops_the_last_partial_chunk, float32_gram])
def test_the_measurements_catch_a_gram_that_drops_records_or_rounds_in_float32(monkeypatch, mutant):
    """The float64 agreement and the float32 bound checks above, run on the mutants: both fail."""
    three_records(monkeypatch, 5, 3969)
    a, g = inputs(5, 3969, 10, torch.float32)
    sq, _ = ghost.gram_sq_norms([(a, g)])
    assert torch.allclose(sq, direct_sq(a, g), rtol=1e-10, atol=0)
    gen = torch.Generator().manual_seed(3)
    pa, pg = torch.rand(37, 5, 3969, generator=gen), torch.rand(37, 5, 10, generator=gen)
    assert float32_verdict(pa, pg)[0]
    monkeypatch.setattr(rounding, "_gram", mutant)
    sq, _ = ghost.gram_sq_norms([(a, g)])
    assert not torch.allclose(sq, direct_sq(a, g), rtol=1e-10, atol=0)
    if mutant is drops_the_last_partial_chunk:
        assert not float32_verdict(pa, pg)[0]


def test_the_float32_gram_mutant_misses_a_cancelling_record():
    """Positions whose terms cancel (a_2 ≈ a_1, g_2 = −g_1): the float32 Gram mutant's squared norm
    is rounding noise (even negative), the float64 Gram form's covers the norm closely."""
    gen = torch.Generator().manual_seed(2)
    a = torch.rand(4, 1, 3969, generator=gen).repeat(1, 2, 1)
    a[:, 1] += 1e-4 * torch.rand(4, 3969, generator=gen)
    g = torch.rand(4, 1, 10, generator=gen).repeat(1, 2, 1)
    g[:, 1] *= -1
    want = direct_sq(a, g)
    sq, _ = ghost.gram_sq_norms([(a, g)])
    mutant = (float32_gram(a, a) * float32_gram(g, g)).sum((1, 2))
    assert (sq >= want).all() and (sq <= want * (1 + 1e-3)).all()  # the enlargement: 2e−4 here
    # measured: off by 18 to 63 times the norm², or (one machine, one record) exactly 0: off by the norm² itself
    assert ((mutant - want).abs() >= want).all()


#: (T, p, q, form in float32) for the layers the project runs.
PROJECT_SHAPES = [
    (5, 3969, 10, True),    # augmentation multiplicity's views (mnist-sota's scatternet-views)
    (64, 128, 128, False),  # benchmarks/bench_gpt.py: q, k, v, proj
    (64, 128, 512, False),  # its MLP's fc
    (64, 512, 128, False),  # its MLP's out
    (196, 64, 16, False),   # the MNIST CNN's first convolution
    (25, 256, 32, False),   # its second
    (64, 768, 8, False),    # LoRA factors of rank 8
    (64, 8, 768, False),
    (16, 3969, 10, False),  # more views: rows cheaper than T² Gram products formed at every step
]


@pytest.mark.parametrize(("T", "p", "q", "gram"), PROJECT_SHAPES)
def test_the_rule_picks_the_gram_form_for_the_views_only(T, p, q, gram):
    assert layers.use_gram(T, p, q, 4) is gram


def test_the_rule_keeps_every_gram_choice_of_the_memory_rule():
    """Wherever the previous rule chose the Gram form in float32 (rows larger than float64 copies
    of the positions), this one does too."""
    for T in (2, 3, 5, 8, 16, 64):
        for p in (4, 16, 64, 256, 1024, 4096):
            for q in (1, 4, 16, 64, 256, 1024):
                if 2 * T * T < p * q and 8 * T * (p + q) < p * q * 4:
                    assert layers.use_gram(T, p, q, 4), (T, p, q)
