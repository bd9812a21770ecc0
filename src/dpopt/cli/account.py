"""``dpopt account`` (ε of a mechanism run ``--steps`` times, or ``--explain aclip``) and ``dpopt
calibrate`` (its inverse: the noise multiplier for a target ε). Neither imports torch."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import _validate
from ..names import ACCOUNTANTS
from .common import Command, Request, Subcommands, subcommand
from .output import Output

if TYPE_CHECKING:
    import dp_accounting as dpa
    from dp_accounting import NeighboringRelation

MECHANISMS = ("poisson-gaussian", "wor-gaussian", "gaussian", "tree", "banded-mf")
#: The mechanisms whose batches are drawn from --dataset-size records by --batch-size (Poisson also by a rate).
SAMPLED = ("poisson-gaussian", "wor-gaussian", "banded-mf")
#: ``banded-mf``'s calibration: its noise multiplier to 4 digits (tolerance 1e-4, on a PLD grid of 1e-4),
#: so that the printed multiplier can be compared with other implementations of the recipe.
BANDED_PRECISION = 1e-4
EXPLAINED = ("aclip",)


@dataclass(frozen=True)
class Mechanism:
    """A mechanism by name run ``steps`` times: Poisson-sampled Gaussian at ``rate``, Gaussian on
    batches of ``batch_size`` of ``n`` records drawn without replacement, the Gaussian on every
    record, one binary ``tree`` over ``steps`` increments (each record in one), or ``banded-mf``:
    banded matrix factorisation with ``bands`` b over cyclic Poisson batches of expected size
    ``batch_size`` (:func:`dpopt.correlation.events.banded_event`: ⌈T/b⌉ rounds of the Poisson-sampled
    Gaussian at the group rate b·B/n; b = 1 is ``poisson-gaussian``)."""

    name: str
    steps: int
    rate: float | None = None
    n: int | None = None
    batch_size: int | None = None
    bands: int = 1

    @classmethod
    def parse(cls, args: argparse.Namespace) -> Mechanism:
        steps = _validate.positive_int("steps", args.steps)
        if args.bands is not None and args.mechanism != "banded-mf":
            raise _validate.DpoptError(f"--bands is for mechanism=banded-mf, not mechanism={args.mechanism}")
        if args.mechanism == "poisson-gaussian" and args.sampling_rate is not None:
            return cls(args.mechanism, steps, rate=_validate.unit_interval("sampling_rate", args.sampling_rate))
        if args.mechanism in SAMPLED:
            if args.dataset_size is None or args.batch_size is None:
                alternative = " --sampling-rate or" if args.mechanism == "poisson-gaussian" else ""
                raise _validate.DpoptError(f"mechanism={args.mechanism} needs{alternative} --dataset-size and "
                                           "--batch-size")
            n = _validate.positive_int("dataset_size", args.dataset_size)
            b = _validate.positive_int("batch_size", args.batch_size, maximum=n, maximum_name="dataset_size")
            if args.mechanism != "banded-mf":
                return cls(args.mechanism, steps, rate=b / n, n=n, batch_size=b)
            bands = _validate.positive_int("--bands", 1 if args.bands is None else args.bands)
            if bands * b > n:
                raise _validate.DpoptError(f"--bands={bands} times --batch-size={b} must be <= --dataset-size={n}: "
                                           "each group of n/b records is sampled at rate b·B/n <= 1")
            return cls(args.mechanism, steps, rate=bands * b / n, n=n, batch_size=b, bands=bands)
        return cls(args.mechanism, steps)

    @property
    def precision(self) -> dict[str, float]:
        """How finely calibration solves for the noise (:func:`dpopt.accounting.solve_noise`'s
        ``tolerance`` and ``grid``; {}: its defaults)."""
        return {"tolerance": BANDED_PRECISION, "grid": BANDED_PRECISION} if self.name == "banded-mf" else {}

    @property
    def described(self) -> dict[str, int]:
        """What the outputs add to name the mechanism: banded-mf's bands."""
        return {"bands": self.bands} if self.name == "banded-mf" else {}

    def event(self, z: float) -> tuple[dpa.DpEvent, NeighboringRelation]:
        """The composed event of :attr:`steps` runs with noise multiplier z, and its relation."""
        import dp_accounting as dpa
        from dp_accounting import NeighboringRelation

        if self.name == "banded-mf" and self.rate is not None:
            from ..correlation.events import banded_event

            return banded_event(z, self.rate, self.steps, self.bands), NeighboringRelation.ADD_OR_REMOVE_ONE
        if self.name == "tree":  # dpopt.mechanisms.tree_event, without importing torch
            return dpa.SingleEpochTreeAggregationDpEvent(z, [self.steps]), NeighboringRelation.REPLACE_SPECIAL
        if self.name == "gaussian":
            return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), self.steps), NeighboringRelation.REPLACE_ONE
        if self.name == "poisson-gaussian":
            event = dpa.PoissonSampledDpEvent(self.rate, dpa.GaussianDpEvent(z))
            return dpa.SelfComposedDpEvent(event, self.steps), NeighboringRelation.ADD_OR_REMOVE_ONE
        sampled = dpa.SampledWithoutReplacementDpEvent(self.n, self.batch_size, dpa.GaussianDpEvent(z))
        return dpa.SelfComposedDpEvent(sampled, self.steps), NeighboringRelation.REPLACE_ONE


@dataclass(frozen=True, kw_only=True)
class AccountRequest(Request):
    """ε at ``delta`` of ``mechanism`` with noise multiplier ``noise_multiplier``."""

    mechanism: Mechanism
    noise_multiplier: float
    delta: float
    accountant: str


@dataclass(frozen=True, kw_only=True)
class ExplainRequest(Request):
    """``--explain aclip``: what the AClip paper's noise formula for ``epsilon`` really gives, on
    ``dataset_size`` records in batches of ``batch_size``, ``restarts`` stages of ``steps`` steps."""

    epsilon: float
    delta: float
    dataset_size: int
    batch_size: int
    steps: int
    restarts: int


def parse_account(args: argparse.Namespace) -> AccountRequest | ExplainRequest:
    if args.explain is not None:
        _validate.one_of("explain", args.explain, EXPLAINED)
        for name in ("epsilon", "dataset_size", "batch_size"):
            if getattr(args, name) is None:
                raise _validate.DpoptError(f"--explain aclip needs --{name.replace('_', '-')}")
        return ExplainRequest(epsilon=args.epsilon, delta=args.delta, dataset_size=args.dataset_size,
                              batch_size=args.batch_size, steps=args.steps, restarts=args.restarts, json=args.json)
    if args.mechanism is None or args.noise_multiplier is None:
        raise _validate.DpoptError("account needs --mechanism and --noise-multiplier (or --explain aclip)")
    z = _validate.positive("noise_multiplier", args.noise_multiplier)
    delta = _validate.open_unit("delta", args.delta)
    return AccountRequest(mechanism=Mechanism.parse(args), noise_multiplier=z, delta=delta,
                          accountant=args.accountant, json=args.json)


def account(request: AccountRequest | ExplainRequest) -> Output:
    if isinstance(request, ExplainRequest):
        return _explain(request)
    from ..accounting import RELATION_NAMES, accountant_for, epsilon_of

    event, relation = request.mechanism.event(request.noise_multiplier)
    grid = request.mechanism.precision.get("grid")
    result = {"epsilon": epsilon_of(event, request.delta, relation, request.accountant, grid), "delta": request.delta,
              "accountant": accountant_for(event, relation, request.accountant),
              "neighboring_relation": RELATION_NAMES[relation], "mechanism": request.mechanism.name,
              "noise_multiplier": request.noise_multiplier, "steps": request.mechanism.steps,
              **request.mechanism.described}
    return Output(result, table=[_row(result)])


def _explain(request: ExplainRequest) -> Output:
    """The ε the AClip paper's noise formula really gives (see ``paper_noise``)."""
    from ..algorithms.aclip import paper_noise

    result = paper_noise(epsilon=request.epsilon, delta=request.delta, n=request.dataset_size,
                         batch_size=request.batch_size, steps=request.steps, restarts=request.restarts)
    rows = [{"sensitivity": row["sensitivity"], "noise multiplier": row["noise_multiplier"], "ε": row["epsilon"],
             "accountant": result["accountant"], "relation": result["neighboring_relation"]}
            for row in result["rows"]]
    line = (f"AClip paper's noise for ε = {result['claimed_epsilon']:g}, δ = {result['delta']:g}, "
            f"q = {result['sampling_rate']:.4g}, {result['restarts']} × {result['steps_per_stage']} steps (per stage "
            f"ε̂ = {result['stage_epsilon']:.4g}, δ̂ = {result['stage_delta']:.3g}): σ̂/λ = "
            f"{result['sigma_over_lambda']:.6g}; the table gives the exact ε of that noise for each sensitivity")
    return Output(result, lines=[line], table=rows)


@dataclass(frozen=True, kw_only=True)
class CalibrateRequest(Request):
    """The noise multiplier of ``mechanism`` whose ε at ``delta`` is ``epsilon`` (within 1 % below)."""

    mechanism: Mechanism
    epsilon: float
    delta: float
    accountant: str

    @classmethod
    def parse(cls, args: argparse.Namespace) -> CalibrateRequest:
        epsilon = _validate.positive("epsilon", args.epsilon)
        delta = _validate.open_unit("delta", args.delta)
        return cls(mechanism=Mechanism.parse(args), epsilon=epsilon, delta=delta, accountant=args.accountant,
                   json=args.json)


def calibrate(request: CalibrateRequest) -> Output:
    from ..accounting import RELATION_NAMES, accountant_for, solve_noise

    mechanism = request.mechanism
    relation = mechanism.event(1.0)[1]
    z, achieved = solve_noise(lambda s: mechanism.event(s)[0], epsilon=request.epsilon, delta=request.delta,
                              relation=relation, accountant=request.accountant, **mechanism.precision)
    result = {"noise_multiplier": z, "epsilon": achieved, "target_epsilon": request.epsilon, "delta": request.delta,
              "accountant": accountant_for(mechanism.event(z)[0], relation, request.accountant),
              "neighboring_relation": RELATION_NAMES[relation], "mechanism": mechanism.name, "steps": mechanism.steps,
              **mechanism.described}
    return Output(result, table=[_row(result)])


def _row(result: Mapping[str, object]) -> dict[str, object]:
    return {"mechanism": result["mechanism"], "steps": result["steps"],
            "noise multiplier": f"{result['noise_multiplier']:.6g}", "ε": f"{result['epsilon']:.6g}",
            "δ": result["delta"], "accountant": result["accountant"],
            "relation": result["neighboring_relation"]}


def add_parser(commands: Subcommands) -> None:
    accounted = subcommand(commands, "account", Command(parse_account, account), "ε of a mechanism run --steps times")
    calibrated = subcommand(commands, "calibrate", Command(CalibrateRequest.parse, calibrate),
                            "noise multiplier for a target ε (the inverse of account)")
    for sub in (accounted, calibrated):
        if sub is accounted:
            sub.add_argument("--mechanism", choices=MECHANISMS, help="the mechanism run every step")
            sub.add_argument("--noise-multiplier", type=float, help="noise standard deviation over the sensitivity")
            sub.add_argument("--explain", help="aclip: the ε the AClip paper's noise formula σ̂ = "
                             "λm√(N ln(1/δ))/(nε) really gives (needs --epsilon, --dataset-size, --batch-size, "
                             "--steps, --delta)")
            sub.add_argument("--epsilon", type=float, help="with --explain: the ε the paper's formula targets")
            sub.add_argument("--restarts", type=int, default=1, help="with --explain aclip: τ stages of --steps each")
        else:
            sub.add_argument("--mechanism", choices=MECHANISMS, required=True, help="the mechanism run every step")
            sub.add_argument("--epsilon", type=float, required=True, help="the target ε")
        sub.add_argument("--sampling-rate", type=float, help="poisson-gaussian: the sampling rate q")
        sub.add_argument("--dataset-size", type=int, help="records n (with --batch-size: q = b/n)")
        sub.add_argument("--batch-size", type=int, help="the (expected) batch size B")
        sub.add_argument("--bands", type=int, help="banded-mf: the bands b >= 1 (groups of cyclic Poisson sampling; "
                         "default 1)")
        sub.add_argument("--steps", type=int, required=True, help="how often the mechanism runs")
        sub.add_argument("--delta", type=float, required=True, help="the δ of the guarantee")
        sub.add_argument("--accountant", choices=ACCOUNTANTS, default="pld", help="privacy loss distributions "
                         "(tightest) or Rényi DP")
