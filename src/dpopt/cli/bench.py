"""``dpopt bench``: every private optimiser on the declared problems, each tuned privately with the
same budget for tuning and training (:mod:`dpopt.bench`); an interrupted or repeated bench resumes
from the jobs saved in ``--out``/runs (authenticated under the user's checkpoint key; the secret of
the bench's randomness is kept in the state folder, outside ``--out``)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _validate
from .common import Command, Request, add_data_dir, add_seed, seed_of, Subcommands, subcommand
from .output import Output

if TYPE_CHECKING:
    from ..bench import Problem


@dataclass(frozen=True, kw_only=True)
class BenchRequest(Request):
    """The ``problems`` (their variant, ε and seeds applied) run in ``workers`` processes, seeded by
    ``seed`` (None: a secret from the operating system), results in ``out``; ``command``: the
    command line as the outputs show it (the seed hidden); ``diagnostics``: also the NOT PRIVATE
    trial counts and wall times."""

    problems: tuple[Problem, ...]
    workers: int
    seed: int | None
    data_dir: str | None
    out: Path
    command: str
    diagnostics: bool

    @classmethod
    def parse(cls, args: argparse.Namespace) -> BenchRequest:
        from ..bench import PROBLEMS, select, shown_command

        variant = "quick" if args.quick else args.variant
        chosen = select(args.problem, variant, Path(args.file) if args.file else PROBLEMS)
        if args.epsilon:
            epsilons = tuple(_validate.positive("epsilon", e) for e in args.epsilon)
            chosen = [replace(problem, epsilons=epsilons) for problem in chosen]
        if args.seeds is not None:
            chosen = [replace(problem, seeds=_validate.positive_int("seeds", args.seeds)) for problem in chosen]
        workers = _validate.positive_int("workers", args.workers if args.workers is not None else os.cpu_count() or 1)
        out = Path(args.out or (f"results/bench-{variant}" if variant else "results/bench"))
        return cls(problems=tuple(chosen), workers=workers, seed=seed_of(args), data_dir=args.data_dir, out=out,
                   command=shown_command(sys.argv[1:]), diagnostics=args.diagnostics, json=args.json)


def handle(request: BenchRequest) -> Output:
    from ..bench import run_bench

    result = run_bench(request.problems, out=request.out, workers=request.workers, seed=request.seed,
                       command=request.command, data_dir=request.data_dir, progress=not request.json,
                       diagnostics=request.diagnostics)
    out = request.out
    written = [out / "bench.json", out / "bench.md", *(out / f"{p.name}.png" for p in request.problems),
               out / "summary.png", out / "runs"]
    return Output(result, lines=[result["markdown"].rstrip("\n")], written=written)


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "bench", Command(BenchRequest.parse, handle),
                     "every private optimiser on the declared problems, each tuned privately with the same budget "
                     "for tuning and training")
    sub.add_argument("--problem", action="append", help="a declared problem (default: all); repeatable")
    sub.add_argument("--quick", action="store_true", help="the problems' quick settings (CI)")
    sub.add_argument("--variant", help="a block of overrides the problems declare (e.g. main: the compact comparison "
                     "of ./dev run); --quick is --variant quick")
    sub.add_argument("--epsilon", type=float, action="append", help="run at this ε only (repeatable)")
    sub.add_argument("--seeds", type=int, help="seeds per cell instead of the problem's")
    sub.add_argument("--file", help="a problems file (default: the bundled problems.toml)")
    add_data_dir(sub)
    sub.add_argument("--out", help="output directory (default: results/bench, results/bench-quick); finished jobs "
                     "are saved in its runs/ folder, authenticated under your checkpoint key, and the same command "
                     "run again resumes from them")
    sub.add_argument("--workers", type=int, help="processes running the tunings in parallel (default: one per core)")
    add_seed(sub, "make the bench reproducible (every ε then rests on the seed staying secret; the outputs do not "
             "show it); default: one secret from the operating system per bench, kept for resuming in dpopt's state "
             "folder (DPOPT_STATE), never in --out")
    sub.add_argument("--diagnostics", action="store_true", help="also report each tuning's trials run and wall "
                     "time, labelled NOT PRIVATE (they reveal the number of trials K, which the guarantee needs kept "
                     "secret); jobs run with it are saved apart from jobs run without")
