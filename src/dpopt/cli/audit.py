"""``dpopt audit``: an empirical lower bound on ε by the canary method (:mod:`dpopt.audit`), with a
verdict line; progress of the training steps on standard error (a bar on a terminal)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _validate
from ..algorithms import registry
from .common import Command, Request, add_knobs, add_seed, algorithm_help, knobs_of, seed_of, Subcommands, subcommand
from .output import Output

if TYPE_CHECKING:
    from ..audit import BoundKind, Engine, ThreatModel

#: The audit's own defaults of hyper-parameters it sets (flags of the same names).
DEFAULTS = {"batch_size": 50, "lr": 1.0}


@dataclass(frozen=True, kw_only=True)
class AuditRequest(Request):
    """Audit ``algorithm`` calibrated to (``epsilon``, ``delta``) for ``steps`` steps with the
    hyper-parameters ``knobs`` on ``dataset_size`` background records and one canary: ``runs``
    canaries per side (or ``one_run``), scored under ``threat_model`` into a ``bound`` at
    ``confidence``, trained by ``engine``."""

    algorithm: str
    epsilon: float
    delta: float
    steps: int
    dataset_size: int
    knobs: dict[str, object]
    runs: int
    threat_model: ThreatModel
    bound: BoundKind
    engine: Engine
    one_run: bool
    confidence: float
    seed: int

    @classmethod
    def parse(cls, args: argparse.Namespace) -> AuditRequest:
        from .. import audit

        registry.entry(args.algorithm)
        seed = seed_of(args)
        return cls(algorithm=args.algorithm, epsilon=_validate.positive("epsilon", args.epsilon), delta=args.delta,
                   steps=args.steps, dataset_size=_validate.positive_int("dataset_size", args.dataset_size),
                   knobs=knobs_of(args, "audit"), runs=args.runs,
                   threat_model=audit.THREAT_MODELS[_validate.one_of("threat_model", args.threat_model,
                                                                     audit.THREAT_MODELS)],
                   bound=audit.KINDS[_validate.one_of("bound", args.bound, audit.KINDS)],
                   engine=audit.ENGINES[_validate.one_of("engine", args.engine, audit.ENGINES)], one_run=args.one_run,
                   confidence=args.confidence, seed=0 if seed is None else seed, json=args.json)


def handle(request: AuditRequest) -> Output:
    """Plan the algorithm at (ε, δ) on the canary world's n + 1 records, then audit it. It is built
    for the records of D, so that its batch sizes fit both worlds: under add/remove-one D has the
    n background records alone."""
    from dp_accounting import NeighboringRelation

    from .. import audit
    from ..plan import plan_for

    entry = registry.entry(request.algorithm)
    n = request.dataset_size
    algorithm = entry.build(registry.Knobs.of(n + 1, **request.knobs))
    if algorithm.relation() == NeighboringRelation.ADD_OR_REMOVE_ONE:
        algorithm = entry.build(registry.Knobs.of(n, **request.knobs))
    # an audit's δ is the δ its claim is checked at, whatever the world's n
    plan = plan_for(algorithm, n=n + 1, steps=request.steps, delta=request.delta,
                    epsilon=request.epsilon if entry.private else None, allow_large_delta=True)
    progress = not request.json
    if request.one_run:
        result = audit.audit_one_run(plan, name=request.algorithm, confidence=request.confidence,
                                     engine=request.engine, seed=request.seed, progress=progress)
    else:
        result = audit.audit(plan, name=request.algorithm, runs=request.runs, confidence=request.confidence,
                             seed=request.seed, threat_model=request.threat_model, bound=request.bound,
                             engine=request.engine, progress=progress)
    row = {"algorithm": result.algorithm, "threat model": result.threat_model, "claimed ε": result.claimed_epsilon,
           "δ": result.delta, f"lower bound ({result.bound})": result.epsilon_lower_bound,
           "refutes ε ≥": result.smallest_refutable_epsilon, "runs": result.runs, "seconds": result.seconds}
    return Output(result.to_dict(), table=[row], lines=[result.verdict])


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "audit", Command(AuditRequest.parse, handle),
                     "empirical ε lower bound by the canary method (see dpopt.audit)")
    named = sub.add_mutually_exclusive_group(required=True)
    named.add_argument("--algorithm", help=algorithm_help())
    named.add_argument("--algo", dest="algorithm", help=argparse.SUPPRESS)  # the former name, kept working
    sub.add_argument("--epsilon", type=float, required=True, help="the claimed ε the algorithm is calibrated to")
    sub.add_argument("--delta", type=float, default=1e-5, help="the δ of the claim")
    sub.add_argument("--steps", type=int, default=20, help="training steps of every run")
    sub.add_argument("--dataset-size", type=int, default=99, help="background records (the canary is one more)")
    add_knobs(sub, "audit", defaults=DEFAULTS)
    sub.add_argument("--runs", type=int, default=10_000, help="canaries audited on each of D and D plus the canary")
    sub.add_argument("--threat-model", default="releases", help="releases (the adversary sees every noised "
                     "release) or final (only the output)")
    sub.add_argument("--bound", default="gaussian-dp", help="gaussian-dp (a fitted Gaussian-DP estimate) or "
                     "clopper-pearson (non-parametric); the JSON holds both")
    sub.add_argument("--engine", default="glm", help="glm (closed-form gradients), ghost or vmap (TorchModel)")
    sub.add_argument("--one-run", action="store_true", help="one training run with every record the run uses "
                     "as a canary, each included with probability 1/2 (for models too costly to train many times)")
    sub.add_argument("--confidence", type=float, default=0.95, help="the confidence of the lower bound")
    add_seed(sub, "the audit's seed (its runs are reproducible; default 0)")
