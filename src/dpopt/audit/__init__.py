"""Empirical privacy audit: a statistical lower bound on ε, by the canary method.

Jagielski, Ullman, Oprea (2020); Nasr, Song, Thakurta, Papernot, Carlini (2021); Nasr et al.
(2023). Train many times on a data set D and on its neighbour D′ (D with one canary record,
:mod:`dpopt.audit.worlds`), let the adversary of the threat model score what it sees of each run
(:mod:`dpopt.audit.statistics`), and turn the scores into a lower bound on ε at δ that holds
with probability ≥ ``confidence`` (:mod:`dpopt.audit.bounds`). A bound above the claim refutes
the claim: the code's privacy arithmetic does not match what the code does.

The runs are :func:`dpopt.train.step`, the code :func:`dpopt.run` runs, on the engine chosen
(the GLM closed form, or :class:`~dpopt.oracles.TorchModel` with the ghost or vmap engine).
:func:`audit` trains on the audit's own linear world, whose canaries it controls exactly;
:func:`audit_module` on a user's own module, loss and records, with the engine they train with
(and any preparation of the data they run first). The claimed ε is the accountant's ε(δ) of the
algorithm's ``planned_event``, the description that calibrates it and that the ledger records.
``smallest_refutable_epsilon`` states the audit's power: the smallest true ε this configuration
would refute; ``verdict`` says it all in one line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .. import _validate, train
from ..accounting import Ledger, PlanMismatch, count_steps, guarantee, is_filter
from ..algorithms import registry
from ..base import S, Algorithm
from ..json_types import JsonObject
from ..plan import Plan, plan_for
from ..progress import Bar, bar as progress_bar
from ..oracles import ghost, records
from . import bounds, one_run
from .bounds import KINDS, BoundKind, ClopperPearson, GaussianDP, clopper_pearson_upper
from .statistics import THREAT_MODELS, Final, Releases, ThreatModel, observe
from . import worlds
from .worlds import CANARIES, ENGINES, Canary, ClosedForm, Engine, Module, Pair, Prepared, UserModule, world

__all__ = ["audit", "audit_module", "audit_one_run", "AuditResult", "Canary", "CANARIES", "ENGINES", "THREAT_MODELS",
           "KINDS", "Final", "Releases", "ClosedForm", "Module", "UserModule", "Prepared", "ClopperPearson",
           "GaussianDP", "clopper_pearson_upper", "observations"]

#: The most floats the observations of one world may take (8 bytes each: 800 MB).
MAX_OBSERVED = 100_000_000


@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` measured; :meth:`to_dict` is the ``dpopt audit --json`` payload.

    ``epsilon_lower_bound`` is of the kind ``bound``; ``bounds`` holds every kind computed on the
    same runs; ``evidence``: what the bound rests on (the error-rate upper bounds of the test, or
    the one-run audit's guesses). ``runs``: canaries audited per side (all canaries for one run).
    ``smallest_refutable_epsilon``: the smallest true ε (of a Gaussian-shaped mechanism) this
    configuration refutes at its median outcome."""

    algorithm: str
    threat_model: str
    engine: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    bound: str
    bounds: dict[str, float]
    confidence: float
    runs: int
    slots_per_run: int
    evidence: dict[str, float]
    smallest_refutable_epsilon: float
    seconds: float

    def to_dict(self) -> JsonObject:
        return dict(self.__dict__) | {"verdict": self.verdict}

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claim: with probability ≥ ``confidence`` the claim is false."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def verdict(self) -> str:
        """One line: refuted or not, the bound at its confidence, and the audit's power."""
        level = f"at {100 * self.confidence:g} % (power: refutes ε ≥ {_number(self.smallest_refutable_epsilon)})"
        claim, found = _number(self.claimed_epsilon), _number(self.epsilon_lower_bound)
        if self.flagged:
            return f"REFUTED: claim ε = {claim} is below the lower bound {found} {level}"
        return f"claim ε = {claim} not refuted: lower bound {found} {level}"


def _number(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


def observations(plan: Plan[S], place: Pair, engine: Engine, threat: ThreatModel, *,
                 present: bool | Sequence[bool], runs: int, seed: int, bar: Bar | None = None) -> np.ndarray:
    """What the adversary sees of ``runs`` canary slots of D′ (``present``) or D: trajectories
    [runs, steps + 1, k] or outputs [runs, k] of the k watched coordinates, from ⌈runs / slots⌉
    training runs of ``plan`` seeded seed, seed+1, …, each step counted on ``bar``. The runs are
    :func:`dpopt.train.step`'s, on D′'s n records or, under add/remove-one, on D's one fewer. Each
    run's ledger is checked to hold as many events as the plan (:func:`recorded_every_release`):
    a release left out of the ledger is invisible to the canary's scores."""
    algorithm, steps = plan.algorithm, plan.steps
    oracle = engine.oracle(*place.records(present=present))
    theta0 = engine.start(oracle)
    keyed = train.keyed(algorithm)
    seen = []
    for r in range(math.ceil(runs / place.slots)):
        sample_gen, source, _ = train.randomness(seed + r)
        state = algorithm.init(theta0, steps, sample_gen)
        ledger = plan.ledger()
        path = [place.seen(observe(threat, algorithm, state))] if threat.observes_steps() else []
        for t in range(steps):
            state, _ = train.step(algorithm, oracle, state, t, ledger, sample_gen, source, keyed=keyed)
            if threat.observes_steps():
                path.append(place.seen(observe(threat, algorithm, state)))
            if bar is not None:
                bar.update()
        recorded_every_release(ledger, plan)
        seen.append(torch.stack(path, 1) if path else place.seen(observe(threat, algorithm, state)))
    return torch.cat(seen).double().numpy()[:runs]


def recorded_every_release(ledger: Ledger, plan: Plan[S]) -> None:
    """Raise ``PlanMismatch`` unless a finished run's ``ledger`` holds as many events as ``plan``
    (releases, counted by :func:`dpopt.accounting.count_steps`; under a privacy filter, whose
    releases are data-dependent, unless they fit its budget). What each event says is the
    statistics' to refute (a mutant whose noise is smaller than its claim records fewer-noise events
    honestly, and its scores show it); a release with no event at all changes no score."""
    if is_filter(plan.run_event):
        guarantee(ledger.event(), plan.run_event)
        return
    recorded, planned = count_steps(ledger.event()), count_steps(plan.run_event)
    if recorded != planned:
        raise PlanMismatch(f"an audited run recorded {recorded} events where its plan has {planned}: a release's "
                           "event is missing from the ledger (a privacy bug no canary score can show)")


def _bar(name: str, steps: int, progress: bool) -> Bar:
    """A progress bar of an audit's ``steps`` training steps on stderr (none unless ``progress``;
    plain lines where stderr is not a terminal)."""
    return progress_bar(steps, desc=f"audit {name}", unit="step", enabled=progress)


def _inclusion_rate(algorithm: Algorithm[S], n: int) -> float:
    """q: the probability that a step's batch holds a given record (1 for full batches)."""
    return min(1.0, algorithm.sampler(0, n).expected_size / n)


def audit(plan: Plan[S], *, name: str, runs: int = 10_000, confidence: float = 0.95,
          threat_model: ThreatModel = Releases(), bound: BoundKind = GaussianDP(), engine: Engine = ClosedForm(),
          canary: Canary | None = None, seed: int = 0, progress: bool = False) -> AuditResult:
    """Audit ``plan`` (its algorithm calibrated, for D′'s n = ``plan.n`` records) on the audit's own
    linear world (:func:`dpopt.audit.worlds.world`): ``runs`` canary slots on each of D and D′
    (:func:`observations`), scored under ``threat_model`` and turned into an ε lower bound at the
    plan's δ of the kind ``bound``, beside the plan's claimed ε(δ) and the smallest ε this
    configuration refutes. ``progress``: a bar of the training steps on stderr."""
    _checked(runs, confidence)
    place = world(plan.algorithm, name, plan.n, plan.steps, canary)
    return _audit(plan, place, engine, name=name, runs=runs, confidence=confidence, threat_model=threat_model,
                  bound=bound, seed=seed, progress=progress)


def audit_module(module: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], data: object, *,
                 algorithm: str | Algorithm[S] = "dp-sgd", epsilon: float | None, steps: int, delta: float = 1e-5,
                 batch_size: int = 256, clip: float = 1.0, lr: float = 0.1, engine: str = "ghost",
                 microbatch_size: int = 512, known_layers: ghost.Registry = ghost.KNOWN_LAYERS,
                 canary: tuple[Tensor, Tensor] | None = None,
                 prepare: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None, runs: int = 1_000,
                 confidence: float = 0.95, threat_model: ThreatModel = Releases(), bound: BoundKind = GaussianDP(),
                 seed: int = 0, progress: bool = False, **options: object) -> AuditResult:
    """Audit training ``module`` on ``loss_fn`` (one loss per record) as :class:`dpopt.Private`
    would, with the same arguments (``algorithm`` by name, built with ``batch_size``, ``clip``,
    ``lr`` and ``options``, or an algorithm object; ``epsilon``: calibrate to (ε, ``delta``) for
    ``steps`` steps, None keeps an object's noise; ``engine``, ``microbatch_size``,
    ``known_layers``).

    ``data``: the records, a pair of tensors ``(X, y)`` or a ``TensorDataset``: D. D′ is D with
    ``canary`` (a record ``(x, y)``; default :func:`dpopt.audit.worlds.default_canary`) added
    (add/remove-one: n + 1 records) or in place of the first record a run uses (replace-one),
    as the algorithm's relation says. The algorithm is built for D's n, calibrated and claimed
    for D′'s (the run on D′ is then exactly what the claim describes). ``prepare(X, y) -> (X, y)``,
    if given, runs on D and on D′ before training (the preparation of your pipeline that reads the
    whole data set). The adversary sees every coordinate of θ (``threat_model``); ``runs``
    training runs on each of D and D′ start at the module's parameters. Keep the data and the
    module small: each run is a full training run of ``steps`` steps. ``progress``: a bar of the
    training steps on stderr."""
    X, y = _tensors(data)
    if isinstance(algorithm, str) and epsilon is None:
        raise _validate.DpoptError(f"epsilon=None keeps the noise multipliers of an algorithm object; "
                                   f"algorithm={algorithm!r} by name needs an epsilon to calibrate to")
    built = _built(algorithm, len(X), batch_size=batch_size, lr=lr, clip=clip, options=options)
    _checked(runs, confidence)
    place = worlds.neighbours(built, X, y, _validate.positive_int("steps", steps), canary)
    plan = plan_for(built, n=place.n, steps=steps, delta=delta, epsilon=epsilon, allow_large_delta=True)
    parameters = sum(p.numel() for p in module.parameters() if p.requires_grad)
    observed = runs * (steps + 1 if threat_model.observes_steps() else 1) * parameters
    if observed > MAX_OBSERVED:
        raise _validate.DpoptError(f"runs={runs} × steps={steps} × {parameters} parameters = {observed:,} observed "
                                   f"numbers per world exceed {MAX_OBSERVED:,}: audit a smaller module, fewer runs "
                                   "or steps, or with threat_model=Final()")
    user: Engine = UserModule(module, loss_fn, engine, microbatch_size, known_layers)
    return _audit(plan, place, user if prepare is None else Prepared(user, prepare),
                  name=algorithm if isinstance(algorithm, str) else type(algorithm).__name__, runs=runs,
                  confidence=confidence, threat_model=threat_model, bound=bound, seed=seed, progress=progress)


def _tensors(data: object) -> tuple[Tensor, Tensor]:
    """The records of ``data`` as two tensors (the audit adds the canary to them)."""
    held = records.of(data)
    if not isinstance(held, records.Tensors):
        raise _validate.DpoptError(f"data={type(data).__name__} is read lazily; the audit needs the records in memory: "
                                   "pass (X, y) tensors or a TensorDataset")
    return held.X, held.y


def _built(algorithm: str | Algorithm[S], n: int, *, batch_size: int, lr: float, clip: float,
           options: Mapping[str, object]) -> Algorithm[S]:
    """The algorithm object: by name, built for D's n records (as :class:`dpopt.Private` builds it
    for the user's data), else as given."""
    if not isinstance(algorithm, str):
        if options:
            raise _validate.DpoptError(f"options {sorted(options)} build an algorithm by name; algorithm="
                                       f"{type(algorithm).__name__} is already built")
        return algorithm
    return registry.build(algorithm, n=n, batch_size=batch_size, lr=lr, clip=clip, **options)


def _checked(runs: int, confidence: float) -> None:
    if _validate.positive_int("runs", runs) < 4:
        raise _validate.DpoptError(f"runs={runs} must be >= 4 (half of them choose the test)")
    _validate.open_unit("confidence", confidence)


def _audit(plan: Plan[S], place: Pair, engine: Engine, *, name: str, runs: int, confidence: float,
           threat_model: ThreatModel, bound: BoundKind, seed: int, progress: bool) -> AuditResult:
    """The audit of ``plan`` on the pair ``place`` (see :func:`audit`)."""
    claimed, delta = plan.epsilon(), plan.delta
    start = time.perf_counter()
    with _bar(name, 2 * math.ceil(runs / place.slots) * plan.steps, progress) as bar:
        out, inside = (observations(plan, place, engine, threat_model, present=present, runs=runs, seed=seed + offset,
                                    bar=bar) for present, offset in ((False, 0), (True, runs)))
    q = _inclusion_rate(plan.algorithm, place.n)
    found = {kind.name: bounds.lower_bound(kind, out, inside, delta, confidence,
                                          lambda o, i: threat_model.scores(o, i, q)) for kind in KINDS.values()}
    chosen = found[bound.name]
    return AuditResult(
        algorithm=name, threat_model=threat_model.name, engine=engine.name, claimed_epsilon=claimed, delta=delta,
        epsilon_lower_bound=chosen.epsilon, bound=bound.name, bounds={k: b.epsilon for k, b in found.items()},
        confidence=confidence, runs=runs, slots_per_run=place.slots,
        evidence={"false_positive_rate": chosen.fpr, "false_negative_rate": chosen.fnr},
        smallest_refutable_epsilon=bounds.smallest_refutable_epsilon(bound, claimed, runs - runs // 2, delta,
                                                                     confidence),
        seconds=time.perf_counter() - start)


def audit_one_run(plan: Plan[S], *, name: str, canaries: int | None = None, confidence: float = 0.95,
                  engine: Engine = ClosedForm(), seed: int = 0, progress: bool = False) -> AuditResult:
    """One-run audit (Steinke, Nasr, Jagielski 2023; :mod:`dpopt.audit.one_run`): ``canaries``
    slots (default: every record the run uses), each holding the canary with probability ½ (the
    auditor's coin, from ``seed``), one training run, each slot scored by −output_r; the guesses
    k₊ = k₋ are planned from the claim alone (a Gaussian mechanism of the claimed ε's μ), so planning
    spends no confidence.

    For models where many runs cost too much. It is weaker than many runs (ε-randomized-response
    guesses, no trade-off curve): ``smallest_refutable_epsilon`` says how much. ``progress``: a
    bar of the run's steps on stderr."""
    algorithm, n, steps, delta = plan.algorithm, plan.n, plan.steps, plan.delta
    _validate.open_unit("confidence", confidence)
    claimed = plan.epsilon()
    start = time.perf_counter()
    if canaries is None:
        canaries = len(worlds.used_positions(algorithm, n, steps))
    place = world(algorithm, name, n, steps, slots=_validate.positive_int("canaries", canaries))
    included = np.random.default_rng(seed).random(place.slots) < 0.5
    with _bar(name, steps, progress) as bar:
        outputs = observations(plan, place, engine, Final(), present=included.tolist(), runs=place.slots,
                               seed=seed + 1, bar=bar)[:, 0]
    separation = bounds.gaussian_mu(claimed, delta) if math.isfinite(claimed) else 10.0
    k, _ = one_run.plan_guesses(place.slots, separation, delta, confidence)
    guessed_in, guessed_out = one_run.guesses(-outputs, k, k)
    correct = one_run.correct_guesses(guessed_in, guessed_out, included)
    found = one_run.epsilon_lower_bound(correct, 2 * k, place.slots, delta, confidence)
    return AuditResult(
        algorithm=name, threat_model=Final().name, engine=engine.name, claimed_epsilon=claimed, delta=delta,
        epsilon_lower_bound=found, bound="one-run", bounds={"one-run": found}, confidence=confidence,
        runs=place.slots, slots_per_run=place.slots, evidence={"guesses": 2 * k, "correct": correct},
        smallest_refutable_epsilon=_one_run_power(place.slots, claimed, delta, confidence),
        seconds=time.perf_counter() - start)


def _one_run_power(canaries: int, claimed: float, delta: float, confidence: float) -> float:
    """The ε_μ(δ) of the least μ whose planned one-run audit's expected bound exceeds the claim."""
    if not math.isfinite(claimed):
        return math.inf
    mu, high = bounds.gaussian_mu(claimed, delta), None
    for _ in range(12):  # doubling: the expected bound is capped by the number of canaries
        if one_run.expected_bound(canaries, mu, delta, confidence)[1] > claimed:
            high = mu
            break
        mu *= 2
    if high is None:
        return math.inf
    low = high / 2
    for _ in range(10):  # μ to 0.1 % of the bracket
        mid = (low + high) / 2
        low, high = (low, mid) if one_run.expected_bound(canaries, mid, delta, confidence)[1] > claimed else (mid, high)
    return bounds.gaussian_epsilon(high, delta)
