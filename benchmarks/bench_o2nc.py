"""DP-O2NC: the zeroth-order oracle's throughput, and first- vs zeroth-order wall time.

1. Two-point sphere estimator (eq. 4), records × directions per second: the vectorised
   ``zeroth_order.two_point`` (one ``losses_at`` call on ``[B, 2m, d]`` points) against the naive
   loop over records and directions through ``oracle.loss`` (``two_point_loop``), on the truncated
   absolute loss (GLM, d = 128) and on a ReLU network (torch model, 22 → 8 → 1, d = 193).
   Target: vectorised ≥ 50× the loop on the GLM.
2. O2NC with the first-order (Theorem 6.1) and zeroth-order (Theorem 3.1, m capped at 2048)
   oracles, the theorems' settings, ε = 1, on the synthetic robust-regression problem (d = 32,
   n = 4,000): wall time of the whole run (the same T steps) and the Goldstein stationarity each
   reaches (K = 32 gradients in the 2α-ball). ``torch.set_num_threads(1)``, float64.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from _timing import data_dir, interleaved, other_processes_share, summary

TITLE = "DP-O2NC: zeroth-order oracle throughput; first- vs zeroth-order wall time"
TARGET = 50.0


def _glm(d: int, n: int = 2000) -> Any:
    from dpopt.experiments.o2nc_nonsmooth import synthetic
    from dpopt.oracles import TruncatedAbsolute

    X, y, _, _ = synthetic(d, n)
    return TruncatedAbsolute(torch.as_tensor(X), torch.as_tensor(y), cap=2.0)


def _mlp() -> Any:
    from dpopt.experiments.o2nc_nonsmooth import problem

    return problem(str(data_dir()), "ijcnn1-relu")[0].oracle.oracle


def _throughput(oracle: Any, records: int, directions: int, loop_records: int, loop_directions: int,
                quick: bool) -> tuple[dict[str, float], float]:
    from dpopt.oracles import zeroth_order as zo

    gen = torch.Generator().manual_seed(0)
    x = 0.1 * torch.randn(oracle.dim, generator=gen, dtype=torch.float64)
    big = (torch.arange(records), zo.sphere(gen, records, directions, oracle.dim))
    small = (torch.arange(loop_records), zo.sphere(gen, loop_records, loop_directions, oracle.dim))

    def timed(fn: Any, indices: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        start = time.perf_counter()
        fn(oracle, x, indices, y, 0.05)
        return {"seconds": time.perf_counter() - start, "rate": len(indices) * y.shape[1]
                / (time.perf_counter() - start)}

    contenders = {"vectorised": lambda: timed(zo.two_point, *big), "loop": lambda: timed(zo.two_point_loop, *small)}
    results, others = other_processes_share(lambda: interleaved(contenders, (2, 3) if quick else (3, 7), 15.0))
    return {name: summary(rows, "rate")["median"] for name, rows in results.items()}, others


def _first_vs_zeroth(quick: bool) -> list[dict[str, Any]]:
    from dpopt import accounting, run
    from dpopt.algorithms import o2nc_params
    from dpopt.metrics import goldstein

    n = 1000 if quick else 4000
    oracle = _glm(32, n)  # the single pass needs n records
    rows = []
    for estimator in ("first", "zeroth"):
        algo, steps = o2nc_params.single_pass(n=n, d=32, epsilon=1.0, delta=1e-5, alpha=0.05, lipschitz=1.0, phi=2.0,
                                              estimator=estimator,
                                              constants=o2nc_params.Constants(max_directions=2048))
        algo = accounting.calibrate(algo, epsilon=1.0, delta=1e-5, n=n, steps=steps)
        start = time.perf_counter()
        history = run(algo, oracle, steps=steps, seed=0, log_every=steps)
        seconds = time.perf_counter() - start
        rows.append({"oracle": estimator, "steps": steps, "m": algo.directions, "seconds": seconds,
                     "goldstein": goldstein(oracle, history.theta, 0.1, points=32).value,
                     "epsilon": history.final["epsilon"]})
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    md = ["### Two-point estimator: records × directions per second", "",
          "| oracle | vectorised | naive loop | speed-up | other processes' CPU share |", "|---|---:|---:|---:|---:|"]
    checks = []
    cases = [("truncated absolute (GLM), d = 128", _glm(128), (64, 256, 4, 16))]
    if not quick:
        cases.append(("ReLU network 22→8→1 (torch, vmap), d = 193", _mlp(), (16, 128, 2, 8)))
    for name, oracle, (b, m, lb, lm) in cases:
        rates, others = _throughput(oracle, b, m, lb, lm, quick)
        speedup = rates["vectorised"] / rates["loop"]
        md.append(f"| {name} | {rates['vectorised']:.3g} | {rates['loop']:.3g} | {speedup:.0f}× | {others:.0%} |")
        if "GLM" in name:
            checks.append({"name": "two-point estimator, vectorised / loop (GLM)", "value": speedup,
                           "target": f"≥ {TARGET:.0f}×", "passed": speedup >= TARGET})
    rows = _first_vs_zeroth(quick)
    md += ["", "### O2NC first- vs zeroth-order oracle, theorem settings, ε = 1 (same T steps)", "",
           "| oracle | steps T | m | wall s | Goldstein ‖∂̄_{2α}F‖ at output | ε |", "|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['oracle']} | {r['steps']} | {r['m']} | {r['seconds']:.2f} | {r['goldstein']:.4f} | "
           f"{r['epsilon']:.3f} |" for r in rows]
    first, zeroth = rows
    md += ["", f"Zeroth / first-order wall time: **{zeroth['seconds'] / first['seconds']:.2f}×** "
           f"(stationarity reached: {zeroth['goldstein']:.4f} vs {first['goldstein']:.4f})."]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks}


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv)["markdown"])
