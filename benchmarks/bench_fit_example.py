"""The ``dpopt.fit`` example of docs/python-api.md against the same number of bare DP-SGD steps, in one process.

The example (docs/python-api.md, "dpopt.fit: a PyTorch module in one call"): MNIST (60,000
training images, 10,000 test images, the shared data dir, float32),
``make_model("mnist-cnn", seed=0)``, ``dpopt.fit(..., algorithm="dp-sgd",
epsilon=3.0, delta=1e-5, epochs=5, batch_size=256, lr=LR, test_data=test_dataset)``: calibration,
1,172 steps, ε and the test error once per epoch, the output written back. The reference is the
bare loop: 1,172 ``dpopt.train.step`` calls of the same calibrated DP-SGD on the same oracle
(the batch draw, the step, the ledger; nothing else). One round each (``--quick``: 1 epoch),
one torch thread. The check compares CPU time (with one thread, the work each did; wall time is
reported too, but a loaded machine changes between the two runs).

Target: fit / bare steps ≤ 1.5.
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
from _timing import at_most, data_dir, load_sentence, other_processes_share  # noqa: E402

TITLE = "The README's dpopt.fit example (MNIST CNN, DP-SGD, 5 epochs) vs the same bare DP-SGD steps"
THREADS = 1
LR = 2.0
TARGET = 1.5


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def measure(epochs: float) -> dict[str, Any]:
    import dpopt
    from dpopt import train
    from dpopt.accounting import Ledger
    from dpopt.algorithms.registry import build
    from dpopt.plan import steps_for_epochs
    from dpopt.data import load
    from dpopt.models import make_model
    from dpopt.oracles import TorchModel

    mnist = load("mnist", data_dir())
    train_dataset = TensorDataset(torch.as_tensor(mnist.X_train, dtype=torch.float32),
                                  torch.as_tensor(mnist.y_train).long())
    test_dataset = TensorDataset(torch.as_tensor(mnist.X_test, dtype=torch.float32),
                                 torch.as_tensor(mnist.y_test).long())
    X, y = train_dataset.tensors

    start, cpu = time.perf_counter(), time.process_time()
    oracle = TorchModel(make_model("mnist-cnn", seed=0), _loss, X, y)
    algo = build("dp-sgd", n=oracle.n, batch_size=256, lr=LR)
    steps = steps_for_epochs(algo, oracle.n, epochs)
    algo = dpopt.calibrate(algo, epsilon=3.0, delta=1e-5, n=oracle.n, steps=steps)
    sample_gen, source, _ = train.randomness(0)
    state, ledger = algo.init(oracle.flat_params().double(), steps, sample_gen), Ledger(algo.relation())
    for t in range(steps):
        state, _ = train.step(algo, oracle, state, t, ledger, sample_gen, source)
    bare, bare_cpu = time.perf_counter() - start, time.process_time() - cpu

    start, cpu = time.perf_counter(), time.process_time()
    model = make_model("mnist-cnn", seed=0)
    history = dpopt.fit(model, _loss, train_dataset, algorithm="dp-sgd", epsilon=3.0, delta=1e-5, epochs=epochs,
                        batch_size=256, lr=LR, test_data=test_dataset, progress=False)
    fitted, fitted_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"steps": steps, "bare_s": bare, "fit_s": fitted, "bare_cpu_s": bare_cpu, "fit_cpu_s": fitted_cpu,
            "test_error": history.final["test_error"],
            "epsilon": history.final["epsilon"], "log_points": len(history.records)}


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    epochs = 1.0 if quick else 5.0
    result, others = other_processes_share(lambda: measure(epochs))
    ratio = result["fit_cpu_s"] / result["bare_cpu_s"]
    md = [f"{epochs:g} epochs = {result['steps']} steps, {THREADS} thread, one round each (bare, then fit). "
          + load_sentence(others, "the CPU-time ratio (one thread: the process's CPU time is its work) is the "
                                  "check; the wall-time ratio depends on how the load changed between the two"), "",
          "| contender | wall s | CPU s | CPU s per step | CPU / bare | wall / bare |",
          "|---|---:|---:|---:|---:|---:|",
          f"| bare DP-SGD steps (`train.step`, calibration included) | {result['bare_s']:.1f} | "
          f"{result['bare_cpu_s']:.1f} | {result['bare_cpu_s'] / result['steps']:.4f} | 1.00× | 1.00× |",
          f"| README `dpopt.fit` example ({result['log_points']} log points: ε and the test error) | "
          f"{result['fit_s']:.1f} | {result['fit_cpu_s']:.1f} | {result['fit_cpu_s'] / result['steps']:.4f} | "
          f"{ratio:.2f}× | {result['fit_s'] / result['bare_s']:.2f}× |", "",
          f"The example's output: ε = {result['epsilon']:.3f}, test error {result['test_error']:.4f}.", ""]
    sentence, check = at_most(f"README fit example / bare DP-SGD steps, MNIST {epochs:g} epochs", ratio, TARGET)
    return {"title": TITLE, "markdown": "\n".join([*md, sentence, ""]), "checks": [check]}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv)["markdown"])
