"""Banded correlated noise: what generating x_t = (z_t − Σ_{j=1}^{b−1} c_j x_{t−j}) / c_0 costs per
step next to a DP-SGD step, side by side in one process.

Setting: MNIST train, 2 threads, float64 θ (what ``dpopt.train`` steps: the flat parameters in
double), DP-SGD with Poisson sampling at expected batch 256, C = 1, z = 1, ghost engine, for two
models: ``make_model("mnist-cnn")`` (d = 26,010) and a one-hidden-layer MLP 784–1264–10
(d = 1,005,890). Contenders, interleaved (one warm-up round each, rounds in rotated order):

* ``DP-SGD step, <model>``: ``train.step`` of ``DPSGD`` (batch, per-record gradients, clipping,
  the Gaussian release, the ledger);
* ``noise b = …, d = …``: ``dpopt.correlation.noise.banded_gaussian`` on a d-vector with the
  strategy ``BandedToeplitz.optimal(b, 2000)``: the draw, the correlation with the last b − 1
  noise vectors and the fused add. b = 1 is the Gaussian release DP-SGD makes already, so the
  extra cost of b bands is noise(b) − noise(1).

Target: on the MNIST CNN, the extra cost of b = 16 over b = 1 is at most 5 % of the DP-SGD step.
The MLP is reported without a target: its step does little work per parameter, while the
correlation must read the (b − 1)·d past numbers every step (memory-bound: about 14 ms of CPU
for b = 16, d = 10⁶, float64, on the 2-CPU machine of the first measurement), so there 16 bands
cost a sizeable share of the step and 4 bands a few per cent. Memory: the state of b bands holds
b − 1 vectors of d numbers in θ's dtype (counted from the state's tensors after b steps).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _timing import (Stepper, data_dir, interleaved, load_sentence, measured_in_child, other_processes_share, script,
                     summary)

TITLE = "Banded correlated noise: per-step cost next to a DP-SGD step"
THREADS = 2
BATCH = 256
STEPS_PER_ROUND = 5
BANDS = (1, 4, 16)
TARGET = 0.05  # extra cost of b = 16 over b = 1, as a share of the DP-SGD step


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 1264), torch.nn.Tanh(),
                               torch.nn.Linear(1264, 10))


class NoiseSteps:
    """``STEPS_PER_ROUND`` banded releases of a zero d-vector (float64), continuing one stream."""

    def __init__(self, dim: int, bands: int) -> None:
        from dpopt.clipping import clip_aggregate
        from dpopt.correlation.noise import banded_noise
        from dpopt.correlation.strategy import BandedToeplitz
        from dpopt.mechanisms import SeededNoise

        self.x = clip_aggregate(torch.zeros(dim, dtype=torch.float64), 1.0)
        self.state = banded_noise(self.x.value, BandedToeplitz.optimal(bands, 2000))
        self.source = SeededNoise(0)

    def __call__(self, steps: int = STEPS_PER_ROUND) -> dict[str, float]:
        from dpopt.correlation.noise import banded_gaussian

        start = time.perf_counter()
        for _ in range(steps):
            _, self.state, _ = banded_gaussian(self.x, 1.0, self.state, self.source, step=self.state.step)
        return {"seconds": (time.perf_counter() - start) / steps}

    def state_bytes(self) -> int:
        """Bytes of the distinct tensors the state holds."""
        tensors = {id(t): t for t in self.state.past}
        return sum(t.numel() * t.element_size() for t in tensors.values())


def _mnist() -> tuple[torch.Tensor, torch.Tensor]:
    from dpopt.data import load

    data = load("mnist", data_dir())
    return torch.as_tensor(data.X_train, dtype=torch.float32).contiguous(), torch.as_tensor(data.y_train).long()


def measure(quick: bool) -> dict[str, Any]:
    from dpopt.algorithms import DPSGD
    from dpopt.models import make_model
    from dpopt.oracles import TorchModel

    torch.set_num_threads(THREADS)
    X, y = _mnist()
    dpsgd = DPSGD(lr=0.1, clip=1.0, noise_multiplier=1.0, batch_size=BATCH)
    models = {"MNIST CNN": make_model("mnist-cnn", seed=0), "MLP 784-1264-10": _mlp()}
    contenders: dict[str, Callable[[], dict[str, float]]] = {}
    dims = {}
    for name, model in models.items():
        oracle = TorchModel(model, _cross_entropy, X, y)
        dims[name] = oracle.dim
        contenders[f"DP-SGD step, {name}"] = Stepper(dpsgd, oracle, STEPS_PER_ROUND)
        for bands in BANDS:
            contenders[f"noise b = {bands}, {name}"] = NoiseSteps(oracle.dim, bands)
    repeats, budget = ((3, 3), 0.0) if quick else ((6, 20), 60.0)
    results, others = other_processes_share(lambda: interleaved(contenders, repeats, budget))
    state_bytes = {name: fn.state_bytes() for name, fn in contenders.items() if isinstance(fn, NoiseSteps)}
    return {"results": results, "others": others, "dims": dims, "state_bytes": state_bytes,
            "policy": os.environ.get("OMP_WAIT_POLICY", "default")}


def report(data: dict[str, Any], how: str) -> dict[str, Any]:
    stats = {name: summary(rows) for name, rows in data["results"].items()}
    med = {name: s["median"] for name, s in stats.items()}
    md = [f"MNIST train, {THREADS} threads, float64 θ, DP-SGD at expected batch {BATCH} (ghost engine); "
          f"{STEPS_PER_ROUND} steps per round, interleaved, in a child process with {how}. "
          + load_sentence(data["others"], "the side-by-side ratios are the meaningful numbers"), "",
          "| contender | d | median ms/step | min | max | extra over b = 1, % of the DP-SGD step | state |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    checks = []
    for model, dim in data["dims"].items():
        step = med[f"DP-SGD step, {model}"]
        s = stats[f"DP-SGD step, {model}"]
        md.append(f"| DP-SGD step, {model} | {dim:,} | {1e3 * s['median']:.2f} | {1e3 * s['min']:.2f} | "
                  f"{1e3 * s['max']:.2f} | | |")
        base = med[f"noise b = 1, {model}"]
        for bands in BANDS:
            name = f"noise b = {bands}, {model}"
            s, extra = stats[name], (med[name] - base) / step
            md.append(f"| {name} | {dim:,} | {1e3 * s['median']:.3f} | {1e3 * s['min']:.3f} | {1e3 * s['max']:.3f} | "
                      f"{100 * extra:.2f} % | {data['state_bytes'][name] / 2**20:.1f} MB |")
        if model == "MNIST CNN":
            extra = (med[f"noise b = 16, {model}"] - base) / step
            checks.append({"name": f"extra cost of 16 bands / DP-SGD step, {model}", "value": extra,
                           "target": f"≤ {TARGET}", "passed": extra <= TARGET})
    md += ["", "State: the b − 1 past noise vectors (b = 1 holds none): (b − 1)·d·8 bytes in float64."]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks, "data": {"stats": stats}}


run = measured_in_child(__file__, report)


if __name__ == "__main__":
    script(measure, run)
