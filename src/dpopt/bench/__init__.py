"""``dpopt bench``: which private optimiser to use, at which ε, with tuning in the budget.

The problems are data (``problems.toml`` beside this module). For every problem, ε and method,
the method is tuned privately (:func:`dpopt.tuning.tune`, the same total (ε, δ) for tuning and
training for every method) once per seed; a cell reports each method's test metric of the
selected θ under the key ``test_error`` (mean, std over seeds; the problem's ``metric`` says
which: ``test_error`` a misclassification rate, ``test_mse``/``test_mae``/``test_loss`` a
regression error, all lower-is-better), the ε of tuning and training, the planned expected data
passes of the whole tuning, the winner (lowest mean) and Welch's one-sided p-value of the winner
against the runner-up. Wall times and trial counts are
NOT PRIVATE diagnostics (they reveal the number of trials).
"""

from __future__ import annotations

import math
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import _validate, report
from ..outputs import NOT_PRIVATE
from ..report import summarise
from ..tuning import Choice, Space, tune
from ..tuning.command import trials_of
from ..tuning.task import builder
from .tasks import build_task

PROBLEMS = Path(__file__).with_name("problems.toml")
#: A winner's p-value below this is reported as significant.
SIGNIFICANCE = 0.05


@dataclass(frozen=True)
class Method:
    algorithm: str
    steps: int
    fixed: Mapping[str, Any]
    space: Space


@dataclass(frozen=True)
class Problem:
    """A declared problem: its ``task`` settings (``kind`` and the kind's keyword arguments,
    :mod:`dpopt.bench.tasks`), the privacy target, the cells' ε and seeds, and its methods."""

    name: str
    task: Mapping[str, Any]
    delta: float
    validation_fraction: float
    epsilons: tuple[float, ...]
    seeds: int
    trials: Any
    methods: tuple[Method, ...]


def problems(variant: str | None = None, path: Path = PROBLEMS) -> dict[str, Problem]:
    """The problems declared in ``path``; with ``variant``, those that declare a block of that
    name, with its overrides (``quick``: the CI smoke version, every problem has one; ``main``:
    the compact comparison ``./dev run`` runs)."""
    try:
        declared = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise _validate.DpoptError(f"file={str(path)!r} is not a readable problems file: {err}") from None
    chosen = {name: _problem(name, spec, variant) for name, spec in declared.items()
              if variant is None or variant in spec}
    if not chosen:
        raise _validate.DpoptError(f"variant={variant!r}: no problem of {str(path)!r} declares such a block")
    return chosen


def _problem(name: str, spec: dict[str, Any], variant: str | None) -> Problem:
    overrides = spec[variant] if variant is not None else {}
    settings = spec | overrides
    fraction = settings.get("step_fraction", 1.0)
    trials = trials_of(settings["trials"]["mean"], settings["trials"].get("shape", 1.0))
    methods = tuple(Method(algorithm, max(1, round(fraction * m["steps"])), m.get("fixed", {}),
                           Space({key: Choice(tuple(values)) for key, values in m["grid"].items()}))
                    for algorithm, m in spec["methods"].items())
    task = spec["task"] | overrides.get("task", {})  # a variant overrides single task settings
    return Problem(name, task, settings["delta"], settings["validation_fraction"], tuple(settings["epsilons"]),
                   settings["seeds"], trials, methods)


def bench(chosen: Sequence[Problem], *, data_dir: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Every problem of ``chosen``, at each of its ε, every method tuned privately on seeds 0, 1, …"""
    from ..experiments._runner import one_sided_p

    started = time.perf_counter()
    results, diagnostics = [], []
    for problem in chosen:
        task = build_task(dict(problem.task), validation_fraction=problem.validation_fraction, data_dir=data_dir)
        cells = []
        for epsilon in problem.epsilons:
            errors: dict[str, list[float]] = {}
            claimed: dict[str, float] = {}
            passes: dict[str, float] = {}
            for method in problem.methods:
                clock = time.perf_counter()
                runs = [tune(builder(method.algorithm, task.oracle.n, method.fixed), task.oracle, space=method.space,
                             trials=problem.trials, epsilon=epsilon, delta=problem.delta, steps=method.steps,
                             score=task.validation_error, seed=seed, theta0=task.theta0, test_error=task.test_error,
                             diagnostics=True)
                        for seed in range(problem.seeds)]
                errors[method.algorithm] = [r.final.get("test_error", math.nan) for r in runs]
                claimed[method.algorithm] = max(r.final["epsilon"] for r in runs)
                passes[method.algorithm] = runs[0].final["expected_passes"]
                diagnostics.append({"problem": problem.name, "epsilon": epsilon, "algorithm": method.algorithm,
                                    "wall_time_s": time.perf_counter() - clock,
                                    "trials_run": [r.diagnostics["trials_run"] for r in runs]})
                if progress:
                    error = summarise(errors[method.algorithm])
                    print(f"{problem.name} ε={epsilon:g} {method.algorithm}: {task.metric} {error['mean']:.4f} "
                          f"({error['std']:.4f})", file=sys.stderr, flush=True)
            ranked = sorted(errors, key=lambda name: summarise(errors[name])["mean"])
            p = one_sided_p(errors[ranked[0]], errors[ranked[1]]) if len(ranked) > 1 else 0.0
            cells.append({"epsilon": epsilon, "winner": ranked[0], "runner_up": ranked[1] if len(ranked) > 1 else None,
                          "p_value": p, "significant": p < SIGNIFICANCE,
                          "methods": {name: {"test_error": summarise(errors[name]),
                                             "epsilon_tuning_and_training": claimed[name],
                                             "expected_passes": passes[name]} for name in errors}})
        kind = problem.task["kind"]
        results.append({"problem": problem.name, "metric": task.metric, "task": dict(problem.task),
                        "dataset": problem.task.get("dataset", kind), "model": problem.task.get("model", kind),
                        "delta": problem.delta, "seeds": problem.seeds, "trials": repr(problem.trials),
                        "steps": {m.algorithm: m.steps for m in problem.methods},
                        "grids": {m.algorithm: {k: list(d.values) for k, d in m.space.dimensions.items()}
                                  for m in problem.methods},
                        "cells": cells})
    return {"problems": results,
            "diagnostics": {"label": NOT_PRIVATE + " (wall times and trial counts reveal the number of trials)",
                            "runs": diagnostics, "wall_time_s": time.perf_counter() - started}}


def select(names: Sequence[str] | None, variant: str | None, path: Path = PROBLEMS) -> list[Problem]:
    """The problems of ``path`` named in ``names`` (by default all that have ``variant``), in their
    ``variant``."""
    declared = problems(variant, path)
    for name in names or ():
        _validate.one_of("problem" if variant is None else f"problem (with variant {variant!r})", name, declared)
    return [declared[name] for name in (names or declared)]


def run_bench(args: Any, command: str) -> dict[str, Any]:
    """``dpopt bench``: run, write ``bench.json``, ``bench.md``, a figure per problem and
    ``summary.png`` to ``--out``; the result (with its Markdown) for printing."""
    from .tables import figures, markdown

    variant = "quick" if args.quick else args.variant
    chosen = select(args.problem, variant, Path(args.file) if args.file else PROBLEMS)
    if args.epsilon:
        chosen = [replace(p, epsilons=tuple(_validate.positive("epsilon", e) for e in args.epsilon)) for p in chosen]
    if args.seeds is not None:
        chosen = [replace(p, seeds=_validate.positive_int("seeds", args.seeds)) for p in chosen]
    result = bench(chosen, data_dir=args.data_dir, progress=not args.json)
    out = Path(args.out or (f"results/bench-{variant}" if variant else "results/bench"))
    text = markdown(result, command)
    report.write_json(out / "bench.json", result | {"command": command})
    report.write_text(out / "bench.md", text)
    figures(out, result)
    return result | {"markdown": text, "out": str(out)}
