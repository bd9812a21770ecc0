"""The one training loop: ``train(plan, oracle, options) -> History``, with checkpoint/resume and
the ledger.

A :class:`~dpopt.plan.Plan` says what is released (the algorithm, n, the steps, δ, the
accountant); :class:`Options` say how the run goes (its randomness, logging, checkpoints,
diagnostics), none of which changes the plan. Each step t asks the algorithm for its sampler,
draws the batch from the run's sampling generator, calls ``algorithm.step`` and records the event
it returns in the :class:`~dpopt.accounting.Ledger` (double entry: the ledger is checked against
the plan's event after every logged step). :func:`run` is the same loop for an algorithm object
and keyword arguments.
A checkpoint is the run's :class:`~dpopt.snapshot.Snapshot` (:meth:`Stepper.snapshot`: θ and the
algorithm state, both generators, the step, the ledger, the run's id, its settings, and the
history so far), written by :func:`dpopt.snapshot.write` under the lock of the checkpoint
(:mod:`dpopt.lock`); resuming (:func:`dpopt.snapshot.read`, then :meth:`Stepper.restore`) refuses
a checkpoint whose tag does not verify, of another run, whose ledger is not the plan's, or older
than its run's latest (a rewind).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, cast

import torch
from torch import Tensor

from . import _validate, atomic, journal, lock, resume, snapshot
from .accounting import Ledger, accountant_note
from .base import (S, Algorithm, Averaged, Batch, ClosedForm, KeyedSampling, NamedNoise, NoiseSource, Oracle, Reporting,
                   Sampler, SelfDiagnosing, SharedNoise)
from .json_types import JsonObject
from .mechanisms import Discrete, SeededNoise
from .outputs import NOT_PRIVATE
from .progress import bar as progress_bar
from .clock import StepClock
from .plan import Plan
from .seeding import FROM_OS as FROM_OS, SEEDED as SEEDED, SYSTEM as SYSTEM, OsSeed as OsSeed  # train's names too
from .seeding import randomness
from .snapshot import Progress, Snapshot

@dataclasses.dataclass
class History:
    """A run's private outputs, and its non-private diagnostics if they were asked for.

    ``records``: per logged step, ``step`` and :data:`~dpopt.outputs.PRIVATE_METRICS`; ``final``:
    the same at the output, with the counts the algorithm releases about its run (:class:`~dpopt.base.Reporting`:
    functions of its noised releases). ``epsilon`` is the run's guarantee (:func:`dpopt.accounting.guarantee`): the ε of
    the events recorded so far, or for a privacy filter (DP-AGD) the filter's total.
    ``diagnostics``: None, or ``{"label": NOT_PRIVATE, "records": [...], "final": {...}}`` with
    :data:`~dpopt.outputs.DIAGNOSTIC_METRICS`, ``log_metrics`` and the algorithm's own diagnostics
    (:mod:`dpopt.outputs` classifies every field).
    ``randomness`` says where the noise came from and what the guarantee then rests on.
    ``accountant_note``: None, or why ``accountant`` is not the one asked for (also warned about).
    """

    records: list[dict[str, float]]
    final: dict[str, float]
    theta: Tensor
    delta: float
    accountant: str
    neighboring_relation: str
    steps_done: int
    randomness: str
    stopped: str | None = None
    diagnostics: dict[str, Any] | None = None
    diverged_at: int | None = None  # the step after which θ was not finite
    accountant_note: str | None = None

    def to_dict(self) -> JsonObject:
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "theta"} | {
            "theta": self.theta.tolist()}


#: Training records the diagnostics F(θ) and ‖∇F(θ)‖ are measured on by default (spread evenly).
DIAGNOSTIC_SAMPLE = 10_000

def step(algorithm: Algorithm[S], oracle: Oracle, state: S, t: int, ledger: Ledger,
         sample_gen: torch.Generator, source: NoiseSource, *, inference: bool | None = None,
         keyed: bool = False) -> tuple[S, int]:
    """Step t of a run: draw the batch, let the algorithm step, record its event in ``ledger``.

    Returns the new state and the batch size. This is everything :func:`train` does per step
    besides timing, logging and checkpointing. ``inference``: step in inference mode, for an
    oracle whose gradients are closed-form (:class:`~dpopt.base.ClosedForm`): its many small
    tensor operations then skip autograd's dispatch (about a fifth of a GLM step); None: read from
    the oracle's ``closed_form`` (a caller stepping many times may pass it, asked once). ``keyed``:
    the algorithm's batches depend on its state (:func:`keyed`, asked once per run); the batch
    is then drawn from ``algorithm.batch_sampler(state, t, n)``, else from ``algorithm.sampler(t,
    n)`` (which refuses to draw for a keyed algorithm's secret groups: forgetting the flag fails).
    """
    if inference is None:  # an attribute read, not a protocol check: a GLM step is tens of microseconds
        inference = bool(getattr(oracle, "closed_form", False))
    with torch.inference_mode(inference):
        sampler = batch_sampler(algorithm, state, t, oracle.n, keyed=keyed)
        indices = sampler.sample(sample_gen)
        state, event = algorithm.step(state, Batch(t, indices, sampler), oracle, source)
    ledger.record(event)
    return state, len(indices)


def batch_sampler(algorithm: Algorithm[S], state: S, t: int, n: int, *, keyed: bool) -> Sampler:
    """The sampler step t of a run in ``state`` draws its batch from: ``algorithm.batch_sampler(state,
    t, n)`` if ``keyed`` (:func:`keyed`, asked once per run by the caller: the batches depend on a
    secret of the state), else ``algorithm.sampler(t, n)``."""
    return cast("KeyedSampling[S]", algorithm).batch_sampler(state, t, n) if keyed else algorithm.sampler(t, n)


def keyed(algorithm: Algorithm[S]) -> bool:
    """Whether ``algorithm`` draws its batches from a secret of its state
    (:class:`~dpopt.base.KeyedSampling`): :func:`step`'s ``keyed``. Ask once per run (a protocol
    check costs tens of microseconds, a GLM step about thirty)."""
    return isinstance(algorithm, KeyedSampling)


#: θ with at most this many entries is summed from a Python list by :func:`all_finite` (a GLM's
#: tens of entries: half the time of a tensor reduction, whose dispatch dominates there).
SMALL_THETA = 64


def all_finite(theta: Tensor) -> bool:
    """Whether every entry of θ is finite: a finite sum has only finite terms (a NaN or ±∞ entry
    makes the sum NaN or ±∞), so one reduction answers; only a sum that overflowed is checked
    entry by entry."""
    small = theta.numel() <= SMALL_THETA and theta.is_cpu
    total = sum(theta.reshape(-1).tolist()) if small else float(theta.sum())
    return math.isfinite(total) or bool(torch.isfinite(theta).all())


@dataclasses.dataclass
class Stepper:
    """The moving parts of one run of ``plan``: the algorithm's state, the oracle, the ledger, the
    sampling generator and the noise source, the next step ``t`` and the run's id ``run``
    (:func:`dpopt.journal.new_run`).

    :meth:`step` is step t of the run (:func:`step`); :func:`train` and :class:`dpopt.Private` (so
    :func:`dpopt.fit`) drive the same object, so every release comes from one code path, and
    checkpoint it as one value: :meth:`snapshot` and :meth:`restore`."""

    plan: Plan[Any]
    oracle: Oracle
    state: Any
    ledger: Ledger
    sample_gen: torch.Generator
    source: NoiseSource
    origin: str  # where the randomness comes from (History.randomness)
    t: int = 0
    run: str = dataclasses.field(default_factory=journal.new_run)

    @classmethod
    def start(cls, plan: Plan[S], oracle: Oracle, *, theta0: Tensor, seed: int | None = None,
              noise_source: NoiseSource | None = None) -> Self:
        """Step 0 of a run of ``plan`` on ``oracle`` from ``theta0``, its randomness as
        :func:`randomness` says. The oracle must hold the plan's n records."""
        if oracle.n != plan.n:
            raise _validate.DpoptError(f"the plan is for n={plan.n} records and the oracle holds {oracle.n}")
        sample_gen, source, origin = randomness(seed, noise_source)
        state = plan.algorithm.init(theta0, plan.steps, sample_gen)
        return cls(plan, oracle, state, plan.ledger(), sample_gen, source, origin)

    @property
    def algorithm(self) -> Algorithm[object]:
        return self.plan.algorithm

    @property
    def steps(self) -> int:
        return self.plan.steps

    @functools.cached_property
    def inference(self) -> bool:
        """Whether steps run in inference mode (a closed-form oracle), asked once."""
        return isinstance(self.oracle, ClosedForm)

    @functools.cached_property
    def keyed(self) -> bool:
        """Whether batches come from the algorithm's state (:func:`keyed`), asked once."""
        return keyed(self.plan.algorithm)

    def step(self) -> int:
        """Step t: draw its batch, let the algorithm step, record the event; returns the batch size."""
        self.state, size = step(self.plan.algorithm, self.oracle, self.state, self.t, self.ledger, self.sample_gen,
                                self.source, inference=self.inference, keyed=self.keyed)
        self.t += 1
        return size

    def epsilon(self, delta: float | None = None) -> float:
        """The guarantee ε(δ) so far (the plan's δ by default): the ledger, checked against the
        plan, as the whole plan once every step is taken (:meth:`dpopt.plan.Plan.guarantee`; a
        privacy filter's total)."""
        return self.plan.guarantee(self.ledger, delta, finished=self.t >= self.steps)

    def snapshot(self, settings: dict[str, str], progress: Progress | None = None) -> Snapshot:
        """The run now, as one value (:class:`~dpopt.snapshot.Snapshot`): everything :meth:`restore`
        needs to continue it exactly, with the ``settings`` a resume must match and the loop's
        ``progress``. Secret: it holds both generators' states."""
        return Snapshot(settings=settings, run=self.run, step=self.t, state=self.state,
                        sample_gen=self.sample_gen.get_state(), noise_gen=self.source.generator.get_state(),
                        ledger=self.ledger.state(), progress=progress)

    def restore(self, saved: Snapshot) -> None:
        """Continue from ``saved`` (checked by :func:`dpopt.snapshot.read`): its state, step, ledger,
        run id and both generators' states; the next step is the one ``saved``'s run would have taken."""
        self.state, self.t, self.run = saved.state, saved.step, saved.run
        self.ledger = Ledger.from_state(saved.ledger)
        self.sample_gen.set_state(saved.sample_gen)
        self.source.generator.set_state(saved.noise_gen)


@dataclasses.dataclass(frozen=True)
class Options:
    """How a run goes, none of which changes its plan or what it releases.

    ``seed``: None draws the sampling and the noise from the operating system (secret); with a
    seed they are reproducible, and the guarantee rests on the seed staying secret.
    ``noise_source`` (e.g. :class:`~dpopt.mechanisms.SystemNoise`) replaces the seeded release noise.
    ``test_error(θ)``: measured at every log point and at the output (data outside the training
    set). ``log_every``: steps between log points (default ~50 points). ``checkpoint_path``: resume
    from that file if it exists and write it every ``checkpoint_every`` steps. ``max_epsilon``: stop
    before the first step whose planned ε would exceed it. ``progress`` (None: True): a progress bar on
    standard error, or a plain line every 10 s where it is not a terminal (:mod:`dpopt.progress`).
    ``diagnostics``: also measure, labelled NOT PRIVATE, F(θ) and
    ‖∇F(θ)‖ on the training data (unless ``train_metrics`` is False; on ``diagnostic_sample`` records
    spread evenly, None: all), the realised passes, the times, ``log_metrics(θ)`` and the algorithm's
    own diagnostics."""

    seed: int | None = None
    noise_source: NoiseSource | None = None
    test_error: Callable[[Tensor], float] | None = None
    log_every: int | None = None
    checkpoint_path: str | Path | None = None
    checkpoint_every: int | None = None
    max_epsilon: float | None = None
    progress: bool | None = None
    diagnostics: bool = False
    train_metrics: bool = True
    diagnostic_sample: int | None = DIAGNOSTIC_SAMPLE
    log_metrics: Callable[[Tensor], dict[str, float]] | None = None


def train(plan: Plan[S], oracle: Oracle, options: Options | None = None, theta0: Tensor | None = None) -> History:
    """Run ``plan`` on ``oracle`` from ``theta0`` (default 0) as ``options`` say; the :class:`History`.

    Logged every ``options.log_every`` steps and at the end, the private
    :data:`~dpopt.outputs.PRIVATE_METRICS`: the guarantee ε(δ) so far, ``test_error(θ_t)`` (θ_t: the
    algorithm's running output where it outputs an average, :class:`~dpopt.base.Averaged`, else the
    current iterate) and the expected data passes. ``final`` holds the same at the algorithm's
    output. After every logged step the ledger is checked against the plan (a mismatch stops the run
    as a privacy bug). Diagnostics (NOT PRIVATE) only when ``options.diagnostics``.

    Divergence: after every step θ_t is checked for non-finite entries (a function of the released
    iterates, so the check releases nothing more); the first failure is logged and stops the run,
    with ``History.diverged_at`` = t and ``stopped`` saying why. The checkpoint then holds that step
    (its ledger covers every step taken), and resuming it does not step again.
    """
    options = Options() if options is None else options
    noise = plan.algorithm.noise if isinstance(plan.algorithm, NamedNoise) else None
    if isinstance(oracle, SharedNoise) and (not isinstance(options.noise_source, SeededNoise | None)
                                            or isinstance(noise, Discrete)):
        raise _validate.DpoptError(
            f"noise_source={options.noise_source!r} / noise={noise!r} draws "
            "independently in every process: a data-parallel oracle needs the seeded noise, one draw shared by every "
            "rank")
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64) if theta0 is None else theta0.to(torch.float64)
    stepper = Stepper.start(plan, oracle, theta0=theta0, seed=options.seed, noise_source=options.noise_source)
    return drive(stepper, options, theta0)


def run(algorithm: Algorithm[S], oracle: Oracle, *, steps: int, seed: int | None = None, delta: float = 1e-5,
        theta0: Tensor | None = None, accountant: str = "pld", noise_source: NoiseSource | None = None,
        test_error: Callable[[Tensor], float] | None = None, log_every: int | None = None,
        checkpoint_path: str | Path | None = None, checkpoint_every: int | None = None,
        max_epsilon: float | None = None, progress: bool | None = None, diagnostics: bool = False,
        train_metrics: bool = True, diagnostic_sample: int | None = DIAGNOSTIC_SAMPLE,
        log_metrics: Callable[[Tensor], dict[str, float]] | None = None, allow_large_delta: bool = False) -> History:
    """Train ``algorithm`` (its noise multipliers as they are) on ``oracle`` for ``steps`` steps:
    :func:`train` of the plan ``Plan(algorithm, n=oracle.n, steps, delta, accountant)`` with the
    :class:`Options` the other arguments name. ``delta`` must be below 1/n unless
    ``allow_large_delta`` (:class:`~dpopt.plan.Plan` says why)."""
    plan = Plan(algorithm, n=oracle.n, steps=steps, delta=delta, accountant=accountant,
                allow_large_delta=allow_large_delta)
    options = Options(seed=seed, noise_source=noise_source, test_error=test_error, log_every=log_every,
                      checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every, max_epsilon=max_epsilon,
                      progress=progress, diagnostics=diagnostics, train_metrics=train_metrics,
                      diagnostic_sample=diagnostic_sample, log_metrics=log_metrics)
    return train(plan, oracle, options, theta0)


def drive(stepper: Stepper, options: Options, theta0: Tensor) -> History:
    """:func:`train`'s loop over ``stepper`` (at step 0, started from ``theta0`` with
    ``options.seed``): logging, diagnostics, checkpoints and divergence as :func:`train` says.
    With a checkpoint, its lock is held for the whole loop."""
    plan, oracle = stepper.plan, stepper.oracle
    log_every = (max(1, plan.steps // 50) if options.log_every is None
                 else _validate.positive_int("log_every", options.log_every))
    if options.diagnostic_sample is not None:
        _validate.positive_int("diagnostic_sample", options.diagnostic_sample)
    n = oracle.n
    for t in sorted({0, 1, plan.steps - 1}):
        _validate.positive_int("batch_size", int(plan.algorithm.sampler(t, n).expected_size), maximum=n,
                               maximum_name="n")
    stop_at = plan.steps if options.max_epsilon is None else plan.affordable_steps(options.max_epsilon)
    path = Path(options.checkpoint_path) if options.checkpoint_path else None
    described: dict[str, str] = {}
    if path is not None:  # the settings a checkpoint must match (the data digest is one pass over the data)
        theta0_digest = hashlib.sha256(theta0.cpu().numpy().tobytes()).hexdigest()
        described = resume.describe(
            plan.algorithm, oracle, steps=plan.steps,
            seed="from the operating system" if options.seed is None else options.seed, delta=plan.delta,
            theta0=theta0_digest, accountant=stepper.ledger.accountant, max_epsilon=options.max_epsilon,
            log_every=log_every, noise_source=type(stepper.source).__name__, diagnostics=options.diagnostics)
    progress = options.progress is not False  # None: shown
    with lock.held(path) if path is not None else contextlib.nullcontext():
        return _train(stepper, options, stop_at=stop_at, log_every=log_every, path=path, progress=progress,
                      described=described)


def _train(stepper: Stepper, options: Options, *, stop_at: int, log_every: int, path: Path | None, progress: bool,
           described: dict[str, str]) -> History:
    """:func:`drive` once its arguments are checked (and with ``path``, its lock held)."""
    plan, oracle = stepper.plan, stepper.oracle
    algorithm, steps, delta, n = plan.algorithm, plan.steps, plan.delta, oracle.n
    test_error, diagnostics, train_metrics = options.test_error, options.diagnostics, options.train_metrics
    log_metrics, diagnostic_sample = options.log_metrics, options.diagnostic_sample
    records: list[dict[str, float]] = []
    logged: list[dict[str, float]] = []
    visited, expected, spent, diverged_at = 0, 0.0, (0.0, 0.0), None
    key = None
    if path is not None:
        atomic.remove_stale(path)  # under the lock: no live writer of path
        key = journal.key()
        if path.exists():
            saved = snapshot.read(path, key, settings=described, plan=plan, stop_at=stop_at, once=False,
                                  progress=True)
            # resumed exactly (same generators): a replayed step releases what it released before
            stepper.restore(saved)
            assert saved.progress is not None  # (read refuses a snapshot without)
            so_far = saved.progress
            visited, expected, records, logged = so_far.visited, so_far.expected, so_far.records, so_far.diagnostics
            spent, diverged_at = (so_far.cpu_time_s, so_far.wall_time_s), so_far.diverged_at
    start = stepper.t
    sample = None if diagnostic_sample is None or diagnostic_sample >= n else torch.linspace(
        0, n - 1, diagnostic_sample).round().long()

    # what is logged: the algorithm's output so far where it defines one (averaging), else θ_t
    current = algorithm.running_output if isinstance(algorithm, Averaged) else (lambda state: state.theta)

    def measure(theta: Tensor) -> dict[str, float]:
        return {"epsilon": stepper.epsilon(delta), "test_error": test_error(theta) if test_error else math.nan,
                "expected_passes": expected / n}

    def gradient(theta: Tensor) -> Tensor:
        return oracle.gradient(theta) if sample is None else oracle.gradient_sum(theta, sample) / len(sample)

    def diagnose(theta: Tensor) -> dict[str, float]:
        return {
            "objective": float(oracle.loss(theta, sample)) if train_metrics else math.nan,
            "grad_norm": float(gradient(theta).norm()) if train_metrics else math.nan,
            "passes": visited / n, "cpu_time_s": clock.cpu, "wall_time_s": clock.wall,
        } | (log_metrics(theta) if log_metrics else {})

    def save() -> None:
        assert path is not None and key is not None  # saves only to a checkpoint path
        snapshot.write(path, stepper.snapshot(described, Progress(visited, expected, records, logged, clock.cpu,
                                                                  clock.wall, diverged_at)), key)

    bar = progress_bar(stop_at, initial=start, enabled=progress, desc=type(algorithm).__name__, unit="step")
    clock = StepClock(*spent)
    for t in range(start, stop_at if diverged_at is None else start):  # (a diverged checkpoint: no step)
        visited += stepper.step()
        expected += algorithm.sampler(t, n).expected_size
        bar.update()
        finite = all_finite(stepper.state.theta)
        if not finite or (t + 1) % log_every == 0 or t + 1 == stop_at:
            with clock.paused():
                theta_t = current(stepper.state)
                records.append({"step": t + 1} | measure(theta_t))
                if diagnostics:
                    logged.append({"step": t + 1} | diagnose(theta_t))
            if not finite:
                diverged_at = t + 1
                break
        if path is not None and options.checkpoint_every and (t + 1) % options.checkpoint_every == 0:
            with clock.paused():
                save()
    clock.stop()
    bar.close()
    done = stop_at if diverged_at is None else diverged_at
    if path is not None:
        save()  # of step done (stepper.t), a diverged run's too: its ledger holds every step taken
    theta = algorithm.output(stepper.state)
    report = None
    if diagnostics:
        own = dict(algorithm.diagnostics(stepper.state)) if isinstance(algorithm, SelfDiagnosing) else {}
        report = {"label": NOT_PRIVATE, "records": logged, "final": diagnose(theta) | own}
    stopped: str | None
    if diverged_at is not None:
        stopped = f"diverged at step {diverged_at}: θ has non-finite entries"
    else:
        stopped = None if stop_at == steps else f"max_epsilon={options.max_epsilon} reached"
    ledger = stepper.ledger
    note = None if ledger.accountant == ledger.requested_accountant else accountant_note(
        ledger.event(), ledger.relation, ledger.requested_accountant)
    if note is not None:
        warnings.warn(_validate.DpoptWarning(note), stacklevel=3)
    counts = dict(algorithm.released_counts(stepper.state)) if isinstance(algorithm, Reporting) else {}
    return History(records=records, final=measure(theta) | counts, theta=theta, delta=delta,
                   accountant=ledger.accountant, neighboring_relation=ledger.neighboring_relation,
                   steps_done=done, randomness=stepper.origin, stopped=stopped, diagnostics=report,
                   diverged_at=diverged_at, accountant_note=note)
