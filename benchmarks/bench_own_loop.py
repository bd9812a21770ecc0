"""The own-loop API against ``dpopt.run`` on the same problem, side by side in one process.

Setting: the first 10,000 MNIST training images (the shared data dir, float32 pixels in [0, 1]),
``dpopt.models.make_model("mnist-cnn", seed=0)``, cross-entropy per record, float32, CPU, one
torch thread, DP-SGD with Poisson batches of expected size 256, clip 1, noise multiplier 1,
lr 0.1, the ghost engine. Each round is one whole run of ``STEPS`` steps from the same initial
model, built inside the timer (oracle and all), ending with the run's ε:

* ``dpopt.run``: ``TorchModel(...)`` then ``dpopt.run(algo, oracle, steps=STEPS, log_every=STEPS)``
  (one log point: the ε at the end).
* ``Private + torch.optim.SGD``: ``dpopt.Private(model, loss, TensorDataset(X, y), algorithm=algo,
  epsilon=None, ...)``, then ``for _ in private: private.backward(); sgd.step()``, then
  ``private.epsilon()``. The module is float32, so SGD steps in float32 (run keeps θ in float64).
* ``train.step loop``: a reference, the bare loop of ``dpopt.train.step`` calls with a ledger
  (no History, no ε).

Target: Private + SGD / dpopt.run ≤ 1.05 (the own loop costs at most 5 % more).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import at_most, data_dir, interleaved, load_sentence, other_processes_share, summary  # noqa: E402

TITLE = "Own loop (dpopt.Private + torch.optim.SGD) vs dpopt.run, MNIST CNN DP-SGD"
THREADS = 1
RECORDS = 10_000
BATCH = 256
STEPS = 30
TARGET = 1.05

RUN = "dpopt.run"
OWN = "Private + torch.optim.SGD"
BARE = "train.step loop (reference)"


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    from dpopt.data import load

    mnist = load("mnist", data_dir())
    return (torch.as_tensor(mnist.X_train[:RECORDS], dtype=torch.float32),
            torch.as_tensor(mnist.y_train[:RECORDS]).long())


def contenders(X: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    import dpopt
    from dpopt import train
    from dpopt.accounting import Ledger
    from dpopt.models import make_model
    from dpopt.oracles import TorchModel

    algo = dpopt.DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=BATCH)

    def with_run() -> dict[str, float]:
        start = time.perf_counter()
        model = make_model("mnist-cnn", seed=0)
        oracle = TorchModel(model, _loss, X, y)
        history = dpopt.run(algo, oracle, steps=STEPS, seed=0, theta0=oracle.flat_params(), log_every=STEPS)
        oracle.load(history.theta)
        return {"seconds": (time.perf_counter() - start) / STEPS, "epsilon": history.final["epsilon"]}

    def with_own_loop() -> dict[str, float]:
        start = time.perf_counter()
        model = make_model("mnist-cnn", seed=0)
        private = dpopt.Private(model, _loss, TensorDataset(X, y), algorithm=algo, epsilon=None, delta=1e-5,
                                steps=STEPS, seed=0)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in private:
            private.backward()
            sgd.step()
        epsilon = private.epsilon()
        return {"seconds": (time.perf_counter() - start) / STEPS, "epsilon": epsilon}

    def bare() -> dict[str, float]:
        start = time.perf_counter()
        model = make_model("mnist-cnn", seed=0)
        oracle = TorchModel(model, _loss, X, y)
        sample_gen, source, _ = train.randomness(0)
        state, ledger = algo.init(oracle.flat_params().double(), STEPS, sample_gen), Ledger(algo.relation())
        for t in range(STEPS):
            state, _ = train.step(algo, oracle, state, t, ledger, sample_gen, source)
        return {"seconds": (time.perf_counter() - start) / STEPS, "epsilon": float("nan")}

    return {RUN: with_run, OWN: with_own_loop, BARE: bare}


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    X, y = _data()
    repeats = (2, 2) if quick else (4, 8)
    results, others = other_processes_share(lambda: interleaved(contenders(X, y), repeats, budget=120.0))
    stats = {name: summary(rows) for name, rows in results.items()}
    ratio = stats[OWN]["median"] / stats[RUN]["median"]
    md = [f"{len(results[RUN])} interleaved rounds of one whole {STEPS}-step run per contender (rotated order), "
          f"{RECORDS:,} MNIST images, expected batch {BATCH}, {THREADS} thread. "
          + load_sentence(others, "the ratio is what counts"), "",
          "| contender | median s/step | min | max | this / dpopt.run | ε at the end |",
          "|---|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        s = stats[name]
        md.append(f"| {name} | {s['median']:.4f} | {s['min']:.4f} | {s['max']:.4f} | "
                  f"{s['median'] / stats[RUN]['median']:.3f}× | {rows[-1]['epsilon']:.3f} |")
    sentence, check = at_most("own loop (Private + SGD) / dpopt.run, MNIST CNN", ratio, TARGET)
    return {"title": TITLE, "markdown": "\n".join([*md, "", sentence, ""]), "checks": [check]}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv)["markdown"])
