"""DP-O2NC: the zeroth-order oracle's throughput, and first- vs zeroth-order wall time.

1. Two-point sphere estimator (eq. 4), records × directions per second: the vectorised
   ``zeroth_order.two_point`` (one ``losses_at`` call on ``[B, 2m, d]`` points) against the naive
   loop over records and directions through ``oracle.loss`` (``two_point_loop``), on the truncated
   absolute loss (GLM, d = 128) and on a ReLU network (torch model, 22 → 8 → 1, d = 193).
   Target: vectorised ≥ 50× the loop on the GLM.
2. O2NC with the first-order (Theorem 6.1) and zeroth-order (Theorem 3.1, m capped as in the preset)
   oracles on the synthetic robust-regression problem of ``o2nc-nonsmooth`` (d = 32, n = 4,000):
   training wall time until the iterate first reaches a common Goldstein stationarity τ
   (K = 32 gradients in the 2α-ball, measured at 20 log points, outside the timer), τ = the
   worse of the two oracles' values at their last iterate. Two settings: private (ε = 1, the
   preset's constants ``TUNED``) and non-private (noise 0, no clips, c_D = 16, where both oracles
   move far from θ0). ``torch.set_num_threads(1)``, float64.
"""

from __future__ import annotations

import math
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

    return problem("ijcnn1-relu", str(data_dir()))[0].oracle.oracle


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
    import dataclasses
    import math

    from dpopt import accounting, run
    from dpopt.algorithms import o2nc_params
    from dpopt.experiments import o2nc_nonsmooth as preset
    from dpopt.metrics import goldstein

    n = 1000 if quick else 4000
    oracle = _glm(32, n)  # the single pass needs n records
    settings = {"epsilon": 1.0, "delta": 1e-5, "alpha": preset.ALPHA, "lipschitz": 1.0, "phi": 2.0}
    rows = []
    for private in (True, False):
        runs = {}
        for estimator, name in (("first", preset.FIRST), ("zeroth", preset.OURS)):
            chosen = preset.PRESET.TUNED[preset.TUNING_PROBLEM][name][1.0] if private else {"c_D": 16.0, "c": 1.0}
            constants = o2nc_params.Constants(radius=chosen["c_D"], concentration=chosen["c"],
                                              max_directions=preset.MAX_DIRECTIONS)
            algo, steps = o2nc_params.single_pass(n=n, d=32, estimator=estimator, constants=constants, **settings)
            algo = (accounting.calibrate(algo, epsilon=1.0, delta=1e-5, n=n, steps=steps) if private else
                    dataclasses.replace(algo, noise_multiplier=0.0, clip0=math.inf, clip=math.inf))
            history = run(algo, oracle, steps=steps, seed=0, log_every=max(1, steps // 20), diagnostics=True,
                          train_metrics=False,
                          log_metrics=lambda theta: {"goldstein": goldstein(oracle, theta, 2 * preset.ALPHA,
                                                                            points=32).value})
            runs[estimator] = (algo, steps, history, f"c_D = {chosen['c_D']:g}, c = {chosen['c']:g}")
        tau = max(h.diagnostics["records"][-1]["goldstein"] for _, _, h, _ in runs.values())
        for estimator, (algo, steps, history, constants_used) in runs.items():
            hit = next((r for r in history.diagnostics["records"] if r["goldstein"] <= tau), None)
            rows.append({"setting": "private, ε = 1" if private else "non-private", "oracle": estimator,
                         "steps": steps, "m": algo.directions, "c": constants_used,
                         "tau": tau, "seconds": hit["wall_time_s"] if hit else math.nan,
                         "at_step": hit["step"] if hit else None,
                         "total": history.diagnostics["records"][-1]["wall_time_s"],
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
    md += ["", "### O2NC first- vs zeroth-order oracle: training wall time to the same Goldstein stationarity τ", "",
           "| setting | oracle | constants | steps T | m | τ | reached at step | wall s to τ | wall s, all T | ε |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['setting']} | {r['oracle']} | {r['c']} | {r['steps']} | {r['m']} | {r['tau']:.4f} | "
           f"{r['at_step'] if r['at_step'] is not None else 'not reached'} | {r['seconds']:.2f} | {r['total']:.2f} | "
           f"{r['epsilon']:.3f} |" for r in rows]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        first, zeroth = (r for r in rows if r["setting"] == setting)
        ratio = zeroth["seconds"] / first["seconds"] if first["seconds"] > 0 else math.nan
        md += ["", f"{setting}: zeroth / first-order wall time to τ = {first['tau']:.4f}: **{ratio:.2f}×** "
               f"({zeroth['seconds']:.2f} s vs {first['seconds']:.2f} s)."]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks}


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv)["markdown"])
