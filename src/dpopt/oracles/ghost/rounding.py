"""Upper bounds, in float64, of the squared norms the ghost engine clips with, and their rounding.

Rounding: a norm is never below the norm of what the sum adds for that record. Clipping
scales record i by ``C / ‖∇ℓ_i‖``; the sum then adds the record's *computed* contribution, so
``norms()`` returns, in float64, an upper bound of the norm of that computed contribution per
unit weight (:meth:`~.rows.GhostRows.norms`), and no clipped record adds more than C, in float32 as
in float64. Per layer: squared norms are accumulated in float64 (:func:`sq_rows`, from
partial norms of 32 entries; Gram matrices in float64, :func:`gram_sq_norms`) and enlarged by
the rounding bounds of those sums (Higham's γ_n = n·u/(1 − n·u), u the unit roundoff, which
hold whatever order BLAS or oneDNN sum in), then by the rounding of the layer's products in
the sum: ``(1 + u)²`` for one product per entry (``fl(fl(w·g)·a)``, or ``w·rows``), plus
``γ_{T+3}·Σ_t ‖a_t‖‖g_t‖`` where a record's entry is a sum over T positions (the Gram form:
the backward product or the rows are formed from ``a`` and ``g`` in the module's precision).
In float32 the bounds are a few 1e−6 above the norms (3e−6 on the MNIST CNN, 2e−6 for its
differences of two points); in float64, ≲ 1e−12. A record whose Gram terms cancel (its
gradient far smaller than ``Σ_t ‖a_t‖‖g_t‖``) gets a bound further above its norm (by
γ_{T+3}·Σ_t ‖a_t‖‖g_t‖, the rounding its sum may have): conservative, never below. Each layer
gives the squared bounds (``sq_bounds``), which are added over the layers, and a record's norm
is one square root at the end; the final enlargement in :attr:`~.rows.GhostRows._norms` covers those
float64 products, sums and that root.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Unit roundoff of float64, the precision every norm is accumulated in.
U64 = torch.finfo(torch.float64).eps / 2

#: Entries per partial norm of rows in a precision below float64 (:func:`sq_rows`).
PARTIAL = 32


def unit(dtype: torch.dtype) -> float:
    """The unit roundoff u of ``dtype`` (half its machine epsilon)."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, u: float) -> float:
    """Higham's γ_n = n·u / (1 − n·u): a sum or dot product of n terms computed in precision u, in
    any order, is off by at most γ_{n} times the sum of the terms' magnitudes ("Accuracy and
    Stability of Numerical Algorithms", §3.1). ``value·(1 + 2γ_n)`` bounds a true value from
    above when the computed one is at least ``(1 − γ_n)`` times it (γ_n ≤ 1/2)."""
    return n * u / (1 - n * u)


def sq_rows(rows: Tensor) -> Tensor:
    """An upper bound, in float64, of ``‖row‖²`` for each row of ``[R, n]``: :func:`sq_of_runs` of
    :func:`run_norms`.

    float64 rows: one fused reduction (2.5× faster on CPU than ``square().sum(1)``, which
    writes the squares out first), enlarged by its rounding bound. Lower precisions: norms of
    runs of :data:`PARTIAL` entries, in float32 at least (relative error γ_{PARTIAL+3}), squared
    and added in float64 (a float32 square is exact there), enlarged by both bounds (4e−6 in
    float32): one float32 reduction over the whole row could be n·2⁻²⁴ off (3.6e−4 of a
    10⁷-entry norm, measured), a float64 one over float32 data is 6× slower."""
    return sq_of_runs(run_norms(rows), rows.shape[1], rows.dtype)


def run_norms(rows: Tensor) -> Tensor:
    """Norms ``[R, runs]`` of the runs of :data:`PARTIAL` entries of each row of ``rows [R, n]`` (and
    of the shorter last run), in float32 at least; in float64, of the whole row (one run)."""
    R, n = rows.shape
    if rows.dtype == torch.float64:
        return torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    acc = torch.promote_types(rows.dtype, torch.float32)
    body = n - n % PARTIAL
    runs = [torch.linalg.vector_norm(rows[:, :body].reshape(R, body // PARTIAL, PARTIAL), dim=2, dtype=acc)
            ] if body else []
    if body < n or not body:
        runs.append(torch.linalg.vector_norm(rows[:, body:], dim=1, keepdim=True, dtype=acc))
    return runs[0] if len(runs) == 1 else torch.cat(runs, dim=1)


def sq_of_runs(runs: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    """The bound of :func:`sq_rows` from the run norms of rows of n entries of ``dtype``: their
    squares added by one float64 norm, squared (squares of float32 numbers are exact in float64;
    at most n/32 + 2 roundings, within γ_{n+4}), enlarged by that and by the runs' own rounding.
    One run (a float64 row's norm, or a short row) is squared alone: the same value, one operation
    fewer (DIFF2's rounds make several such calls on their full batch)."""
    sq = (runs[:, 0].double().square() if runs.shape[1] == 1
          else torch.linalg.vector_norm(runs, dim=1, dtype=torch.float64).square())
    if dtype == torch.float64:
        return sq * (1 + 2 * gamma(n + 4, U64))
    acc = torch.promote_types(dtype, torch.float32)
    return sq * (1 + 2 * gamma(min(n, PARTIAL) + 3, unit(acc)) + 2 * gamma(n + 4, U64))


#: Bytes of float64 copies of the positions' inputs (or output gradients) that :func:`gram_sq_norms`
#: forms at once: a few records' worth, whose Gram matrices are formed while the copies are in cache.
GRAM_BYTES = 2**20


def gram_sq_norms(pairs: list[tuple[Tensor, Tensor]], inputs: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Upper bounds, in float64, of ``‖Σ_k Σ_t G^k_t A^k_tᵀ‖²`` per row from Gram matrices, for
    pairs ``A^k [R, T, p]``, ``G^k [R, T, q]``: ``Σ_{k,l} ⟨A^k A^lᵀ, G^k G^lᵀ⟩``, and of
    ``(Σ_k Σ_t ‖A^k_t‖‖G^k_t‖)²``, which bounds the magnitude of every term. ``inputs``: the
    first pair's ``A¹A¹ᵀ`` where it is known already (:func:`record_grams`, exact float64 Gram
    matrices of the same numbers, within the same rounding bound), else formed here.

    The Gram matrices are formed in float64 (a float32 entry ``⟨a_s, a_t⟩`` could be off by
    p·2⁻²⁴·‖a_s‖‖a_t‖, i.e. the norm of a conv layer with T positions by ~T·p·2⁻²⁴: 4e−4 for the
    MNIST CNN's second layer), from float64 copies of a few rows at a time (:func:`_gram`), and the
    result is enlarged by its rounding bound γ_{p+q+(KT)²}·bound: exact up to ~1e−12 unless the
    terms cancel, never too small."""
    sq = bound = pairs[0][0].new_zeros(pairs[0][0].shape[0], dtype=torch.float64)
    for k, (A, G) in enumerate(pairs):
        for A2, G2 in pairs[k:]:
            AA = inputs if inputs is not None and k == 0 and A2 is A else _gram(A, A2)
            GG = _gram(G, G2)
            term = (AA * GG).sum((1, 2))
            if A2 is A:  # ‖A_t‖², ‖G_t‖² are the diagonals of the Gram matrices (no second pass over A)
                sq = sq + term
                bound = bound + (AA.diagonal(dim1=1, dim2=2) * GG.diagonal(dim1=1, dim2=2)).sqrt().sum(1)
            else:
                sq = sq + 2 * term
    (_, T, p), q, K = pairs[0][0].shape, pairs[0][1].shape[2], len(pairs)
    bound = bound.square() * (1 + 2 * gamma(p + q + K * T + 8, U64))
    return sq + gamma(p + q + (K * T) ** 2 + 8, U64) * bound, bound


def _gram(X: Tensor, Y: Tensor) -> Tensor:
    """``X Yᵀ`` per row in float64, ``[R, T, T]``, for ``X``, ``Y [R, T, n]``. Rows in a precision
    below float64 are copied to float64 (exactly) :data:`GRAM_BYTES` at a time: each entry is still
    a float64 dot product of the same n exact terms, within the same rounding bound, whatever the
    chunk, and the copies are read back from cache (augmentation multiplicity's views, T = 5,
    n = 3,969, float32, 128 rows, one thread: 6 ms for :func:`gram_sq_norms` in 1 MiB copies,
    against 25 ms or more from one copy of all rows). A product of scalars when T = 1 and the rows
    have one entry (a one-output layer's g: a batched 1×1 matmul costs 4× more on CPU)."""
    R, T, n = X.shape
    step = R if X.dtype == Y.dtype == torch.float64 else max(1, GRAM_BYTES // (8 * T * n))
    if step >= R:
        X, Y = X.double(), Y.double()  # exact casts
        return X * Y if X.shape[1:] == (1, 1) else X @ Y.mT
    out = X.new_empty(R, T, T, dtype=torch.float64)
    for start in range(0, R, step):
        x = X[start:start + step].double()
        torch.bmm(x, x.mT if Y is X else Y[start:start + step].double().mT, out=out[start:start + step])
    return out


def record_grams(A: Tensor) -> Tensor:
    """``A_i A_iᵀ`` ``[R, T, T]`` in float64 for ``A [R, T, n]``, each record's the same bits wherever it
    stands in ``A``: :func:`_gram`'s products of exact float64 copies, :data:`GRAM_BYTES` at a time,
    with every record's copy starting at a multiple of 64 bytes from the (so aligned) buffer's start.
    A BLAS product's rounding may depend on where its operands lie: in :func:`_gram`'s copies the
    k-th record of 5 × 3,969 float64 numbers starts 158,760·k bytes from the start, 40·k mod 64
    bytes off a 64-byte boundary, and there (MKL, one thread) about half of the records got Gram
    matrices whose low bits differ from those of the same record alone. So :func:`_gram`'s
    matrices of a record depend on its place in the batch; these do not, and can be kept per
    record and reused (:class:`~.grams.InputGrams`)."""
    R, T, n = A.shape
    stride = -(-T * n // 8) * 8  # float64 numbers per record's copy: a multiple of 64 bytes
    step = max(1, min(R, GRAM_BYTES // (8 * stride)))
    out = A.new_empty(R, T, T, dtype=torch.float64)
    copies = A.new_empty(step, stride, dtype=torch.float64)
    for start in range(0, R, step):
        n_rows = min(step, R - start)
        x = copies[:n_rows].as_strided((n_rows, T, n), (stride, n, 1))
        x.copy_(A[start:start + n_rows])
        torch.bmm(x, x.mT, out=out[start:start + n_rows])
    return out


def gram_bounds(pairs: list[tuple[Tensor, Tensor]], B: int, groups: int, T: int, dtype: torch.dtype,
                inputs: Tensor | None = None) -> Tensor:
    """Upper bounds of the norms of the records' contributions of a layer in the Gram form, whose
    weight gradient ``Σ_k Σ_t G^k_t A^k_tᵀ`` is summed by backward products in ``dtype`` (one per
    pair, added up): the float64 Gram norm times ``(1 + u)²``, plus the products' rounding,
    γ_{T+3}·Σ_k Σ_t ‖A^k_t‖‖G^k_t‖ (per conv group; ``pairs`` hold ``[B·groups, T, ·]``; ``inputs``
    as for :func:`gram_sq_norms`)."""
    sq, bound = (part.view(B, groups).sum(1) for part in gram_sq_norms(pairs, inputs))
    u = unit(dtype)
    return (1 + u) ** 2 * sq.sqrt() + gamma(T + 3, u) * bound.sqrt()
