"""GPT-style classifier, batch 64: dpopt's DP-SGD step (ghost engine) against a plain PyTorch step
and Opacus's two modes, side by side in one process.

Model (written as a user would, no ``nn.Sequential`` at the top): token ``nn.Embedding`` (vocabulary
1,000) plus a position ``nn.Embedding``, 2 pre-norm blocks of ``LayerNorm``, ``Linear`` q/k/v and
output projections, ``F.scaled_dot_product_attention`` (causal, 4 heads), ``LayerNorm`` and a GELU
MLP (4·d), a final ``LayerNorm``, mean over the tokens and a ``Linear`` head to 2 classes; d = 128,
64 tokens. Data: 4,096 random token sequences with random labels (the step's cost does not depend
on the values). float32, CPU, ``torch.set_num_threads(2)``, C = 1, z = 1, lr 0.1.

Contenders (interleaved: one warm-up round each, then rounds in a rotated order):

* ``non-private SGD (PyTorch)``: zero_grad, forward, mean cross-entropy, backward,
  ``torch.optim.SGD.step`` on fixed batches of 64 from a random permutation. The reference.
* ``dpopt DP-SGD (ghost)``: ``train.step`` of ``DPSGD`` (Poisson sampling at q = 64/n, the step,
  the ledger) on ``TorchModel(model, loss, X, y)`` with the defaults: the ghost engine finds every
  Linear, LayerNorm and Embedding inside the model's own forward (run per record under vmap, the
  layers tapped by scoped hooks).
* ``dpopt BandMF b = 4 / 16 (ghost)``: the same with ``DPSGD(bands=b)`` (cyclic Poisson batches, noise
  correlated from a ring of b − 1 past noise vectors of d float64 numbers).
* ``Opacus DP-SGD (hooks)`` and ``Opacus DP-SGD (ghost)``: ``PrivacyEngine().make_private`` with
  Poisson sampling and ``grad_sample_mode="hooks"`` / ``"ghost"``, ``DataLoader`` of batch 64,
  ``SGD``; the usual loop, the batch drawn by Opacus's Poisson loader inside the timer.

Targets (acceptance text): DP-SGD / non-private ≤ 1.6×; Opacus's faster mode / dpopt ≥ 1.3×;
BandMF (b = 4 and 16) / DP-SGD ≤ 1.05×.
The measurement runs in a child process with ``OMP_WAIT_POLICY=PASSIVE`` (see ``_timing.in_child``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _timing import (OpacusLoop, Stepper, interleaved, load_sentence, measured_in_child, other_processes_share, script,
                     summary)
from torch import nn

TITLE = "GPT-style classifier step, batch 64: dpopt DP-SGD vs plain PyTorch and Opacus"
THREADS, BATCH, N, VOCAB, TOKENS, DIM, HEADS, CLASSES = 2, 64, 4096, 1000, 64, 128, 4, 2
CLIP, NOISE, LR, STEPS_PER_ROUND = 1.0, 1.0, 0.1, 3
TARGET_DPSGD, TARGET_OPACUS, TARGET_BANDED = 1.6, 1.3, 1.05
PLAIN, GHOST, HOOKS, OPACUS_GHOST = ("non-private SGD (PyTorch)", "dpopt DP-SGD (ghost)", "Opacus DP-SGD (hooks)",
                                     "Opacus DP-SGD (ghost)")
#: banded correlated noise (``DPSGD(bands=b)``, cyclic Poisson batches), ghost engine, per number of bands
BANDED = {bands: f"dpopt BandMF b = {bands} (ghost)" for bands in (4, 16)}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.proj = (nn.Linear(DIM, DIM) for _ in range(4))
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (layer(h).view(b, t, HEADS, d // HEADS).transpose(1, 2) for layer in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, DIM), nn.Embedding(TOKENS, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # positions with the batch dimension: Opacus's per-sample rules need every layer's input to have it
        positions = torch.arange(idx.shape[1], device=idx.device).repeat(idx.shape[0], 1)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x).mean(1))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return GPT()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    """N random token sequences and labels (the step's cost does not depend on the values)."""
    gen = torch.Generator().manual_seed(3)
    return torch.randint(0, VOCAB, (N, TOKENS), generator=gen), torch.randint(0, CLASSES, (N,), generator=gen)


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


class Plain:
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y, self.model = X, y, _model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.gen = torch.Generator().manual_seed(2)

    def __call__(self, steps: int = STEPS_PER_ROUND) -> dict[str, float]:
        start = time.perf_counter()
        for _ in range(steps):
            idx = torch.randperm(len(self.X), generator=self.gen)[:BATCH]
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(self.X[idx]), self.y[idx]).backward()
            self.optimizer.step()
        return {"seconds": (time.perf_counter() - start) / steps, "batch": float(BATCH)}


def _opacus(X: torch.Tensor, y: torch.Tensor, mode: str) -> OpacusLoop:
    model = _model()
    return OpacusLoop(model, torch.optim.SGD(model.parameters(), lr=LR), X, y, batch=BATCH, noise=NOISE, clip=CLIP,
                      mode=mode, steps_per_call=STEPS_PER_ROUND)


def measure(quick: bool) -> dict[str, Any]:
    from dpopt.algorithms import DPSGD
    from dpopt.oracles import TorchModel

    torch.set_num_threads(THREADS)
    X, y = _data()
    dpsgd = DPSGD(lr=LR, clip=CLIP, noise_multiplier=NOISE, batch_size=BATCH)
    contenders: dict[str, Callable[[], dict[str, float]]] = {
        PLAIN: Plain(X, y),
        GHOST: Stepper(dpsgd, TorchModel(_model(), _cross_entropy, X, y), STEPS_PER_ROUND),
        HOOKS: _opacus(X, y, "hooks"), OPACUS_GHOST: _opacus(X, y, "ghost")} | {
        name: Stepper(dataclasses.replace(dpsgd, bands=bands), TorchModel(_model(), _cross_entropy, X, y),
                      STEPS_PER_ROUND) for bands, name in BANDED.items()}
    repeats, budget = ((3, 3), 0.0) if quick else ((8, 24), 120.0)
    start = time.perf_counter()
    results, others = other_processes_share(lambda: interleaved(contenders, repeats, budget))
    return {"results": results, "others": others, "seconds": time.perf_counter() - start,
            "threads": torch.get_num_threads()}


def _check(name: str, value: float, target: float, above: bool) -> dict[str, Any]:
    passed = value >= target if above else value <= target
    return {"name": name, "value": value, "target": f"{'≥' if above else '≤'} {target}×", "passed": passed}


def report(data: dict[str, Any], how: str) -> dict[str, Any]:
    results = data["results"]
    stats = {name: summary(rows) for name, rows in results.items()}
    med = {name: s["median"] for name, s in stats.items()}
    plain, faster = med[PLAIN], min(med[HOOKS], med[OPACUS_GHOST])
    dp_ratio, opacus_ratio = med[GHOST] / plain, faster / med[GHOST]
    busy = load_sentence(data["others"], "the ratios, measured side by side, are the meaningful numbers")
    md = [f"d = {DIM}, {HEADS} heads, {TOKENS} tokens, 2 blocks, vocabulary {VOCAB}, batch {BATCH}, float32, "
          f"{data['threads']} threads, C = {CLIP:g}, z = {NOISE:g}. {len(results[PLAIN])} interleaved rounds of "
          f"{STEPS_PER_ROUND} steps per contender ({data['seconds']:.0f} s), in a child process with {how}. {busy}",
          "", "| contender | median s/step | min | max | this / non-private | mean batch |",
          "|---|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        s = stats[name]
        md.append(f"| {name} | {s['median']:.4f} | {s['min']:.4f} | {s['max']:.4f} | {s['median'] / plain:.2f}× | "
                  f"{statistics.mean(r['batch'] for r in rows):.1f} |")
    md += ["", f"- **DP-SGD (dpopt, ghost) / non-private = {dp_ratio:.2f}×**; target ≤ {TARGET_DPSGD}×: "
               f"**{'PASS' if dp_ratio <= TARGET_DPSGD else 'FAIL'}**.",
           f"- **Opacus's faster mode / dpopt DP-SGD = {opacus_ratio:.2f}×** (hooks {med[HOOKS] / plain:.2f}×, "
           f"ghost {med[OPACUS_GHOST] / plain:.2f}× the non-private step); target ≥ {TARGET_OPACUS}×: "
           f"**{'PASS' if opacus_ratio >= TARGET_OPACUS else 'FAIL'}**.",
           *(f"- **{name} / dpopt DP-SGD (ghost) = {med[name] / med[GHOST]:.3f}×**; target ≤ {TARGET_BANDED}×: "
             f"**{'PASS' if med[name] / med[GHOST] <= TARGET_BANDED else 'FAIL'}**." for name in BANDED.values())]
    checks = [_check("DP-SGD / non-private step, GPT classifier", dp_ratio, TARGET_DPSGD, above=False),
              _check("Opacus (faster mode) / dpopt DP-SGD step, GPT classifier", opacus_ratio, TARGET_OPACUS,
                     above=True),
              *(_check(f"{name} / DP-SGD step, GPT classifier", med[name] / med[GHOST], TARGET_BANDED, above=False)
                for name in BANDED.values())]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks,
            "data": {"stats": stats, "other_processes_cpu_share": data["others"], "wait_policy": how}}


run = measured_in_child(__file__, report)


if __name__ == "__main__":
    script(measure, run)
