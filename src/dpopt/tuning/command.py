"""``dpopt tune``: private tuning of one algorithm on a registered data set or a file of one's own
(GLM models), scored on a held-out validation split of the training file (:mod:`dpopt.tuning.task`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from .. import _validate, report
from .private import tune
from .space import Choice, Dimension, LogUniform, Space
from .task import builder, glm_task
from .trials import Poisson, Trials, TruncatedNegativeBinomial

#: Hyper-parameters a private tuning may vary: they leave the privacy event unchanged.
TUNABLE = ("lr", "clip", "clip_diff", "gamma", "obj_clip")
#: What ``tuned.json`` and the summary say of the validation split (its share of the training file).
UNPROTECTED = ("the validation split ({share:.0%} of the training file, a fixed public permutation) is not protected "
               "by the guarantee: the selected candidate's exact score on it (validation_score) is released")


def trials_of(mean: float, shape: float) -> Trials:
    """Poisson(mean) for shape = ∞ (dp_accounting's convention), else the truncated negative binomial."""
    return Poisson(mean) if math.isinf(shape) else TruncatedNegativeBinomial(mean, shape)


def _numbers(name: str, text: str) -> list[float]:
    try:
        return [float(value) for value in text.split(",")]
    except ValueError:
        raise _validate.DpoptError(f"{name}={text!r} must be comma-separated numbers") from None


def space_of(grid: list[str], ranges: list[str]) -> Space:
    """``--grid lr=0.1,0.3`` (one of the values) and ``--range clip=0.1,10`` (log-uniform) as a Space."""
    dimensions: dict[str, Dimension] = {}
    for option, specs in (("grid", grid), ("range", ranges)):
        for spec in specs:
            name, _, values = spec.partition("=")
            _validate.one_of(option, name, TUNABLE)
            numbers = _numbers(f"{option} {name}", values)
            if option == "grid":
                dimensions[name] = Choice(tuple(numbers))
            elif len(numbers) != 2:
                raise _validate.DpoptError(f"range {name}={values!r} must be two numbers LOW,HIGH")
            else:
                dimensions[name] = LogUniform(*numbers)
    if not dimensions:
        raise _validate.DpoptError("tune needs at least one --grid NAME=V1,V2,... or --range NAME=LOW,HIGH")
    return Space(dimensions)


def run_tune(args: argparse.Namespace, described: Any = None) -> dict[str, Any]:
    """Tune ``args.algorithm`` privately on the registered ``--dataset`` or on ``described`` (a
    file of one's own, read and prepared: :class:`dpopt.data.own.Described`), write ``tuned.json``
    to ``--out``; the printed summary."""
    space = space_of(args.grid, args.range)
    trials = trials_of(args.trials_mean, args.trials_shape)
    dataset = (args.dataset or "adult") if described is None else described.dataset
    name = dataset if described is None else dataset.name
    task = glm_task(dataset, args.model, reg=args.reg, validation_fraction=args.validation_fraction,
                    data_dir=args.data_dir)
    n = task.oracle.n
    _validate.meaningful_delta(args.delta, n, allow_large_delta=args.allow_large_delta, override="--allow-large-delta")
    fixed = {"batch_size": args.batch_size, "sampling": args.sampling, "lr": args.lr, "clip": args.clip,
             "clip_diff": args.clip_diff, "gamma": args.gamma}
    tuned = tune(builder(args.algorithm, n, fixed), task.oracle, space=space, trials=trials,
                 epsilon=args.epsilon, delta=args.delta, steps=args.steps, score=task.validation_error,
                 seed=args.seed, test_error=task.test_error, diagnostics=args.diagnostics,
                 allow_large_delta=args.allow_large_delta)
    out = Path(args.out or f"results/tune-{args.algorithm}-{name}")
    stated = {} if described is None else {
        "protected_records": f"{described.protected}, less the validation rows held out of them: {n} rows",
        "test_data": described.test_data}
    payload = {"dataset": name, "model": args.model, "epsilon_target": args.epsilon,
               "validation_fraction": args.validation_fraction,
               "validation_split": UNPROTECTED.format(share=args.validation_fraction), **stated, **tuned.to_dict()}
    report.write_json(out / "tuned.json", payload)
    return {key: value for key, value in payload.items() if key != "theta"} | {"out": str(out)}


def summary(result: dict[str, Any]) -> str:
    """One line per fact of a ``dpopt tune`` result."""
    final = result["final"]
    lines = [f"ε = {final['epsilon']:.4g} at δ = {result['delta']:g} for tuning and training ({result['accountant']}, "
             f"{result['neighboring_relation']}); one trial alone: ε = {result['trial_epsilon']:.4g}",
             f"trials: {result['trials']}"]
    if result["hyperparameters"] is None:
        lines.append("no trial was drawn (K = 0): nothing is released")
    else:
        lines.append(f"selected {result['hyperparameters']}: validation error {final['validation_score']:.4f} "
                     f"(exact, NOT PROTECTED: {result['validation_split']}), test error {final['test_error']:.4f}")
    if "test_data" in result:
        lines += [f"protected: {result['protected_records']}", f"test error on: {result['test_data']}"]
    lines.append(f"randomness: {result['randomness']}")
    if result["diagnostics"] is not None:
        lines.append(f"{result['diagnostics']['trials_run']} trials run (NOT PRIVATE: reveals K)")
    return "\n".join(lines + [f"written to {result['out']}/tuned.json"])
