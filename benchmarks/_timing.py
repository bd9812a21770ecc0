"""Measurement helpers shared by the benchmarks: interleaved rounds, peak memory, machine load."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Share of the machine's CPU other processes may use before a report flags its timings.
QUIET = 0.10
#: OpenMP wait policy for measuring processes (see :func:`in_child`).
WAIT_POLICY = "PASSIVE"
RESULT_MARK = "@@dpopt benchmark result@@ "


def data_dir() -> Path:
    """``$DPOPT_DATA`` (holding one folder per data set) or ``<repo>/../shared/data``."""
    env = os.environ.get("DPOPT_DATA")
    return Path(env).expanduser() if env else REPO.parent / "shared" / "data"


def status_mb(field: str) -> float:
    """``VmRSS``/``VmHWM`` of this process from /proc/self/status, in MB (nan if unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def with_peak_rss(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``fn()`` plus ``rss_mb``: how far the resident set rose above its level at the call.

    Linux: writing "5" to /proc/self/clear_refs resets the peak (VmHWM) to the current RSS.
    The reset and the reads happen outside ``fn``'s own timer.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = status_mb("VmRSS")
    except OSError:
        before = math.nan
    result = fn()
    result["rss_mb"] = status_mb("VmHWM") - before
    return result


def busy_cpu_seconds() -> float:
    """CPU seconds all processes have spent so far (/proc/stat; nan if unavailable)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def interleaved(contenders: dict[str, Callable[[], dict[str, float]]], repeats: tuple[int, int],
                 budget: float, warm: bool = True) -> dict[str, list[dict[str, float]]]:
    """One warm-up each (unless ``warm`` is False: the caller warmed them), then rounds: at least
    ``repeats[0]`` rounds, and more up to ``repeats[1]`` while the rounds so far took less than
    ``budget`` seconds. Round r runs the contenders in a rotated order (A B C, then B C A, …), so
    none is always the one that runs right after the contender that leaves the caches and the heap
    in a particular state."""
    for fn in contenders.values() if warm else ():
        fn()
    names = list(contenders)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    start = time.perf_counter()
    for done in range(repeats[1]):
        if done >= repeats[0] and time.perf_counter() - start > budget:
            break
        for name in names[done % len(names):] + names[:done % len(names)]:
            results[name].append(with_peak_rss(contenders[name]))
    return results


def mb(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f} MB"


def summary(rows: list[dict[str, float]], key: str = "seconds") -> dict[str, float]:
    values = [row[key] for row in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio_table(stats: dict[str, dict[str, float]], baseline: str, columns: tuple[str, str],
                digits: int = 3) -> list[str]:
    """A Markdown table of :func:`summary` rows by contender, ``columns`` = (the time's heading, the
    ratio's heading), each row's median against ``baseline``'s as the ratio ``baseline / row``."""
    lines = [f"| contender | {columns[0]} | min | max | {columns[1]} |", "|---|---:|---:|---:|---:|"]
    return lines + [f"| {name} | {s['median']:.{digits}f} | {s['min']:.{digits}f} | {s['max']:.{digits}f} | "
                     f"{stats[baseline]['median'] / s['median']:.2f}× |" for name, s in stats.items()]


def patched(call: Callable[..., dict[str, float]], *replacements: tuple[object, str, object]
            ) -> Callable[..., dict[str, float]]:
    """``call`` run with each ``(owner, name, value)`` of ``replacements`` set (``owner.name = value``)
    for the call's duration only, the attributes then restored: a contender timed with a part of the
    engine replaced by what it was before."""
    def timed(*args: Any) -> dict[str, float]:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
        for owner, name, value in replacements:
            setattr(owner, name, value)
        try:
            return call(*args)
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
    return timed


def at_most(name: str, value: float, target: float) -> tuple[str, dict[str, Any]]:
    """A ratio check "``value`` ≤ ``target``×": its verdict sentence and its row of the targets table."""
    passed = value <= target
    sentence = f"**{name} = {value:.3f}×**. Target ≤ {target}×: **{'PASS' if passed else 'FAIL'}**."
    return sentence, {"name": name, "value": value, "target": f"≤ {target}×", "passed": passed}


def load_sentence(others: float, busy_advice: str) -> str:
    """How busy the machine was while measuring (``others`` from :func:`other_processes_share`), as
    a report's sentence; above :data:`QUIET` it flags the timings and ends with ``busy_advice``."""
    if math.isnan(others):
        return "How busy the machine was is unknown (no /proc/stat)."
    flag = ("." if others < QUIET
            else f": **the machine was busy, so these timings are inflated and noisy**; {busy_advice}.")
    return f"Other processes used {others:.0%} of the machine's CPU time meanwhile (/proc/stat){flag}"


def other_processes_share(measure: Callable[[], object]) -> tuple[object, float]:
    """``measure()`` and the share of the machine's CPU time other processes used meanwhile
    (/proc/stat minus this process; nan where unavailable)."""
    busy0, own0, start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    result = measure()
    seconds = time.perf_counter() - start
    others = (busy_cpu_seconds() - busy0 - (own_cpu_seconds() - own0)) / (seconds * (os.cpu_count() or 1))
    return result, (max(0.0, others) if math.isfinite(others) else math.nan)


def in_child(script: str | Path, quick: bool, timeout: float = 900) -> tuple[dict[str, Any], str]:
    """Run ``script --child [--quick]`` in a fresh interpreter (at most ``timeout`` seconds) and return
    the JSON it reports (via :func:`report_from_child`) and how its OpenMP wait policy was set.

    The child runs with ``OMP_WAIT_POLICY=PASSIVE`` unless the caller set a policy. PyTorch's
    libgomp spins idle worker threads by default; on a 2-CPU machine a worker still spinning after
    one contender's parallel region takes a CPU from the next contender's main thread (measured: a
    dpopt GLM epoch right after an Opacus epoch took 66 ms instead of 35 ms; a 2-thread CNN step
    0.32 s instead of 0.044 s when other jobs held the CPUs). Passive waiting costs every contender
    a wake-up per parallel region instead, and makes the interleaved rounds independent.
    """
    env = dict(os.environ)
    if "OMP_WAIT_POLICY" in env:
        how = f"`OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}` as set by the caller"
    else:
        env["OMP_WAIT_POLICY"] = WAIT_POLICY
        how = f"`OMP_WAIT_POLICY={WAIT_POLICY}` (set by `_timing.in_child`, see its docstring)"
    command = [sys.executable, str(Path(script).resolve()), "--child"] + (["--quick"] if quick else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the measuring process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_MARK):]), how


def measured_in_child(script: str | Path,
                      report: Callable[[dict[str, Any], str], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """A benchmark's ``run(quick=False)``: measure in a child process (:func:`in_child` of ``script``)
    and return ``report(data, how)``, its ``{"title", "markdown", "checks", "data"}``."""
    def run(quick: bool = False) -> dict[str, Any]:
        data, how = in_child(script, quick)
        return report(data, how)
    return run


def report_from_child(data: dict[str, Any]) -> None:
    """The child's side of :func:`in_child`: print ``data`` as one marked JSON line."""
    print(RESULT_MARK + json.dumps(data))


def script(measure: Callable[..., dict[str, Any]], run: Callable[..., dict[str, Any]]) -> None:
    """A child-measured benchmark run as a script: with ``--child`` measure for :func:`in_child`,
    else run it and print its section and checks (``--quick`` for the short version)."""
    quick = "--quick" in sys.argv
    if "--child" in sys.argv:
        report_from_child(measure(quick=quick))
        return
    result = run(quick=quick)
    print(result["markdown"])
    for check in result["checks"]:
        print(f"{check['name']}: {check['value']:.2f} (target {check['target']}): "
              f"{'PASS' if check['passed'] else 'FAIL'}")


class OpacusLoop:
    """Opacus DP-SGD as its users run it: ``PrivacyEngine().make_private`` of ``model`` and
    ``optimizer`` (built on it) with Poisson sampling from a ``DataLoader`` of ``batch`` records of
    ``(X, y)``, noise multiplier ``noise``, clip ``clip``, ``grad_sample_mode`` ``mode`` ("hooks", or
    "ghost": its ghost clipping). Each call takes ``steps`` steps (default ``steps_per_call``) of the
    usual loop, zero_grad, forward, mean cross-entropy, backward, step, the loader's batches continuing
    across epochs (drawing them is inside the timer); returns the seconds per step and the mean batch."""

    def __init__(self, model: Any, optimizer: Any, X: Any, y: Any, *, batch: int, noise: float, clip: float,
                 mode: str = "hooks", steps_per_call: int = 1) -> None:
        import warnings

        import torch
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = PrivacyEngine().make_private(
                module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(X, y), batch_size=batch),
                noise_multiplier=noise, max_grad_norm=clip, poisson_sampling=True, grad_sample_mode=mode,
                criterion=torch.nn.CrossEntropyLoss())
        self.model, self.optimizer = made[0], made[1]
        self.criterion, self.loader = (made[2], made[3]) if mode == "ghost" else (torch.nn.CrossEntropyLoss(), made[2])
        self.batches, self.steps_per_call = iter(self.loader), steps_per_call

    def _next(self) -> Any:
        try:
            return next(self.batches)
        except StopIteration:  # a new epoch of the loader
            self.batches = iter(self.loader)
            return next(self.batches)

    def __call__(self, steps: int | None = None) -> dict[str, float]:
        import warnings

        steps = steps or self.steps_per_call
        start, records = time.perf_counter(), 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(steps):
                xb, yb = self._next()
                self.optimizer.zero_grad()
                self.criterion(self.model(xb), yb).backward()
                self.optimizer.step()
                records += len(yb)
        return {"seconds": (time.perf_counter() - start) / steps, "batch": records / steps}


class Stepper:
    """``steps`` calls of dpopt's ``train.step`` (what ``dpopt.run`` runs per step) of ``algorithm``
    on ``oracle`` per measurement, continuing one run (the first call is the warm-up, so DP-SRM's
    timed steps have t ≥ 1)."""

    def __init__(self, algorithm: Any, oracle: Any, steps: int) -> None:
        import torch

        from dpopt.accounting import Ledger
        from dpopt.mechanisms import SeededNoise

        from dpopt import train

        self.algorithm, self.oracle, self.steps = algorithm, oracle, steps
        self.gens = torch.Generator().manual_seed(0), SeededNoise(1)
        self.keyed = train.keyed(algorithm)  # banded noise: the batch sampler comes from the state
        self.state = algorithm.init(oracle.flat_params().double(), 10_000, self.gens[0])
        self.ledger, self.t = Ledger(algorithm.relation()), 0

    def __call__(self, steps: int | None = None) -> dict[str, float]:
        """Time ``steps`` steps (default: the constructor's)."""
        from dpopt import train

        steps = steps or self.steps
        start, records = time.perf_counter(), 0
        for _ in range(steps):
            self.state, size = train.step(self.algorithm, self.oracle, self.state, self.t, self.ledger, *self.gens,
                                          keyed=self.keyed)
            self.t, records = self.t + 1, records + size
        return {"seconds": (time.perf_counter() - start) / steps, "batch": records / steps}
