"""How long ``dpopt calibrate`` takes: noise for a target ε, Poisson-sampled Gaussian, q = 0.02.

The computation only (``dpopt.accounting.solve_noise``; interpreter start-up not counted), on
a grid of steps T and targets ε, each solved from a cold ε memo. Target: ≤ 1 s for T ≤ 1e5
with the default accountant (PLD). Also checks the round trip: achieved ε ≤ target, ≥ 0.99·target.
"""

from __future__ import annotations

import time
from typing import Any

import dp_accounting as dpa
from dp_accounting import NeighboringRelation

from dpopt import accounting

TITLE = "Calibration time: noise multiplier for a target ε (poisson-gaussian, q = 0.02, δ = 1e-5)"
TARGET_S = 1.0


def _solve(steps: int, epsilon: float) -> tuple[float, float, float]:
    accounting._EPSILON_CACHE.clear()
    accounting._sampled_gaussian_step.cache_clear()

    def event_of(z: float) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(z)), steps)

    start = time.perf_counter()
    z, achieved = accounting.solve_noise(event_of, epsilon=epsilon, delta=1e-5,
                                         relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    return time.perf_counter() - start, z, achieved


def run(quick: bool = False) -> dict[str, Any]:
    """Measure, and return ``{"title", "markdown", "checks"}`` (see ``benchmarks/run.py``)."""
    steps_grid = (1500, 100_000) if quick else (100, 1500, 10_000, 100_000)
    epsilons = (1.0, 8.0) if quick else (0.2, 1.0, 3.0, 8.0)
    rows, worst, round_trip = [], 0.0, True
    for steps in steps_grid:
        cells = []
        for epsilon in epsilons:
            seconds, z, achieved = _solve(steps, epsilon)
            worst = max(worst, seconds)
            round_trip &= 0.99 * epsilon <= achieved <= epsilon
            cells.append(f"{seconds:.2f} s (z = {z:.4g})")
        rows.append(f"| {steps:,} | " + " | ".join(cells) + " |")
    header = "| T | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |"
    markdown = "\n".join([
        "`dpopt.accounting.solve_noise` from a cold memo; wall seconds (and the noise multiplier found).", "",
        header, "|---:|" + "---:|" * len(epsilons), *rows, "",
        f"Slowest: {worst:.2f} s (target ≤ {TARGET_S:g} s). Round trip (0.99·ε ≤ achieved ≤ ε): "
        f"{'yes' if round_trip else 'NO'}."])
    return {"title": TITLE, "markdown": markdown, "checks": [
        {"name": "slowest calibration, T ≤ 1e5", "value": worst, "unit": " s", "target": f"≤ {TARGET_S:g} s",
         "passed": worst <= TARGET_S},
        {"name": "round trip within 1 % for every cell", "value": "yes" if round_trip else "no", "target": "yes",
         "passed": round_trip}]}
