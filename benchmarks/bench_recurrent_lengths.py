"""The LSTM text classifier of docs/python-api.md with and without ``lengths=``, side by side in one process.

Setting: the example of docs/python-api.md ("Recurrent models and dpopt.fix"): 768 records of 8 tokens,
``nn.Embedding(20, 16)`` → ``dpopt.nn.LSTM(16, 16, batch_first=True)`` → ``nn.Linear(16, 2)`` on
``h_n[-1]``, cross-entropy per record, float32, CPU, one torch thread, ``dpopt.Private`` with
Poisson batches of expected size 64 and ``torch.optim.Adam``, the ghost engine. The noise
multiplier is fixed (1.0: no calibration, which the step's time does not depend on). The three
runs go side by side, one step of each in turn (rotated order), each step timed on its own (its
batch's draw, ``private.backward()``, ``adam.step()``), so that all three see the same load of the
machine; after a warm-up of 5 steps each, ``STEPS`` steps each (``QUICK_STEPS`` with ``--quick``):

* ``without lengths``: the forward as it was before lengths existed, ``self.lstm(x)``;
* ``lengths=``: the README's forward now, ``self.lstm(x, lengths=(tokens != 0).sum(1))`` (every
  record has 8 real steps here: the same numbers, plus the gathers and masks of the lengths);
* ``lengths=, 3 to 8 real steps``: the same records with a random 0 to 5 last tokens set to the
  padding 0 (a reference: the same work per step).

Target: lengths= / without lengths ≤ 1.2 (per step).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import at_most, load_sentence, other_processes_share  # noqa: E402

TITLE = "dpopt.nn.LSTM with lengths= vs without, the README's text classifier (DP-SGD, ghost engine)"
THREADS = 1
BATCH = 64
WARMUP, STEPS, QUICK_STEPS = 5, 300, 60
TARGET = 1.2

WITHOUT = "without lengths"
WITH = "lengths="
VARIABLE = "lengths=, 3 to 8 real steps (reference)"


class TextClassifier(nn.Module):
    """The README's model; ``lengths``: whether its forward passes each record's real steps."""

    def __init__(self, lengths: bool) -> None:
        import dpopt

        super().__init__()
        self.lengths = lengths
        self.embed = nn.Embedding(20, 16)
        self.lstm = dpopt.nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        lengths = (tokens != 0).sum(1) if self.lengths else None
        out, (h_n, c_n) = self.lstm(self.embed(tokens), lengths=lengths)
        return self.head(h_n[-1])


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The README's 768 training records, and the same with a random 0 to 5 last tokens padding."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randint(2, 20, (1024, 8), generator=gen)
    y = torch.randint(0, 2, (1024,), generator=gen)
    X[y == 1, torch.randint(0, 8, (int(y.sum()),), generator=gen)] = 1
    X, y = X[:768], y[:768]
    cut = 8 - torch.randint(0, 6, (768, 1), generator=gen)
    return X, X.masked_fill(torch.arange(8) >= cut, 0), y


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


def timed_steps(lengths: bool, tokens: torch.Tensor, y: torch.Tensor, steps: int) -> Iterator[float]:
    """The seconds of each step of one run of ``steps`` steps (built before the first)."""
    import dpopt

    torch.manual_seed(0)
    model = TextClassifier(lengths)
    algo = dpopt.DPSGD(lr=0.05, clip=1.0, noise_multiplier=1.0, batch_size=BATCH)
    private = dpopt.Private(model, _loss, (tokens, y), algorithm=algo, epsilon=None, delta=1e-5, steps=steps, seed=0)
    adam = torch.optim.Adam(model.parameters(), lr=0.05)
    steps_left = iter(private)
    while True:
        start = time.perf_counter()
        if next(steps_left, None) is None:
            return
        private.backward()
        adam.step()
        yield time.perf_counter() - start


def side_by_side(X: torch.Tensor, padded: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, list[float]]:
    """Each contender's timed steps after the warm-up, one step of each in turn (rotated order)."""
    runs = {name: timed_steps(lengths, tokens, y, WARMUP + steps)
            for name, lengths, tokens in ((WITHOUT, False, X), (WITH, True, X), (VARIABLE, True, padded))}
    names, seconds = list(runs), {name: [] for name in runs}
    for t in range(WARMUP + steps):
        for name in names[t % 3:] + names[:t % 3]:
            step = next(runs[name])
            if t >= WARMUP:
                seconds[name].append(step)
    return seconds


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    X, padded, y = _data()
    steps = QUICK_STEPS if quick else STEPS
    results, others = other_processes_share(lambda: side_by_side(X, padded, y, steps))
    median = {name: statistics.median(rows) for name, rows in results.items()}
    ratio = median[WITH] / median[WITHOUT]
    md = [f"{steps} steps per contender, one step of each in turn (rotated order), after {WARMUP} warm-up steps; "
          f"768 records of 8 tokens, expected batch {BATCH}, {THREADS} thread. "
          + load_sentence(others, "the ratio is what counts"), "",
          "| contender | median s/step | fastest 10 % | slowest 10 % | this / without lengths |",
          "|---|---:|---:|---:|---:|"]
    for name, rows in results.items():
        deciles = statistics.quantiles(rows, n=10)
        md.append(f"| {name} | {median[name]:.4f} | {deciles[0]:.4f} | {deciles[-1]:.4f} | "
                  f"{median[name] / median[WITHOUT]:.3f}× |")
    sentence, check = at_most("LSTM step with lengths= / without, README text classifier", ratio, TARGET)
    return {"title": TITLE, "markdown": "\n".join([*md, "", sentence, ""]), "checks": [check]}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv)["markdown"])
