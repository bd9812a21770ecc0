"""One DP-SGD epoch of logistic regression on ijcnn1: dpopt against Opacus, in one process.

The problem is the same for every contender: ijcnn1 train (n = 49,990, d = 22), logistic loss
without bias, Poisson sampling with expected batch size b = 256, clip C = 1, noise multiplier
z = 1, step size 0.5, one epoch = round(n/b) = 195 steps, ``torch.set_num_threads(2)``.

Contenders (run interleaved: every round runs each contender once, in an order rotated from
round to round, after one warm-up run of each):

* ``dpopt train.run``: ``dpopt.train.run(algo, oracle, steps=E, seed=0, log_every=E)``, the
  user-facing loop: sampling, steps, the privacy ledger, and one log at the end (objective,
  gradient norm and the ledger's PLD ε(δ)). The in-process ε memo is cleared before each run,
  so every run pays the accounting a user running one training pays.
* ``dpopt epoch``: E calls of ``dpopt.train.step`` (draw the batch, ``algo.step``, record the
  event in a :class:`~dpopt.accounting.Ledger`): exactly what ``train.run`` does per step, without
  its final evaluation and ε query.
* ``Opacus (fp32|fp64)``: Opacus as its users run it: ``PrivacyEngine().make_private`` on
  ``nn.Linear(22, 1, bias=False)``, ``SGD``, a ``DataLoader(TensorDataset)`` with
  ``poisson_sampling=True`` and the default ``grad_sample_mode="hooks"``; the loop is zero_grad,
  forward, ``BCEWithLogitsLoss`` (mean), backward, step. ``make_private`` runs outside the
  timer; the timer covers E steps of the loop, data loading included. ``get_epsilon(δ)`` is
  timed separately after the loop (Opacus' default accountant).

The headline ratio is like for like, one epoch of training on each side: Opacus fp32's loop
(its accountant hook records each step; no ε is computed) over ``dpopt epoch`` (the ledger
records each step; no ε is computed). The whole-run comparison, (Opacus loop + ``get_epsilon``)
over ``dpopt train.run`` (ledger + final objective, gradient norm and PLD ε), is reported beside it.

Opacus' ``make_private`` derives its sampling rate from the loader as ``1/len(loader)`` =
1/196 (expected batch 255.05, noise divisor 255) where dpopt uses q = 256/n (expected batch
256); the difference is 0.4 % of the batch and both do exactly E steps.
"""

from __future__ import annotations

import itertools
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _timing import (data_dir, in_child, interleaved, load_sentence, mb, other_processes_share, script,
                     summary)

TITLE = "One DP-SGD epoch, logistic regression on ijcnn1: dpopt vs Opacus"
TARGET = 20.0
THREADS = 2
BATCH = 256
CLIP = 1.0
NOISE = 1.0
LR = 0.5
DELTA = 1e-5
SEED = 0
EPS_ONLY = "(component) dpopt final ε only"
BUSY_ADVICE = "small-tensor torch ops with 2 intra-op threads suffer most, rerun on a quiet machine"


def load_ijcnn1(folder: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """ijcnn1 train split as float64 ``X [n, 22]``, ``y`` in {-1, +1}, and how it was read."""
    try:
        from dpopt import data
        load = data.load
    except (ImportError, AttributeError):
        load = None
    if load is not None:
        ds = load("ijcnn1", data_dir=folder)
        return ds.X_train, ds.y_train, f"`dpopt.data.load(\"ijcnn1\", data_dir={str(folder)!r})`"
    from dpopt.data.libsvm import read_libsvm
    path = folder / "ijcnn1" / "ijcnn1.trn.bz2"
    X, y = read_libsvm(path, 22)
    return X, y, f"`dpopt.data.libsvm.read_libsvm({str(path)!r}, 22)`"


# --------------------------------------------------------------------------- contenders


class Dpopt:
    """The dpopt side: the real DPSGD step on the closed-form logistic oracle."""

    def __init__(self, X: np.ndarray, y: np.ndarray) -> None:
        from dpopt.algorithms.dp_sgd import DPSGD
        from dpopt.oracles.glm import Logistic

        self.oracle = Logistic(torch.from_numpy(X), torch.from_numpy(y))
        self.n = self.oracle.n
        self.steps = round(self.n / BATCH)
        self.algo = DPSGD(lr=LR, clip=CLIP, noise_multiplier=NOISE, batch_size=BATCH)

    def train_run(self) -> dict[str, float]:
        from dpopt import accounting, train

        memo = getattr(accounting, "_EPSILON_CACHE", None)
        if memo is not None:
            memo.clear()  # cold: every run pays its own ε, as a single user run does
        start = time.perf_counter()
        history = train.run(self.algo, self.oracle, steps=self.steps, seed=SEED, delta=DELTA, log_every=self.steps,
                            diagnostics=True, diagnostic_sample=None)  # the objective on all the data, as before
        seconds = time.perf_counter() - start
        measured = history.diagnostics["final"]  # NOT PRIVATE: the benchmark's own check, never released
        return {"seconds": seconds, "loss": measured["objective"], "epsilon": history.final["epsilon"],
                "batch": measured["passes"] * self.n / self.steps}

    def epsilon_only(self) -> dict[str, float]:
        """The final log's ε(δ) alone: PLD over the planned event (= the ledger's), memo cleared."""
        from dpopt import accounting

        memo = getattr(accounting, "_EPSILON_CACHE", None)
        if memo is not None:
            memo.clear()
        start = time.perf_counter()
        epsilon = accounting.epsilon_of(self.algo.planned_event(self.n, self.steps), DELTA, self.algo.relation())
        return {"seconds": time.perf_counter() - start, "epsilon": epsilon}

    def epoch(self) -> dict[str, float]:
        from dpopt import train
        from dpopt.accounting import Ledger

        algo, oracle = self.algo, self.oracle
        start = time.perf_counter()
        from dpopt.mechanisms import SeededNoise

        sample_gen, noise_gen = torch.Generator().manual_seed(SEED), SeededNoise(SEED + 1)
        state = algo.init(torch.zeros(oracle.dim, dtype=torch.float64), self.steps, sample_gen)
        ledger = Ledger(algo.relation())
        seen = 0
        for t in range(self.steps):
            state, size = train.step(algo, oracle, state, t, ledger, sample_gen, noise_gen)
            seen += size
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "loss": float(oracle.loss(algo.output(state))), "batch": seen / self.steps}


class Opacus:
    """The Opacus side: ``make_private`` with Poisson sampling and the default hooks mode."""

    def __init__(self, X: np.ndarray, y: np.ndarray, steps: int, dtype: torch.dtype) -> None:
        self.X = torch.tensor(X, dtype=dtype)
        self.y01 = torch.tensor((y + 1) / 2, dtype=dtype)  # BCE labels in {0, 1}
        self.steps = steps
        self.dtype = dtype

    def epoch(self) -> dict[str, float]:
        from opacus import PrivacyEngine
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = nn.Linear(self.X.shape[1], 1, bias=False).to(self.dtype)
            nn.init.zeros_(model.weight)  # θ0 = 0, as dpopt
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            loader = DataLoader(TensorDataset(self.X, self.y01), batch_size=BATCH)
            engine = PrivacyEngine()
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=NOISE,
                max_grad_norm=CLIP, poisson_sampling=True)
            criterion = nn.BCEWithLogitsLoss()  # reduction="mean"

            start = time.perf_counter()
            seen = 0
            for xb, yb in itertools.islice(loader, self.steps):  # E batches, no extra one drawn
                optimizer.zero_grad()
                loss = criterion(model(xb).squeeze(-1), yb)
                loss.backward()
                optimizer.step()
                seen += len(yb)
            seconds = time.perf_counter() - start

            start = time.perf_counter()
            epsilon = engine.get_epsilon(DELTA)
            eps_seconds = time.perf_counter() - start
        with torch.no_grad():
            full = criterion(model(self.X).squeeze(-1), self.y01)
        return {"seconds": seconds, "eps_seconds": eps_seconds, "loss": float(full), "epsilon": float(epsilon),
                "batch": seen / self.steps}


# --------------------------------------------------------------------------- measurement


# --------------------------------------------------------------------------- entry point


def measure(quick: bool) -> dict[str, Any]:
    """The interleaved rounds (run in the child process; JSON-serialisable result)."""
    torch.set_num_threads(THREADS)
    repeats, budget = ((5, 5), 0.0) if quick else ((7, 15), 60.0)
    folder = data_dir()
    start = time.perf_counter()
    X, y, how = load_ijcnn1(folder)
    load_seconds = time.perf_counter() - start

    dp = Dpopt(X, y)
    fp32 = Opacus(X, y, dp.steps, torch.float32)
    contenders: dict[str, Callable[[], dict[str, float]]] = {
        "dpopt epoch": dp.epoch,
        "dpopt train.run": dp.train_run,
        "Opacus fp32": fp32.epoch,
    }
    if not quick:
        contenders["Opacus fp64"] = Opacus(X, y, dp.steps, torch.float64).epoch
    contenders[EPS_ONLY] = dp.epsilon_only
    start = time.perf_counter()
    results, others = other_processes_share(lambda: interleaved(contenders, repeats, budget))
    return {"results": results, "others": others, "measure_seconds": time.perf_counter() - start,
            "load_seconds": load_seconds, "how": how, "n": dp.n, "dim": dp.oracle.dim, "steps": dp.steps}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure in a child process, and return ``{"title", "markdown", "checks", "data"}`` (see
    ``benchmarks/run.py``)."""
    data, policy = in_child(__file__, quick)
    results, others, measure_seconds = data["results"], data["others"], data["measure_seconds"]
    load_seconds, how, n, dim, steps = data["load_seconds"], data["how"], data["n"], data["dim"], data["steps"]
    stats = {name: summary(rows) for name, rows in results.items()}
    opacus, base = stats["Opacus fp32"]["median"], stats["dpopt epoch"]["median"]
    headline = opacus / base
    per_round = [o["seconds"] / d["seconds"] for o, d in zip(results["Opacus fp32"], results["dpopt epoch"])]
    minima = stats["Opacus fp32"]["min"] / stats["dpopt epoch"]["min"]
    whole_run = stats["dpopt train.run"]["median"]
    opacus_eps = summary(results["Opacus fp32"], "eps_seconds")["median"]
    with_eps = statistics.median(r["seconds"] + r["eps_seconds"] for r in results["Opacus fp32"])

    def median(rows: list[dict[str, float]], key: str, form: str) -> str:
        return format(statistics.median(r[key] for r in rows), form) if key in rows[0] else "—"

    md = [
        f"Problem: ijcnn1 train, n = {n:,}, d = {dim}; logistic regression without bias, "
        f"θ0 = 0; Poisson sampling, expected batch b = {BATCH}; clip C = {CLIP:g}, noise multiplier "
        f"z = {NOISE:g}, lr = {LR:g}; one epoch = round(n/b) = {steps} steps; "
        f"`torch.set_num_threads({THREADS})`; δ = {DELTA:g} for ε. Data: {how} ({load_seconds:.1f} s).",
        "",
        f"{len(results['dpopt epoch'])} interleaved rounds (each contender once per round, after one "
        f"warm-up each; {measure_seconds:.0f} s of measurement), in a child process with {policy}. "
        + load_sentence(others, BUSY_ADVICE),
        "",
        "| contender | median s/epoch | min | max | Opacus fp32 / this (medians) | loss after epoch "
        "| mean batch | ε(δ) | peak RSS rise |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.items():
        s = stats[name]
        ratio = "—" if name == EPS_ONLY else f"{opacus / s['median']:.2f}×"
        md.append(
            f"| {name} | {s['median']:.4f} | {s['min']:.4f} | {s['max']:.4f} | {ratio} | "
            f"{median(rows, 'loss', '.4f')} | {median(rows, 'batch', '.1f')} | {median(rows, 'epsilon', '.3f')} | "
            f"{mb(statistics.median(r['rss_mb'] for r in rows))} |")
    md += [
        "",
        f"**Headline: Opacus fp32 / dpopt epoch = {headline:.2f}×** (ratio of medians; per-round "
        f"ratios {min(per_round):.2f}×–{max(per_round):.2f}×; ratio of minima {minima:.2f}×). "
        f"Target ≥ {TARGET:g}×: **{'PASS' if headline >= TARGET else 'FAIL'}**.",
        "",
        f"Whole run, ε included: (Opacus fp32 loop + `get_epsilon`, {opacus_eps:.3f} s) / dpopt train.run "
        f"= **{with_eps / whole_run:.2f}×**; Opacus fp32 loop alone / dpopt train.run = {opacus / whole_run:.2f}×"
        + (f"; Opacus fp64 / dpopt epoch = {stats['Opacus fp64']['median'] / base:.2f}×."
           if "Opacus fp64" in stats else "."),
        "",
        "Notes: `dpopt train.run` includes the ledger and one log at the end (full-data objective, "
        "gradient norm, PLD ε(δ)); its ε memo is cleared before each run. The row "
        f"`{EPS_ONLY}` times that ε alone (the same PLD computation), to show its share. Opacus times "
        "exclude `make_private` and accounting; Opacus samples at q = 1/len(loader) = 1/196 (expected "
        "batch 255.05) against dpopt's q = 256/n. Loss: full-data training loss after the epoch (the "
        "same problem on both sides). Peak RSS rise: median over repeats of how far the resident set "
        "rose above its level at the start of the run (Linux VmHWM, reset before each run).",
    ]
    check = {"name": "Opacus fp32 / dpopt, one epoch", "value": headline,
             "target": f"≥ {TARGET:g}×", "passed": headline >= TARGET}
    return {"title": TITLE, "markdown": "\n".join(md), "checks": [check],
            "data": {"stats": stats, "headline": headline, "per_round": per_round,
                     "other_processes_cpu_share": others}}


if __name__ == "__main__":
    script(measure, run)
