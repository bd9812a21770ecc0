"""Augmentation multiplicity's DP-SGD step (five views of each record through one linear layer):
the step of today against the step as it was before the Gram form, the input Gram matrices kept by
record, the reused gather buffers and the records read in place, side by side in one process.

Setting: the ``scatternet-views:mnist`` problem's model and chunk on synthetic features of its shape
(no data needed: the step's cost does not depend on the values): ``make_model("linear", seed=0,
inputs=3969)`` (10 classes), each record ``[5, 3969]`` float32 random features (its five views),
the loss the mean of the views' cross-entropies (:func:`dpopt.augmentation.mean_over_views`),
``TorchModel(..., microbatch_size=512)`` as the preset runs it, ``train.step`` of ``DPSGD`` with
Poisson batches of expected size 4,096 (lr 8, C = 0.1, z = 1), one torch thread.

Contenders (interleaved: one warm-up each, then rounds in a rotated order), the same engine but for
the two parts that changed (T = 5 positions, p = 3,969 inputs, q = 10 outputs):

* ``previous step (direct form, fresh gathers)``: inside the timer's calls,
  :func:`dpopt.oracles.ghost.layers.use_gram` is replaced by the rule it had before
  (:func:`previous_use_gram`), which builds the records' gradient rows ``[B, 39,690]``, takes their
  norms and sums them (no input Gram matrix kept: :func:`previous_kept_shape` under that rule),
  and ``Tensors.gather`` by its previous body (:func:`previous_gather`: a new
  ``X[indices]`` for every chunk, whose first writes to new memory fault its pages in).
* ``this step (Gram form, input Grams kept, reused buffers)``: the engine as it is: the per-record
  5 × 5 Gram matrices of the views' output gradients in float64, with those of the views' inputs
  (the data itself, a function of the record alone) formed the first time a record is drawn and
  kept by the oracle by record index (:class:`dpopt.oracles.ghost.InputGrams`), and the records read
  in place (:mod:`dpopt.oracles.ghost.in_place`): the forward and the sum read each chunk's records
  from the records' tensor 2 MiB at a time into one reused buffer, the chunk never gathered whole.

More views (nine: ``MORE_VIEWS``), the same step side by side as the engine chose before and now:

* ``nine views, before (direct form, records gathered)``: inside the timer's calls,
  :func:`dpopt.oracles.ghost.grams.kept_shape` is replaced by its previous rule
  (:func:`previous_kept_shape`: input Gram matrices kept only where ``use_gram``'s cost comparison,
  which prices them formed at every step, chose the Gram form, and T² ≤ 64), so the layer of nine
  views took the direct form and its records were gathered.
* ``nine views, this (Gram form, input Grams kept, read in place)``: the engine as it is.

Also timed: the ghost engine's own work in a step, the norms and the clipped sum of one batch of
4,096 records (the records' gather or first read, forward and backward, and the look-up of the kept
input Gram matrices, outside the timer; the sum's read of the records in place, inside), with each
rule.

Targets: previous / this ≥ 3× per step at five views; before / this ≥ 1.5× at nine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (Stepper, interleaved, load_sentence, measured_in_child, other_processes_share,  # noqa: E402
                     patched, ratio_table, script, summary)

TITLE = "Augmentation multiplicity's step (5 views, linear layer): today's step vs the previous"
THREADS, VIEWS, FEATURES, CLASSES = 1, 5, 3969, 10
RECORDS, BATCH, CHUNK, STEPS_PER_ROUND = 4608, 4096, 512, 2
TARGET, MORE_VIEWS, MORE_TARGET = 3.0, 9, 1.5
PREVIOUS, THIS = "previous step (direct form, fresh gathers)", "this step (Gram form, input Grams kept, reused buffers)"
BEFORE_MORE = f"{MORE_VIEWS} views, before (direct form, records gathered)"
THIS_MORE = f"{MORE_VIEWS} views, this (Gram form, input Grams kept, read in place)"


def previous_use_gram(T: int, p: int, q: int, itemsize: int = 8) -> bool:
    """The rule before the chunked Gram form: Gram matrices iff 2T² < p·q and, below float64, the
    rows (p·q numbers of ``itemsize`` bytes) would take more memory than float64 copies of the
    inputs and output gradients, T·(p + q) numbers."""
    return 2 * T * T < p * q and (itemsize >= 8 or 8 * T * (p + q) < p * q * itemsize)


def previous_kept_shape(T: int, p: int, q: int, itemsize: int) -> bool:
    """The rule before the kept matrices decided the form: kept only where :func:`use_gram`'s cost
    comparison chose the Gram form, at most 64 entries a record."""
    from dpopt.oracles.ghost import layers

    return 1 < T and T * T <= 64 and 8 * T <= p * itemsize and layers.use_gram(T, p, q, itemsize)


def previous_gather(self: Any, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Tensors.gather`` before the reused buffers: a fresh copy of the chunk's records."""
    indices = indices.to(self.X.device)
    return self.X[indices], self.y[indices]


def measure(quick: bool) -> dict[str, Any]:
    from dpopt.algorithms import DPSGD
    from dpopt.augmentation import mean_over_views
    from dpopt.models import cross_entropy, make_model
    from dpopt.oracles import TorchModel, records
    from dpopt.oracles.ghost import grams, in_place, layers

    torch.set_num_threads(THREADS)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(RECORDS, VIEWS, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (RECORDS,), generator=gen)
    dpsgd = DPSGD(lr=8.0, clip=0.1, noise_multiplier=1.0, batch_size=BATCH)

    def stepper(X: torch.Tensor = X) -> Stepper:
        oracle = TorchModel(make_model("linear", seed=0, inputs=FEATURES), mean_over_views(cross_entropy), X, y,
                            microbatch_size=CHUNK)
        return Stepper(dpsgd, oracle, STEPS_PER_ROUND)

    def ghost_work() -> Callable[[], dict[str, float]]:
        """The engine's norms and sum of one batch of BATCH records (its forward and backward, and
        the gather or first read of the records, outside the timer)."""
        oracle = TorchModel(make_model("linear", seed=0, inputs=FEATURES), mean_over_views(cross_entropy), X, y,
                            microbatch_size=CHUNK)
        theta, batches = oracle.flat_params().double(), torch.Generator().manual_seed(1)

        def timed() -> dict[str, float]:  # other records each call, as in a step (the input Grams kept, as there)
            rows = oracle.per_record(theta, torch.randperm(RECORDS, generator=batches)[:BATCH].sort().values)
            start = time.perf_counter()
            rows.weighted_sum(torch.minimum(torch.ones(BATCH, dtype=torch.float64), 0.1 / rows.norms()))
            return {"seconds": time.perf_counter() - start, "batch": float(BATCH)}
        return timed

    repeats, budget = ((2, 2), 0.0) if quick else ((6, 12), 60.0)
    # the rule of kept input matrices before, under its two names (the grams module's, the in-place reader's)
    kept_before = ((grams, "kept_shape", previous_kept_shape), (in_place, "kept_shape", previous_kept_shape))
    results, others = {}, {}
    for what, make in (("step", stepper), ("ghost", ghost_work)):
        previous = patched(make(), (layers, "use_gram", previous_use_gram),
                           (records.Tensors, "gather", previous_gather), *kept_before)
        contenders = {PREVIOUS: previous, THIS: make()}
        results[what], others[what] = other_processes_share(lambda: interleaved(contenders, repeats, budget))
    more = torch.randn(RECORDS, MORE_VIEWS, FEATURES, generator=gen)
    contenders = {BEFORE_MORE: patched(stepper(more), *kept_before), THIS_MORE: stepper(more)}
    results["more"], others["more"] = other_processes_share(lambda: interleaved(contenders, repeats, budget))
    return {"results": results, "others": max(others.values())}


def report(data: dict[str, Any], how: str) -> dict[str, Any]:
    results = data["results"]["step"]
    stats = {name: summary(rows) for name, rows in results.items()}
    ghost = {name: summary(rows) for name, rows in data["results"]["ghost"].items()}
    ratio = stats[PREVIOUS]["median"] / stats[THIS]["median"]
    passed = ratio >= TARGET
    busy = load_sentence(data["others"], "the ratio, measured side by side, is the meaningful number")
    md = [f"Records of {VIEWS} views × {FEATURES:,} float32 features (random), {CLASSES} classes, "
          f"`make_model(\"linear\")`, the mean of the views' cross-entropies; DP-SGD, Poisson batches of expected "
          f"size {BATCH:,} from {RECORDS:,} records, chunks of {CHUNK} records (the preset's), {THREADS} thread. "
          f"{len(results[THIS])} interleaved rounds of {STEPS_PER_ROUND} steps per contender, in a child process "
          f"with {how}. {busy}", "", *ratio_table(stats, PREVIOUS, ("median s/step", "previous / this"))]
    md += ["", f"The ghost engine's own work in that step (the norms and the clipped sum of {BATCH:,} records, "
               "their gather, forward and backward not timed), same rounds:", "",
           *ratio_table(ghost, PREVIOUS, ("median s", "previous / this"))]
    md += ["", f"**previous / this step, views = {ratio:.2f}×**. Target ≥ {TARGET}×: "
               f"**{'PASS' if passed else 'FAIL'}**."]
    more = {name: summary(rows) for name, rows in data["results"]["more"].items()}
    more_ratio = more[BEFORE_MORE]["median"] / more[THIS_MORE]["median"]
    more_passed = more_ratio >= MORE_TARGET
    per_view = more[THIS_MORE]["median"] / MORE_VIEWS / (stats[THIS]["median"] / VIEWS)
    md += ["", f"{MORE_VIEWS} views of each record (the same records' shape otherwise), the step as the engine chose "
               f"before (input Gram matrices kept only where `use_gram`'s cost rule took the Gram form) and now, "
               "same rounds:", "", *ratio_table(more, BEFORE_MORE, ("median s/step", "before / this")),
           "", f"**before / this step, {MORE_VIEWS} views = {more_ratio:.2f}×** (a view costs {per_view:.2f}× what "
               f"it does at {VIEWS} views). Target ≥ {MORE_TARGET}×: **{'PASS' if more_passed else 'FAIL'}**."]
    checks = [{"name": "previous / this step, views (T = 5, p = 3,969, q = 10)", "value": ratio,
               "target": f"≥ {TARGET}×", "passed": passed},
              {"name": f"before / this step, {MORE_VIEWS} views (p = 3,969, q = 10)", "value": more_ratio,
               "target": f"≥ {MORE_TARGET}×", "passed": more_passed}]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks,
            "data": {"stats": stats, "more views": more}}


run = measured_in_child(__file__, report)


if __name__ == "__main__":
    script(measure, run)
