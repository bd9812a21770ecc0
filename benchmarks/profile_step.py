"""Where a DP-SGD step's time goes: torch-profiler op time per step of dpopt's DP-SGD step (ghost
engine) beside the plain PyTorch step of the same benchmark, op by op.

    DPOPT_DATA=<data> OMP_WAIT_POLICY=PASSIVE python benchmarks/profile_step.py mnist-cnn
    OMP_WAIT_POLICY=PASSIVE python benchmarks/profile_step.py gpt

The contenders are those of ``bench_mnist_cnn.py`` (the plain step in channels-last layout, the
reference of its check) and ``bench_gpt.py``. Each runs a warm-up round, then ``--steps`` steps
under the profiler. Printed: each contender's op time per step (self CPU time of every aten op,
summed: Python and dispatch are not in it), then the ops by how much more time dpopt spends in
them than the plain step, and last the few on which the plain step spends more. Ops the plain
step does not run at all (``bmm``, ``gather``, norms, ``normal_``) are the per-record work of
clipping and the noise; the plain step's weight gradients sit inside its
``convolution_backward`` / ``mm`` rows, which dpopt does not run for its ghost layers. Profiler times
are of one process on a possibly busy machine: read the differences, not the digits.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _timing import Stepper
from torch.profiler import profile

#: Ops listed last: those on which the plain step spends more (its weight gradients, fused kernels).
LESS = 5


def _contenders(model: str) -> dict[str, Callable[..., dict[str, float]]]:
    from dpopt.algorithms import DPSGD
    from dpopt.oracles import TorchModel

    if model == "mnist-cnn":
        import bench_mnist_cnn as bench

        X, y, _ = bench._mnist()
        plain, batch = bench.Plain(X, y, channels_last=True), bench.BATCH
    else:
        import bench_gpt as bench

        X, y = bench._data()
        plain, batch = bench.Plain(X, y), bench.BATCH
    algorithm = DPSGD(lr=bench.LR, clip=bench.CLIP, noise_multiplier=bench.NOISE, batch_size=batch)
    dpopt = Stepper(algorithm, TorchModel(bench._model(), bench._cross_entropy, X, y), 1)
    return {"dpopt DP-SGD (ghost)": dpopt, "plain PyTorch": plain}


def op_times(step: Callable[..., dict[str, float]], steps: int) -> dict[str, float]:
    """Self CPU time per step (ms) of each aten op over ``steps`` steps, after one warm-up step."""
    step(1)
    with profile() as prof:
        step(steps)
    return {event.key: event.self_cpu_time_total / steps / 1e3 for event in prof.key_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=("mnist-cnn", "gpt"))
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per contender (default 20)")
    parser.add_argument("--rows", type=int, default=16, help="ops listed (default 16)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    (dp_name, dp), (plain_name, plain) = _contenders(args.model).items()
    ours, theirs = op_times(dp, args.steps), op_times(plain, args.steps)
    print(f"op time per step: {dp_name} {sum(ours.values()):.2f} ms, {plain_name} {sum(theirs.values()):.2f} ms")
    print(f"{'op':<48} {'dpopt':>8} {'plain':>8} {'more':>8}  (ms per step)")
    by_difference = sorted(set(ours) | set(theirs), key=lambda op: theirs.get(op, 0) - ours.get(op, 0))
    for op in by_difference[:args.rows] + ["..."] + by_difference[-LESS:]:
        mine, other = ours.get(op, 0.0), theirs.get(op, 0.0)
        print(op if op == "..." else f"{op[:48]:<48} {mine:8.2f} {other:8.2f} {mine - other:8.2f}")


if __name__ == "__main__":
    main()
