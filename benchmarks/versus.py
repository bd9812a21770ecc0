"""dpopt against an earlier dpopt: the same measured operations, interleaved, one worker per version.

    python benchmarks/versus.py OLD_CHECKOUT [--rounds N] [--only CASE ...]

``OLD_CHECKOUT`` is another checkout of the repository (e.g. ``git worktree add /tmp/old <commit>``).
Each case below runs in two long-lived worker processes, one importing this checkout's ``src`` and
``benchmarks``, the other the old checkout's; the driver alternates them (order rotated every
round), so both versions see the same machine load, and reports the median of the per-round
ratios new / old (and the ratio of the fastest rounds). A ratio above 1 is a slowdown. Each case
uses the benchmark modules of its own checkout, so it measures what that version's BENCHMARKS.md
check measures (the dpopt side of it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _glm(method: str) -> Callable[[], float]:
    import bench_glm_dpsgd as bench
    import torch

    torch.set_num_threads(bench.THREADS)
    X, y, _ = bench.load_ijcnn1(bench.data_dir())
    contender = getattr(bench.Dpopt(X, y), method)
    return lambda: contender()["seconds"]


def _calibration() -> Callable[[], float]:
    import bench_calibrate as bench

    return lambda: sum(bench._solve(steps, epsilon)[0] for steps in (100, 100_000) for epsilon in (1.0, 8.0))


def _o2nc_estimator() -> Callable[[], float]:
    import bench_o2nc as bench
    import torch
    from dpopt.oracles import zeroth_order as zo

    torch.set_num_threads(1)
    oracle = bench._glm(128)
    gen = torch.Generator().manual_seed(0)
    x = 0.1 * torch.randn(oracle.dim, generator=gen, dtype=torch.float64)
    indices, directions = torch.arange(64), zo.sphere(gen, 64, 256, oracle.dim)

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(5):
            zo.two_point(oracle, x, indices, directions, 0.05)
        return time.perf_counter() - start
    return timed


def _cnn_step(name: str) -> Callable[[], float]:
    import bench_aclip_step as bench

    X, y, _ = bench._mnist()
    contender = bench._problem("mnist-cnn", X, y, 256)[name]
    return lambda: contender()["seconds"]


def _diff2_round() -> Callable[[], float]:
    """``dpopt run`` of DIFF2-GD (California Housing, P = 10, 300 rounds, Local backend) in a fresh
    process: the run's own wall time (a diagnostic, read from the written history) per round."""
    tree = Path(__import__("bench_diff2_backends").__file__).resolve().parent.parent

    def timed() -> float:
        out = tempfile.mkdtemp(prefix="versus-diff2-")
        command = [sys.executable, "-m", "dpopt.cli", "run", "--algorithm", "diff2-gd", "--dataset",
                   "california_housing", "--model", "mlp", "--epsilon", "3", "--steps", "300", "--restart", "20",
                   "--clip-diff", "3", "--lr", "0.125", "--checkpoint-every", "300", "--data-dir",
                   str(__import__("_timing").data_dir()), "--out", out, "--json", "--backend", "local"]
        help_text = subprocess.run([sys.executable, "-m", "dpopt.cli", "run", "--help"], capture_output=True, text=True,
                                   cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree / "src"))).stdout
        if "--diagnostics" in help_text:  # later versions write the wall time only when asked
            command.append("--diagnostics")
        subprocess.run(command, capture_output=True, text=True, check=True, cwd=tree,
                       env=dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1"))
        history = json.loads((Path(out) / "history.json").read_text())
        final = (history.get("diagnostics") or history)["final"]
        return final["wall_time_s"] / 300
    return timed


CASES: dict[str, Callable[[], Callable[[], float]]] = {
    "GLM DP-SGD epoch (bench_glm_dpsgd: dpopt epoch)": lambda: _glm("epoch"),
    "GLM train.run (bench_glm_dpsgd: dpopt train.run)": lambda: _glm("train_run"),
    "calibration, 4 cells (bench_calibrate)": _calibration,
    "two-point estimator (bench_o2nc)": _o2nc_estimator,
    "AClip step, MNIST CNN (bench_aclip_step)": lambda: _cnn_step("AClip"),
    "DP-SGD ghost step, MNIST CNN (bench_aclip_step, bench_mnist_cnn)": lambda: _cnn_step("DP-SGD (ghost)"),
    "DIFF2-GD round, local (bench_diff2_backends)": _diff2_round,
}


def _worker(tree: str, case: str) -> None:
    sys.path[:0] = [f"{tree}/src", f"{tree}/benchmarks"]
    measure = CASES[case]()
    measure()  # warm-up
    print("ready", flush=True)
    for _ in sys.stdin:
        print(json.dumps(measure()), flush=True)


def compare(old: Path, case: str, rounds: int) -> dict[str, float]:
    """Alternate ``rounds`` measurements of ``case`` in the old and this checkout's workers."""
    workers = [subprocess.Popen([sys.executable, __file__, "--worker", str(tree), case], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=f"{tree}/src"))
               for tree in (old, REPO)]
    for worker in workers:
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{case}: a worker failed to start")
    seconds: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            workers[i].stdin.write("go\n")
            workers[i].stdin.flush()
            seconds[i].append(float(workers[i].stdout.readline()))
    for worker in workers:
        worker.stdin.close()
        worker.wait()
    old_s, new_s = seconds
    return {"old": statistics.median(old_s), "new": statistics.median(new_s),
            "median_ratio": statistics.median(n / o for o, n in zip(old_s, new_s)),
            "min_ratio": min(new_s) / min(old_s)}


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the earlier checkout")
    parser.add_argument("--rounds", type=int, default=20, help="alternations per case (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=list(CASES), metavar="CASE", help="these cases only")
    args = parser.parse_args()
    commit = lambda tree: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree,  # noqa: E731
                                         capture_output=True, text=True).stdout.strip()
    print(f"new = {commit(REPO)}, old = {commit(args.old)}; {args.rounds} interleaved rounds per case\n")
    print("| operation | old median s | new median s | new / old (median of rounds) | new / old (fastest rounds) |")
    print("|---|---:|---:|---:|---:|")
    for case in args.only or CASES:
        r = compare(args.old.resolve(), case, args.rounds)
        print(f"| {case} | {r['old']:.4g} | {r['new']:.4g} | {r['median_ratio']:.3f} | {r['min_ratio']:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
