"""ScatterNet + linear's DP-SGD step (one position: a record's features into a linear layer) with each
record's squared input norm kept by record against that norm computed again in every step, side by
side in one process.

Setting: the ``scatternet:mnist`` problem's model and chunk on synthetic features of its shape (no
data needed: the step's cost does not depend on the values): ``make_model("linear", seed=0,
inputs=3969)`` (10 classes), each record 3,969 float32 random features, cross-entropy,
``TorchModel(..., microbatch_size=1024)`` as the preset runs it, ``train.step`` of ``DPSGD`` with
Poisson batches of expected size 4,096 (lr 8, C = 0.1, z = 1), one torch thread.

Contenders (interleaved rounds in a rotated order), the same engine but for where the layer's norm
bound ``‖a_i‖²·‖g_i‖²`` takes ``‖a_i‖²`` (:func:`dpopt.oracles.ghost.rounding.sq_rows`) from:

* ``computed each step``: from the gathered chunk, a pass over its records every step
  (:func:`dpopt.oracles.ghost.grams.kept_norms` replaced by a rule that keeps none, inside the
  timer's calls);
* ``kept by record``: formed the first time a record is drawn and looked up afterwards
  (:class:`dpopt.oracles.ghost.InputGrams`), the same float64 numbers bit for bit.

The warm-up steps draw all but 0.7 % of the records on average ((1 − 4,096/12,000)¹²), so the timed
steps look nearly every norm up, as all but a run's first steps do.

Target: computed / kept ≥ 1.1× per step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (Stepper, interleaved, load_sentence, measured_in_child, other_processes_share,  # noqa: E402
                     patched, ratio_table, script, summary)

TITLE = "ScatterNet + linear's step: each record's squared input norm kept vs computed every step"
THREADS, FEATURES, CLASSES = 1, 3969, 10
RECORDS, BATCH, CHUNK, STEPS_PER_ROUND, WARM_STEPS = 12_000, 4096, 1024, 4, 12
TARGET = 1.1
COMPUTED, KEPT = "computed each step", "kept by record"


def measure(quick: bool) -> dict[str, Any]:
    from dpopt.algorithms import DPSGD
    from dpopt.models import cross_entropy, make_model
    from dpopt.oracles import TorchModel
    from dpopt.oracles.ghost import grams

    torch.set_num_threads(THREADS)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(RECORDS, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (RECORDS,), generator=gen)
    dpsgd = DPSGD(lr=8.0, clip=0.1, noise_multiplier=1.0, batch_size=BATCH)
    def contender(rule: Any) -> Any:
        stepper = Stepper(dpsgd, TorchModel(make_model("linear", seed=0, inputs=FEATURES), cross_entropy, X, y,
                                            microbatch_size=CHUNK), STEPS_PER_ROUND)
        timed = patched(stepper, (grams, "kept_norms", rule))
        timed(WARM_STEPS)  # nearly every record drawn (each step draws a third of them)
        return timed

    contenders = {COMPUTED: contender(lambda layer: False), KEPT: contender(grams.kept_norms)}
    repeats, budget = ((2, 2), 0.0) if quick else ((8, 16), 40.0)
    results, others = other_processes_share(lambda: interleaved(contenders, repeats, budget, warm=False))
    return {"results": results, "others": others}


def report(data: dict[str, Any], how: str) -> dict[str, Any]:
    results = data["results"]
    stats = {name: summary(rows) for name, rows in results.items()}
    ratio = stats[COMPUTED]["median"] / stats[KEPT]["median"]
    passed = ratio >= TARGET
    busy = load_sentence(data["others"], "the ratio, measured side by side, is the meaningful number")
    missed = (1 - BATCH / RECORDS) ** WARM_STEPS  # a record's chance of not being drawn in the warm-up
    md = [f"Records of {FEATURES:,} float32 features (random), {CLASSES} classes, `make_model(\"linear\")`, "
          f"cross-entropy; DP-SGD, Poisson batches of expected size {BATCH:,} from {RECORDS:,} records (each drawn "
          f"in the {WARM_STEPS} warm-up steps but for {missed:.1%} of them, on average), chunks of {CHUNK:,} "
          f"records (the preset's), {THREADS} thread. "
          f"{len(results[KEPT])} interleaved rounds of {STEPS_PER_ROUND} steps per contender, in a child process "
          f"with {how}. {busy}", "", *ratio_table(stats, COMPUTED, ("median s/step", "computed / kept"), digits=4)]
    md += ["", f"**computed / kept, ScatterNet step = {ratio:.2f}×**. Target ≥ {TARGET}×: "
               f"**{'PASS' if passed else 'FAIL'}**."]
    check = {"name": "computed / kept squared input norms, ScatterNet step (T = 1, p = 3,969, q = 10)",
             "value": ratio, "target": f"≥ {TARGET}×", "passed": passed}
    return {"title": TITLE, "markdown": "\n".join(md), "checks": [check], "data": {"stats": stats}}


run = measured_in_child(__file__, report)


if __name__ == "__main__":
    script(measure, run)
