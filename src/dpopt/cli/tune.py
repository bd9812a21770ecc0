"""``dpopt tune``: private tuning of one algorithm on a registered data set or a file of one's own
(GLM models), scored on a held-out validation split of the training file
(:mod:`dpopt.tuning.task`); ``tuned.json`` in ``--out``, which a finished tuning never shares with
another (its ε is spent)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import _validate, report
from ..names import GLMS
from .common import (Command, add_delta, add_knobs, add_seed, algorithm_help, knobs_of, seed_of, Subcommands,
                     subcommand)
from .output import Output
from .sources import Source, TrainingRequest, add_flags

if TYPE_CHECKING:
    from ..tuning import Space, Trials, Tuned

#: What ``tuned.json`` and the summary say of the validation split (its share of the training file).
UNPROTECTED = ("the validation split ({share:.0%} of the training file, a fixed public permutation) is not protected "
               "by the guarantee: the selected candidate's exact score on it (validation_score) is released")


def _numbers(name: str, text: str) -> list[float]:
    try:
        return [float(value) for value in text.split(",")]
    except ValueError:
        raise _validate.DpoptError(f"{name}={text!r} must be comma-separated numbers") from None


def _grid_values(name: str, text: str) -> tuple[float | int | str, ...]:
    """``--grid NAME=V1,V2``'s values, as the hyper-parameter ``name`` declares them: names for one
    with choices (e.g. ``optimizer``), integers >= 1 for an integer one (e.g. ``bands``), numbers
    otherwise."""
    from ..algorithms.registry import REGISTRY

    field = REGISTRY.declared()[name]
    choices = field.metadata["choices"]
    if choices:
        return tuple(_validate.one_of(f"grid {name}", value, choices) for value in text.split(","))
    numbers = _numbers(f"grid {name}", text)
    if _integer(name):
        if not all(number.is_integer() for number in numbers):
            raise _validate.DpoptError(f"grid {name}={text!r} must be comma-separated integers >= 1")
        return tuple(_validate.positive_int(f"grid {name}", int(number)) for number in numbers)
    return tuple(numbers)


def _integer(name: str) -> bool:
    """Whether the hyper-parameter ``name`` takes integers (a grid of them, never a range)."""
    from ..algorithms.registry import REGISTRY

    field = REGISTRY.declared()[name]
    return (field.metadata["kind"] or type(field.default)) is int


def _grid_help() -> str:
    """``--grid``'s help: the names a trial may vary, by the kind of value each takes."""
    from ..algorithms.registry import REGISTRY

    declared, names = REGISTRY.declared(), REGISTRY.tunable()
    numbers = [name for name in names if not declared[name].metadata["choices"] and not _integer(name)]
    kinds = [f"{name}: integers, the first the reference the noise is calibrated on" for name in names
             if _integer(name)]
    kinds += [f"{name}: {','.join(declared[name].metadata['choices'])}" for name in names
              if declared[name].metadata["choices"]]
    return f"every trial draws one of these values ({'; '.join([', '.join(numbers), *kinds])})"


def space_of(grid: list[str], ranges: list[str]) -> Space:
    """``--grid lr=0.1,0.3`` (one of the values) and ``--range clip=0.1,10`` (log-uniform) as a Space."""
    from ..algorithms.registry import REGISTRY
    from ..tuning.space import Choice, Dimension, LogUniform, Space

    dimensions: dict[str, Dimension] = {}
    for option, specs in (("grid", grid), ("range", ranges)):
        for spec in specs:
            name, _, values = spec.partition("=")
            _validate.one_of(option, name, REGISTRY.tunable())
            if option == "grid":
                dimensions[name] = Choice(_grid_values(name, values))
                continue
            if _integer(name) or REGISTRY.declared()[name].metadata["choices"]:
                raise _validate.DpoptError(f"range {name}: {name} takes --grid values, not a log-uniform range")
            numbers = _numbers(f"{option} {name}", values)
            if len(numbers) != 2:
                raise _validate.DpoptError(f"range {name}={values!r} must be two numbers LOW,HIGH")
            else:
                dimensions[name] = LogUniform(*numbers)
    if not dimensions:
        raise _validate.DpoptError("tune needs at least one --grid NAME=V1,V2,... or --range NAME=LOW,HIGH")
    return Space(dimensions)


@dataclass(frozen=True, kw_only=True)
class TuneRequest(TrainingRequest):
    """A private tuning of the algorithm (a private one) on the data (a registered set as
    registered, or a file of one's own prepared from its public bounds): ``trials`` trials with
    candidates from ``space`` over the ``fixed`` hyper-parameters, the target covering them all;
    ``tuned.json`` in ``out``."""

    fixed: dict[str, object]
    space: Space
    trials: Trials
    validation_fraction: float
    seed: int | None
    diagnostics: bool
    out: Path

    @classmethod
    def parse(cls, args: argparse.Namespace) -> TuneRequest:
        from ..algorithms import registry
        from ..tuning.trials import trials_of

        data = Source.parse(args)
        if data.own is None:
            for bound in ("feature_bounds", "target_bounds", "row_norm"):
                if getattr(args, bound) is not None:
                    raise _validate.DpoptError(f"--{bound.replace('_', '-')} is for --data: tune runs on a registered "
                                               "data set as it is registered")
        space, trials = space_of(args.grid, args.range), trials_of(args.trials_mean, args.trials_shape)
        _validate.one_of("algorithm", args.algorithm, registry.REGISTRY.private)
        return cls(**cls.given(args, data), fixed=knobs_of(args, "tune"), space=space, trials=trials,
                   validation_fraction=args.validation_fraction, seed=seed_of(args), diagnostics=args.diagnostics,
                   out=Path(args.out or f"results/tune-{args.algorithm}-{data.name}"))


def handle(request: TuneRequest) -> Output:
    """Tune privately (:func:`dpopt.tuning.tune`, whose plan checks δ, the steps and n) and write
    ``tuned.json``; a finished tuning's ``--out`` is refused before any work."""
    from ..building import fits
    from ..tuning.task import glm_task, tune_task

    out = request.out
    if (out / "tuned.json").exists():
        raise _validate.DpoptError(f"out={str(out)!r} holds a finished tuning (tuned.json): its results are there. "
                                   "To start over, use another --out, or remove that folder knowingly: the ε the "
                                   "tuning spent on these data stays spent, and tuned.json is its record")
    own = request.data.own is not None
    described = request.data.prepared() if own else None
    if described is not None:
        fits(request.model, described.dataset)
    task = glm_task(request.data.name if described is None else described.dataset, request.model, reg=request.reg,
                    validation_fraction=request.validation_fraction, data_dir=request.data.data_dir)
    n = task.oracle.n
    tuned = tune_task(task, request.algorithm, request.fixed, space=request.space, trials=request.trials,
                      epsilon=request.epsilon, delta=request.delta, steps=request.steps, seed=request.seed,
                      diagnostics=request.diagnostics, allow_large_delta=request.allow_large_delta)
    stated = {} if described is None else {
        "protected_records": f"{described.protected}, less the validation rows held out of them: {n} rows",
        "test_data": described.test_data}
    payload = {"dataset": request.data.name, "model": request.model, "epsilon_target": request.epsilon,
               "validation_fraction": request.validation_fraction,
               "validation_split": UNPROTECTED.format(share=request.validation_fraction), **stated, **tuned.to_dict()}
    report.write_json(out / "tuned.json", payload)
    result = {key: value for key, value in payload.items() if key != "theta"} | {"out": str(out)}
    final = tuned.final
    row = {"algorithm": request.algorithm, "dataset": request.data.name, "ε": final["epsilon"],
           "one trial's ε": tuned.trial_epsilon, "validation error": final.get("validation_score"),
           "test error": final.get("test_error")}
    lines = summary(tuned, UNPROTECTED.format(share=request.validation_fraction), stated)
    return Output(result, table=[row], lines=lines, written=[out / "tuned.json"])


def summary(tuned: Tuned, validation_split: str, stated: Mapping[str, str]) -> list[str]:
    """One line per fact of a ``dpopt tune`` result: ``tuned``, what its ``validation_split`` is, and
    what is ``stated`` of a file of one's own (its protected records and test data)."""
    final = tuned.final
    lines = [f"δ = {tuned.delta:g} for tuning and training ({tuned.accountant}, "
             f"{tuned.neighboring_relation}); trials: {tuned.trials}"]
    if tuned.hyperparameters is None:
        lines.append("no trial was drawn (K = 0): nothing is released")
    else:
        selected = report.assignments(tuned.hyperparameters) or "the fixed settings"
        lines.append(f"selected {selected}: validation error {final['validation_score']:.4f} "
                     f"(exact, NOT PROTECTED: {validation_split}), test error {final['test_error']:.4f}")
    if stated:
        lines += [f"protected: {stated['protected_records']}", f"test error on: {stated['test_data']}"]
    lines.append(f"randomness: {tuned.randomness}")
    if tuned.diagnostics is not None:
        lines.append(f"{tuned.diagnostics['trials_run']} trials run (NOT PRIVATE: reveals K)")
    return lines


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "tune", Command(TuneRequest.parse, handle),
                     "private hyper-parameter selection: the best of a random number of private runs, tuning and "
                     "training in one guarantee (Papernot & Steinke 2022)")
    sub.add_argument("--algorithm", required=True, help=algorithm_help())
    add_flags(sub, "a registered data set (`dpopt data list`; default adult), as registered")
    sub.add_argument("--model", choices=tuple(GLMS), default="logistic", help="a generalised linear model")
    sub.add_argument("--reg", type=float, default=1e-3, help="regularisation λ")
    sub.add_argument("--epsilon", type=float, required=True, help="total ε of tuning and training")
    add_delta(sub)
    sub.add_argument("--steps", type=int, default=500, help="steps of every trial")
    sub.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                     help=_grid_help())
    sub.add_argument("--range", action="append", default=[], metavar="NAME=LOW,HIGH",
                     help="every trial draws this hyper-parameter log-uniformly in [LOW, HIGH]")
    add_knobs(sub, "tune", helps={"lr": "the step size where it is not tuned", "clip": "the clip norm where it is "
                                 "not tuned", "clip_diff": "DP-SRM's C2 where it is not tuned",
                                 "gamma": "DP-SRM's γ where it is not tuned"})
    sub.add_argument("--trials-mean", type=float, default=8.0, help="mean number of trials (>= 1)")
    sub.add_argument("--trials-shape", type=float, default=1.0, help="shape η of the truncated negative binomial "
                     "number of trials (1: geometric, 0: logarithmic); inf: Poisson")
    sub.add_argument("--validation-fraction", type=float, default=0.2, help="share of the training file held out "
                     "(fixed public split; with --data, by a public hash of each row, seed 1) to score candidates; "
                     "these records are not protected")
    add_seed(sub, "make the tuning reproducible (its guarantee then rests on the seed staying secret); default: "
             "secret randomness from the operating system")
    sub.add_argument("--diagnostics", action="store_true", help="also report the number of trials run and the time "
                     "(NOT PRIVATE: they reveal K)")
    sub.add_argument("--out", help="output directory (default: results/tune-<algorithm>-<dataset>)")
