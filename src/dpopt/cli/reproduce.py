"""``dpopt reproduce NAME``: a paper's experiment over seeds (:func:`dpopt.experiments.reproduce`);
an interrupted reproduction resumes from the runs saved in ``--out``/runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from .common import Command, Request, add_data_dir, Subcommands, subcommand
from .. import report
from .output import Output


@dataclass(frozen=True, kw_only=True)
class ReproduceRequest(Request):
    """Experiment ``name`` (``quick``: its smoke version; ``retune``: tune the step sizes again)
    over ``seeds`` seeds (None: the preset's) in ``workers`` processes (None: one per core);
    results in ``out``."""

    name: str
    quick: bool
    seeds: int | None
    retune: bool
    workers: int | None
    only: tuple[str, ...]
    data_dir: str | None
    out: Path

    @classmethod
    def parse(cls, args: argparse.Namespace) -> ReproduceRequest:
        return cls(name=args.name, quick=args.quick, seeds=args.seeds, retune=args.retune, workers=args.workers,
                   only=tuple(args.only or ()), data_dir=args.data_dir,
                   out=Path(args.out or Path("results") / args.name), json=args.json)


def handle(request: ReproduceRequest) -> Output:
    from ..experiments import reproduce

    result = reproduce(request.name, seeds=request.seeds, quick=request.quick, out=request.out,
                       data_dir=request.data_dir, retune=request.retune,
                       progress=not request.json, workers=request.workers,
                       only=request.only)
    rows = [{**({"problem": row["problem"]} if row.get("problem") is not None else {}),
             "algorithm": row["algorithm"], "target ε": "non-private" if row["epsilon"] is None else row["epsilon"],
             **{name: report.mean_std(value, "{} ± {}") for name, value in row["metrics"].items()}}
            for row in result["rows"]]
    out = request.out
    written = [out / "results.json", out / "results.md", *sorted(out.glob("*.png")), out / "runs"]
    return Output(result, table=rows, lines=[f"{result['experiment']}: {result['seeds']} seeds (mean ± std); "
                                             f"randomness: {result['randomness']}"], written=written)


NOT_MEASURED = "not measured"
#: Each experiment's wall time on a 2-core machine, (whole command, ``--quick``), as REPRODUCTIONS.md
#: records its runs (docs/reproductions/runs.toml; "older code": its last run predates the current code,
#: "busy": other jobs shared the cores); "not measured" where no run was timed.
MEASURED = {
    "dp-srm-ijcnn1": ("3 min 36 s", "39 s"),
    "aclip-synthetic": ("19 min 17 s", "1 min 34 s"),
    "aclip-real": ("12 min 1 s", "1 min 16 s"),
    "aclip-cifar10": (NOT_MEASURED, NOT_MEASURED),
    "dp-srm-mnist": ("16 min 23 s (busy)", "28 s"),
    "dp-srm-cifar10": (NOT_MEASURED, "22 s"),
    "o2nc-nonsmooth": ("9 min 31 s", "20 s"),
    "o2nc-nonsmooth-sweep": ("12 min 20 s (busy)", "26 s"),
    "diff2-regression": ("49 min 31 s", "26 s"),
    "diff2-classification": (NOT_MEASURED, "1 min 37 s"),
    "mnist-sota": ("32 min 23 s", "25 s"),
}


def experiments_help() -> str:
    """The experiments, one a line with its measured cost (:data:`MEASURED`), for ``--help``."""
    return "\n".join(["experiments, with their wall time on 2 cores (REPRODUCTIONS.md; busy: beside other jobs; "
                      "older code: its run predates the current code):"]
                     + [f"{name}: {full}; --quick: {quick}" for name, (full, quick) in MEASURED.items()])


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "reproduce", Command(ReproduceRequest.parse, handle), "reproduce a paper's experiment")
    sub.epilog = experiments_help()
    sub.add_argument("name", help="the experiment (listed below), e.g. dp-srm-ijcnn1")
    sub.add_argument("--quick", action="store_true", help="a fast smoke version (2 seeds)")
    sub.add_argument("--seeds", type=int, help="seeds per method (default: the experiment's)")
    sub.add_argument("--retune", action="store_true", help="re-run the step-size tuning instead of the preset's")
    sub.add_argument("--workers", type=int, help="processes running seeds in parallel (default: one per core)")
    sub.add_argument("--only", action="append", metavar="PATTERN",
                     help="run only the rows whose problem/method/epsilon matches this shell pattern, e.g. "
                     "'scatternet:mnist/DP-SGD/3.0' or 'scatternet:mnist/*/3.0' (repeatable; default: every row)")
    add_data_dir(sub)
    sub.add_argument("--out", help="output directory (default: results/<name>); an interrupted reproduction "
                     "resumes from the runs saved there")
