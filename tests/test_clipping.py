"""Clipping: per-record bounds, the clipped sum against a plain loop, dropped rows, sensitivities,
and the lazy GLM rows (:class:`~dpopt.oracles.glm.LinearRows`) against their dense form."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import NeighboringRelation
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt import clipping
from dpopt.oracles import glm
from dpopt.oracles.glm import LinearRows

ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = NeighboringRelation.REPLACE_ONE
REPLACE_SPECIAL = NeighboringRelation.REPLACE_SPECIAL

#: Fixed, reproducible example generation (no example database, no random seed).
PROPERTY = settings(derandomize=True, max_examples=150, deadline=None, database=None)

SPECIAL = [0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, 5e-324, 1.7e308, math.nan, math.inf, -math.inf]
entries = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3),
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True),
)
#: The same without entries whose square overflows (|v| > 1e154): for properties other than
#: overflow, which test_huge_finite_row_is_clipped_not_dropped covers on its own.
no_overflow = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3),
    st.sampled_from([v for v in SPECIAL if not math.isfinite(v) or abs(v) < 1e150]),
    st.floats(min_value=-1e150, max_value=1e150),
)
clips = st.one_of(st.floats(min_value=1e-3, max_value=1e3), st.sampled_from([1.0, 0.01, 7.5]))


@st.composite
def row_sets(draw, elements=entries, max_rows=6):
    """A ``[B, d]`` list of rows, 1 ≤ B ≤ max_rows, 1 ≤ d ≤ 5."""
    d = draw(st.integers(1, 5))
    b = draw(st.integers(1, max_rows))
    return [draw(st.lists(elements, min_size=d, max_size=d)) for _ in range(b)]


def is_finite(row) -> bool:
    return all(math.isfinite(v) for v in row)


def exact_norm(row) -> float:
    """‖row‖ without overflow or underflow (math.hypot scales internally)."""
    return math.hypot(*row)


def clip_row(row, clip: float) -> list[float]:
    """min(1, C/‖v‖)·v in plain Python floats."""
    norm = exact_norm(row)
    weight = 1.0 if norm == 0 or norm <= clip else clip / norm
    return [weight * v for v in row]


def tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def dense_sum(rows, clip, relation=ADD_REMOVE):
    return clipping.clip_sum([clipping.Term(1.0, clipping.Dense(tensor(rows)), clip)], relation)


# ---------------------------------------------------------------- per-record bound and the sum


@PROPERTY
@given(row=row_sets(max_rows=1).map(lambda rows: rows[0]), clip=clips)
def test_one_record_contributes_at_most_clip(row, clip):
    bounded, dropped = dense_sum([row], clip)
    contribution = bounded.value.tolist()
    assert exact_norm(contribution) <= clip * (1 + 1e-9)
    if not is_finite(row):  # (whether huge finite rows are counted: test_clip_sum_equals_plain_loop)
        assert dropped == 1
        assert contribution == [0.0] * len(row)


@PROPERTY
@given(rows=row_sets(), clip=clips)
def test_clip_sum_equals_plain_loop(rows, clip):
    bounded, dropped = dense_sum(rows, clip)
    d = len(rows[0])
    expected, non_finite = [0.0] * d, 0
    for row in rows:
        if not is_finite(row) or not math.isfinite(exact_norm(row)):  # a norm past float64's range counts
            non_finite += 1                                               # as non-finite (Dense.norms)
            continue
        expected = [e + c for e, c in zip(expected, clip_row(row, clip))]
    assert dropped == non_finite
    # Each summand has norm ≤ C, so the float error of a B-term sum is ≲ B·2⁻⁵²·C per coordinate.
    tol = 1e-12 * clip * len(rows)
    for got, want in zip(bounded.value.tolist(), expected):
        assert abs(got - want) <= tol
    assert bounded.sensitivity == clip


def test_huge_finite_row_is_clipped_not_dropped():
    """A finite row with entries 1e300 has norm √2·1e300 (finite). It must be scaled to norm C,
    not treated as non-finite: ‖v‖² overflows in a naive norm."""
    bounded, dropped = dense_sum([[1e300, 1e300], [3.0, 4.0]], 1.0)
    assert dropped == 0
    expected = [1 / math.sqrt(2) + 0.6, 1 / math.sqrt(2) + 0.8]
    assert bounded.value.tolist() == pytest.approx(expected, rel=1e-12)


def test_tiny_rows_pass_unchanged():
    bounded, dropped = dense_sum([[1e-300, -1e-300], [5e-324, 0.0]], 1.0)
    assert dropped == 0
    assert bounded.value.tolist() == [1e-300 + 5e-324, -1e-300]


def test_non_finite_rows_dropped_and_counted():
    rows = [[math.nan, 1.0], [math.inf, 0.0], [1.0, -math.inf], [3.0, 4.0], [0.0, 0.0]]
    bounded, dropped = dense_sum(rows, 1.0)
    assert dropped == 3
    assert bounded.value.tolist() == pytest.approx([0.6, 0.8], rel=1e-15)


def test_empty_batch_sums_to_zero():
    term = clipping.Term(1.0, clipping.Dense(torch.zeros(0, 4, dtype=torch.float64)), 2.0)
    bounded, dropped = clipping.clip_sum([term], ADD_REMOVE)
    assert dropped == 0
    assert bounded.value.tolist() == [0.0] * 4 and bounded.sensitivity == 2.0


def test_clip_weights_values():
    norms = torch.tensor([0.0, 0.5, 2.0, 4.0, math.inf, math.nan], dtype=torch.float64)
    assert clipping.clip_weights(norms, 2.0).tolist() == [1.0, 1.0, 1.0, 0.5, 0.0, 0.0]
    assert clipping.clip_weights(norms, math.inf).tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_infinite_clip_is_the_plain_sum():
    rows = [[3.0, 4.0], [1e6, -2e6], [0.0, 0.0]]
    bounded, _ = dense_sum(rows, math.inf)
    assert bounded.value.tolist() == [3.0 + 1e6, 4.0 - 2e6]
    assert math.isinf(bounded.sensitivity)


# ---------------------------------------------------------------- sensitivity and relations


@pytest.mark.parametrize(("relation", "factor"), [(ADD_REMOVE, 1.0), (REPLACE_SPECIAL, 1.0), (REPLACE_ONE, 2.0)])
def test_sensitivity_under_each_relation(relation, factor):
    assert clipping.relation_factor(relation) == factor
    bounded, _ = dense_sum([[1.0, 2.0]], 0.3, relation)
    assert bounded.sensitivity == pytest.approx(0.3 * factor, rel=1e-15)
    a = clipping.Dense(tensor([[1.0, 2.0]]))
    two, _ = clipping.clip_sum([clipping.Term(0.25, a, 2.0), clipping.Term(0.75, a, 0.1)], relation)
    assert two.sensitivity == pytest.approx(factor * (0.25 * 2.0 + 0.75 * 0.1), rel=1e-15)


@PROPERTY
@given(
    a_rows=row_sets(no_overflow, max_rows=4),
    data=st.data(),
    gamma=st.floats(min_value=0.0, max_value=1.0),
    clip1=clips,
    clip2=clips,
    relation=st.sampled_from([ADD_REMOVE, REPLACE_ONE]),
)
def test_two_term_combination(a_rows, data, gamma, clip1, clip2, relation):
    """u_i = γ·clip(a_i, C1) + (1−γ)·clip(a_i − b_i, C2): ‖u_i‖ ≤ S = γC1 + (1−γ)C2, the
    sensitivity is S (2S under replace-one) and a record non-finite in either term is dropped."""
    d = len(a_rows[0])
    b_rows = [data.draw(st.lists(no_overflow, min_size=d, max_size=d)) for _ in a_rows]
    a = clipping.Dense(tensor(a_rows))
    b = clipping.Dense(tensor(b_rows))
    diff = a - b
    assert isinstance(diff, clipping.Dense)
    bound = gamma * clip1 + (1 - gamma) * clip2
    terms = [clipping.Term(gamma, a, clip1), clipping.Term(1 - gamma, diff, clip2)]
    bounded, dropped = clipping.clip_sum(terms, relation)
    assert bounded.sensitivity == pytest.approx(bound * clipping.relation_factor(relation), rel=1e-15)
    expected, non_finite = [0.0] * d, 0
    for row_a, row_diff in zip(a_rows, diff.rows.tolist()):
        if not (is_finite(row_a) and is_finite(row_diff)):
            non_finite += 1
            continue
        u = [gamma * x + (1 - gamma) * y for x, y in zip(clip_row(row_a, clip1), clip_row(row_diff, clip2))]
        assert exact_norm(u) <= bound * (1 + 1e-9)
        expected = [e + v for e, v in zip(expected, u)]
    assert dropped == non_finite
    tol = 1e-12 * max(clip1, clip2) * len(a_rows)
    for got, want in zip(bounded.value.tolist(), expected):
        assert abs(got - want) <= tol
    # One record at a time: its contribution obeys the bound (whatever is dropped contributes 0).
    for i in range(len(a_rows)):
        one = [clipping.Term(gamma, clipping.Dense(a.rows[i:i + 1]), clip1),
               clipping.Term(1 - gamma, clipping.Dense(diff.rows[i:i + 1]), clip2)]
        single, _ = clipping.clip_sum(one, relation)
        assert exact_norm(single.value.tolist()) <= bound * (1 + 1e-9)


def test_zero_weight_term_with_infinite_clip_has_finite_sensitivity():
    """γ = 1 (allowed by DP-SRM) with C2 = ∞: the second term has scale 0, so S = γ·C1 = C1.
    0·∞ must not turn the sensitivity into NaN."""
    a = clipping.Dense(tensor([[3.0, 4.0]]))
    bounded, _ = clipping.clip_sum([clipping.Term(1.0, a, 1.0), clipping.Term(0.0, a, math.inf)], ADD_REMOVE)
    assert bounded.sensitivity == 1.0
    assert bounded.value.tolist() == pytest.approx([0.6, 0.8], rel=1e-15)


# ---------------------------------------------------------------- LinearRows (the GLM fast path)

#: GLM-like magnitudes. No values below 1e-100: their squares underflow in any norm, the
#: dense reference's included.
moderate = st.floats(min_value=-1e3, max_value=1e3).map(lambda v: v if abs(v) > 1e-100 else 0.0)


@st.composite
def linear_rows(draw, d=None, b=None):
    d = d or draw(st.integers(1, 5))
    b = b or draw(st.integers(1, 6))
    X = tensor([draw(st.lists(moderate, min_size=d, max_size=d)) for _ in range(b)])
    coef = tensor(draw(st.lists(moderate, min_size=b, max_size=b)))
    shift = tensor(draw(st.lists(moderate, min_size=d, max_size=d)))
    return LinearRows(X, X.norm(dim=1), coef, shift)


def scale_of(rows: LinearRows) -> torch.Tensor:
    """|c_i|·‖x_i‖ + ‖s‖: the size of the summands in row i."""
    return rows.coef.abs() * rows.A.norm(dim=1) + rows.shift.norm()


@PROPERTY
@given(rows=linear_rows())
def test_linear_rows_norms_match_dense(rows):
    dense = rows.dense()
    want = dense.norm(dim=1)
    got = rows.norms()
    assert torch.all((got - want).abs() <= 1e-10 * want), (got, want)


@PROPERTY
@given(rows=linear_rows(), data=st.data())
def test_linear_rows_weighted_sum_matches_dense(rows, data):
    b = rows.coef.shape[0]
    weights = tensor(data.draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 1.0)), min_size=b, max_size=b)))
    got = rows.weighted_sum(weights)
    want = weights @ rows.dense()
    # Both are sums of the same b·(d+1) products; relative to Σ_i w_i(|c_i|‖x_i‖ + ‖s‖).
    tol = 1e-10 * float(weights @ scale_of(rows)) + 1e-300
    assert float((got - want).norm()) <= tol


@PROPERTY
@given(d=st.integers(1, 5), b=st.integers(1, 6), data=st.data())
def test_linear_rows_difference_matches_dense_difference(d, b, data):
    first = data.draw(linear_rows(d=d, b=b))
    second = LinearRows(first.A, first.a_norms,
                        tensor(data.draw(st.lists(moderate, min_size=b, max_size=b))),
                        tensor(data.draw(st.lists(moderate, min_size=d, max_size=d))))
    diff = first - second
    assert torch.equal(diff.A, first.A) and torch.equal(diff.a_norms, first.a_norms)
    want = first.dense() - second.dense()
    scale = float((scale_of(first) + scale_of(second)).max())
    assert float((diff.dense() - want).abs().max()) <= 1e-12 * scale
    weights = torch.linspace(0, 1, b, dtype=torch.float64)
    assert float((diff.weighted_sum(weights) - weights @ want).norm()) <= 1e-10 * b * scale


@PROPERTY
@given(rows=linear_rows(), clip=clips)
def test_linear_rows_clipped_record_within_clip(rows, clip):
    for i in range(rows.coef.shape[0]):
        one = LinearRows(rows.A[i:i + 1], rows.a_norms[i:i + 1], rows.coef[i:i + 1], rows.shift)
        bounded, dropped = clipping.clip_sum([clipping.Term(1.0, one, clip)], ADD_REMOVE)
        assert dropped == 0
        assert exact_norm(bounded.value.tolist()) <= clip * (1 + 1e-9)


@pytest.mark.parametrize("magnitude", [1e4, 1e8])
def test_linear_rows_clip_bound_under_cancellation(magnitude):
    """Row c·x + s with c·x ≈ −s of size ``magnitude`` and true norm 2 > C = 1: the clipped
    contribution must still have norm ≤ C. Expanding ‖c x + s‖² = c²‖x‖² + 2c⟨x,s⟩ + ‖s‖²
    cancels catastrophically (absolute error ~ 2⁻⁵²·magnitude²), so the clip weight can be far off.

    Allowed: C(1 + 1e-9) plus the rounding of the lazy sum w·(Xᵀc) + w·s itself, which no O(Bd)
    lazy form avoids: ≤ 4·2⁻⁵²·w·(|c|‖x‖ + ‖s‖) with w = C/‖row‖ (two rounded products per
    coordinate, summed)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        x = magnitude * torch.randn(1, 5, generator=gen, dtype=torch.float64)
        r = torch.randn(5, generator=gen, dtype=torch.float64)
        shift = -x[0] + 2 * r / r.norm()
        rows = LinearRows(x, x.norm(dim=1), torch.ones(1, dtype=torch.float64), shift)
        true_norm = float(rows.dense().norm())
        assert true_norm == pytest.approx(2.0, rel=1e-6)
        bounded, _ = clipping.clip_sum([clipping.Term(1.0, rows, 1.0)], ADD_REMOVE)
        rounding = 4 * 2.0**-52 * (1.0 / true_norm) * float(x.norm() + shift.norm())
        assert exact_norm(bounded.value.tolist()) <= 1.0 * (1 + 1e-9) + rounding


def test_linear_rows_non_finite_coef_dropped_and_zero_weight_safe():
    X = tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    rows = LinearRows(X, X.norm(dim=1), tensor([math.nan, 1.0, math.inf]), tensor([0.0, 0.0]))
    bounded, dropped = clipping.clip_sum([clipping.Term(1.0, rows, 10.0)], ADD_REMOVE)
    assert dropped == 2
    assert bounded.value.tolist() == [0.0, 2.0]
    assert rows.weighted_sum(tensor([0.0, 0.5, 0.0])).tolist() == [0.0, 1.0]


def synthetic(n: int = 60, d: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    return X, y, gen


@pytest.mark.parametrize("model", [glm.Logistic, glm.NonconvexLogistic, glm.Ridge])
def test_glm_rows_and_differences_match_dense(model):
    """The oracle's lazy rows and their differences (DP-SRM's second term) against dense rows."""
    X, y, gen = synthetic()
    oracle = model(X, y, reg=0.3)
    idx = torch.tensor([0, 5, 7, 7, 59])
    for _ in range(5):
        theta = 2 * torch.randn(5, generator=gen, dtype=torch.float64)
        theta_prev = theta + 0.01 * torch.randn(5, generator=gen, dtype=torch.float64)
        now, before = oracle.per_record(theta, idx), oracle.per_record(theta_prev, idx)
        weights = torch.rand(len(idx), generator=gen, dtype=torch.float64)
        for lazy, dense in ((now, now.dense()), (now - before, now.dense() - before.dense())):
            want = dense.norm(dim=1)
            assert torch.allclose(lazy.norms(), want, rtol=1e-10, atol=0)
            want_sum = weights @ dense
            assert float((lazy.weighted_sum(weights) - want_sum).norm()) <= 1e-10 * float(weights @ want)
            got, _ = clipping.clip_sum([clipping.Term(1.0, lazy, 0.05)], ADD_REMOVE)
            ref, _ = clipping.clip_sum([clipping.Term(1.0, clipping.Dense(dense), 0.05)], ADD_REMOVE)
            assert torch.allclose(got.value, ref.value, rtol=1e-10, atol=1e-14)
        two_lazy, _ = clipping.clip_sum([clipping.Term(0.1, now, 1.0), clipping.Term(0.9, now - before, 0.01)],
                                        ADD_REMOVE)
        two_dense, _ = clipping.clip_sum([clipping.Term(0.1, clipping.Dense(now.dense()), 1.0),
                                          clipping.Term(0.9, clipping.Dense(now.dense() - before.dense()), 0.01)],
                                         ADD_REMOVE)
        assert torch.allclose(two_lazy.value, two_dense.value, rtol=1e-10, atol=1e-14)


def test_float32_rows_are_measured_in_float64_and_weights_round_toward_zero():
    """A float32 row whose float32 sum of squares comes out low must still be clipped to ≤ C:
    norms are float64, and the float64 weight cast to float32 is rounded toward zero."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 3_000_000, generator=gen, dtype=torch.float32) * 1e-3
    exact = rows.double().norm(dim=1)
    dense = clipping.Dense(rows)
    assert dense.norms().dtype == torch.float64
    assert torch.allclose(dense.norms(), exact, rtol=1e-12, atol=0)
    clip = float(exact.min()) / 2
    bounded, _ = clipping.clip_sum([clipping.Term(1.0, clipping.Dense(rows[:1]), clip)],
                                   NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert float(bounded.value.double().norm()) <= clip * (1 + 1e-6)  # float32 products/sum rounding only
    weights = torch.tensor([1 / 3, 2 / 3, 0.1], dtype=torch.float64)
    cast = clipping.weights_in(weights, torch.float32)
    assert cast.dtype == torch.float32 and torch.all(cast.double() <= weights)
    assert torch.all(weights - cast.double() < 1e-7)
