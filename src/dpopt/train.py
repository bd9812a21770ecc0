"""The one training loop: ``run(...) -> History``, with checkpoint/resume and the ledger.

Each step t asks the algorithm for its sampler, draws the batch from the run's sampling
generator, calls ``algorithm.step`` and records the event it returns in the :class:`Ledger`
(double entry: after the run the ledger equals ``algorithm.planned_event(n, steps)``).
A checkpoint holds θ and the algorithm state, both generators, the step, the ledger and the
history so far, written atomically; resuming refuses a checkpoint of another configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from . import _validate, checkpoint
from .accounting import Ledger, epsilon_of
from .algorithms._common import Batch
from .oracles import Oracle

METRICS = ("objective", "grad_norm", "test_error", "epsilon", "passes", "cpu_time_s", "wall_time_s")


@dataclasses.dataclass
class History:
    """Per logged step: ``step`` and :data:`METRICS`; ``final``: the same at the output."""

    records: list[dict[str, float]]
    final: dict[str, float]
    theta: Tensor
    delta: float
    accountant: str
    neighboring_relation: str
    steps_done: int
    stopped: str | None = None
    diverged_at: int | None = None  # the step after which θ (or F(θ), where computed) was not finite

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "theta"} | {
            "theta": self.theta.tolist()}


def _generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    sample_seed, noise_seed = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    return (torch.Generator().manual_seed(int(sample_seed)), torch.Generator().manual_seed(int(noise_seed)))


def fingerprint(algorithm: Any, oracle: Oracle, **settings: Any) -> str:
    """A hash of everything that determines a run, for refusing foreign checkpoints."""
    oracle = getattr(oracle, "oracle", oracle)  # a data-parallel wrapper runs the same problem
    described = {"algorithm": repr(algorithm), "oracle": f"{type(oracle).__name__}(n={oracle.n}, dim={oracle.dim}, "
                 f"reg={getattr(oracle, 'reg', None)})", **{k: repr(v) for k, v in settings.items()}}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def affordable_steps(algorithm: Any, n: int, steps: int, delta: float, max_epsilon: float, accountant: str) -> int:
    """The largest t ≤ steps whose planned ε(δ) stays ≤ ``max_epsilon`` (bisection; ε grows with t)."""
    relation = algorithm.relation()

    def fits(t: int) -> bool:
        return epsilon_of(algorithm.planned_event(n, t), delta, relation, accountant) <= max_epsilon

    if fits(steps):
        return steps
    lo, hi = 0, steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def step(algorithm: Any, oracle: Oracle, state: Any, t: int, ledger: Ledger,
         sample_gen: torch.Generator, noise_gen: torch.Generator) -> tuple[Any, int]:
    """Step t of a run: draw the batch, let the algorithm step, record its event in ``ledger``.

    Returns the new state and the batch size. This is everything :func:`run` does per step
    besides timing, logging and checkpointing.
    """
    # An oracle whose gradients are closed-form (uses_autograd = False) steps in inference mode:
    # its many small tensor operations skip autograd's dispatch (about a fifth of a GLM step).
    with torch.inference_mode(not getattr(oracle, "uses_autograd", True)):
        sampler = algorithm.sampler(t, oracle.n)
        indices = sampler.sample(sample_gen)
        state, event = algorithm.step(state, Batch(t, indices, sampler), oracle, noise_gen)
    ledger.record(event)
    return state, len(indices)


def run(algorithm: Any, oracle: Oracle, *, steps: int, seed: int = 0, delta: float = 1e-5,
        theta0: Tensor | None = None, accountant: str = "pld",
        test_error: Callable[[Tensor], float] | None = None, log_every: int | None = None,
        checkpoint_path: str | Path | None = None, checkpoint_every: int | None = None,
        max_epsilon: float | None = None, progress: bool = False, train_metrics: bool = True,
        log_metrics: Callable[[Tensor], dict[str, float]] | None = None) -> History:
    """Train ``algorithm`` on ``oracle`` for ``steps`` steps and return the :class:`History`.

    Logged every ``log_every`` steps (default ~50 points) and at the end: F(θ_t), ‖∇F(θ_t)‖
    (θ_t: ``algorithm.running_output(state)`` for an algorithm that outputs an average, else the
    current iterate),
    ``test_error(θ_t)``, the ledger's ε(δ) so far, data passes Σ|B_t|/n, and the CPU and wall
    time of training so far (sampling, steps and the ledger; not these measurements).
    ``final`` holds the same at the algorithm's output, plus ``algorithm.diagnostics(state)`` where
    an algorithm reports some (O2NC: how often its clips bit). With ``checkpoint_path`` the run resumes
    from that file if it exists and writes it every ``checkpoint_every`` steps. With
    ``max_epsilon`` it stops before the first step whose planned ε would exceed it. With
    ``train_metrics=False`` F and ‖∇F‖ are not computed (NaN): on a large data set each costs a
    full pass, more than many training steps. ``log_metrics(θ) -> {name: value}`` adds more
    measurements at every log point and at the output (measurement only: it must not touch the
    generators).

    Divergence: after every step θ_t is checked for non-finite entries (and, where it is logged,
    F(θ_t) for finiteness); the first failure is logged and stops the run, with
    ``History.diverged_at`` = t and ``stopped`` saying why. The checkpoint then holds that step
    (its ledger covers every step taken), and resuming it does not step again.
    """
    _validate.positive_int("steps", steps)
    _validate.open_unit("delta", delta)
    log_every = max(1, steps // 50) if log_every is None else _validate.positive_int("log_every", log_every)
    n = oracle.n
    for t in sorted({0, 1, steps - 1}):
        _validate.positive_int("batch_size", int(algorithm.sampler(t, n).expected_size), maximum=n, maximum_name="n")
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64) if theta0 is None else theta0.to(torch.float64)
    stop_at = steps
    if max_epsilon is not None:
        _validate.positive("max_epsilon", max_epsilon)
        stop_at = affordable_steps(algorithm, n, steps, delta, max_epsilon, accountant)
    theta0_digest = hashlib.sha256(theta0.cpu().numpy().tobytes()).hexdigest()
    key = fingerprint(algorithm, oracle, steps=steps, seed=seed, delta=delta, theta0=theta0_digest,
                      accountant=accountant, max_epsilon=max_epsilon, log_every=log_every)
    path = Path(checkpoint_path) if checkpoint_path else None

    sample_gen, noise_gen = _generators(seed)
    state = algorithm.init(theta0, steps, sample_gen)
    ledger = Ledger(algorithm.relation(), accountant)
    records: list[dict[str, float]] = []
    start, visited, cpu_spent, wall_spent, diverged_at = 0, 0, 0.0, 0.0, None
    if path is not None:
        checkpoint.remove_stale(path)
    if path is not None and path.exists():
        saved = checkpoint.load(path)
        if saved["fingerprint"] != key:
            raise _validate.DpoptError(f"checkpoint={str(path)!r} was written by a different configuration; "
                                       "use another --out or delete it")
        state, start, visited, records = saved["state"], saved["step"], saved["visited"], saved["records"]
        sample_gen.set_state(saved["sample_gen"])
        noise_gen.set_state(saved["noise_gen"])
        ledger = Ledger.from_state(saved["ledger"])
        cpu_spent, wall_spent, diverged_at = saved["cpu_time_s"], saved["wall_time_s"], saved.get("diverged_at")

    # what is logged: the algorithm's output so far where it defines one (averaging), else θ_t
    current = getattr(algorithm, "running_output", lambda state: state.theta)

    def measure(theta: Tensor) -> dict[str, float]:
        return {
            "objective": float(oracle.loss(theta)) if train_metrics else math.nan,
            "grad_norm": float(oracle.gradient(theta).norm()) if train_metrics else math.nan,
            "test_error": test_error(theta) if test_error else math.nan,
            "epsilon": ledger.epsilon(delta),
            "passes": visited / n,
            "cpu_time_s": cpu_spent,
            "wall_time_s": wall_spent,
        } | (log_metrics(theta) if log_metrics else {})

    def save(t: int) -> None:
        checkpoint.save(path, {
            "fingerprint": key, "step": t, "state": state, "visited": visited, "records": records,
            "sample_gen": sample_gen.get_state(), "noise_gen": noise_gen.get_state(), "ledger": ledger.state(),
            "cpu_time_s": cpu_spent, "wall_time_s": wall_spent, "diverged_at": diverged_at})

    bar = tqdm(total=stop_at, initial=start, disable=not progress, desc=type(algorithm).__name__, leave=False)
    for t in range(start, stop_at if diverged_at is None else start):  # (a diverged checkpoint: no step)
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        state, batch_size = step(algorithm, oracle, state, t, ledger, sample_gen, noise_gen)
        visited += batch_size
        cpu_spent += time.process_time() - cpu_start
        wall_spent += time.perf_counter() - wall_start
        bar.update()
        finite = bool(torch.isfinite(state.theta).all())
        if not finite or (t + 1) % log_every == 0 or t + 1 == stop_at:
            records.append({"step": t + 1} | measure(current(state)))
            if not finite or (train_metrics and not math.isfinite(records[-1]["objective"])):
                diverged_at = t + 1
                break
        if path is not None and checkpoint_every and (t + 1) % checkpoint_every == 0:
            save(t + 1)
    bar.close()
    done = stop_at if diverged_at is None else diverged_at
    if path is not None:
        save(done)  # a diverged run's too: its ledger holds every step taken
    theta = algorithm.output(state)
    diagnostics = algorithm.diagnostics(state) if hasattr(algorithm, "diagnostics") else {}
    if diverged_at is not None:
        why = "θ has non-finite entries" if not torch.isfinite(state.theta).all() else "the objective is not finite"
        stopped = f"diverged at step {diverged_at}: {why}"
    else:
        stopped = None if stop_at == steps else f"max_epsilon={max_epsilon} reached"
    return History(records=records, final=measure(theta) | diagnostics, theta=theta, delta=delta,
                   accountant=ledger.accountant, neighboring_relation=ledger.neighboring_relation,
                   steps_done=done, stopped=stopped, diverged_at=diverged_at)
