"""REPRODUCTIONS.md, assembled from the recorded runs of ``dpopt reproduce``.

Each published reproduction is a folder ``docs/reproductions/<name>/`` holding what its run wrote
(``results.md``, ``results.json`` and the figures the record names, copied unchanged) and, where
there is more to say than the report's own verdicts, ``reading.md``: what we read in that run's
numbers, written after it. ``docs/reproductions/runs.toml`` records each run: the commit whose code
ran, the date and UTC start, the wall time under ``/usr/bin/time``, the command, the machine's load,
the figures shown, and ``unchanged_by``: each later commit that touches the code the preset runs,
with why it cannot move the numbers (``tests/test_published.py`` fails on a commit that is neither
older than the run nor listed there; :mod:`dpopt.experiments.sources` says which files a preset
runs). Its ``not_rerun`` table says why an experiment's last published section (kept as
``<name>/previous.md``) was not rerun on the current code, its ``not_run`` table why an experiment
has never been run here, and its ``quick`` table what ``--quick`` (the smoke version) cost, timed
the same way.

``python -m dpopt.experiments.published`` (in the repository's root) writes REPRODUCTIONS.md from
them; ``tests/test_published.py`` checks that the file is exactly what this gives.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The folder of the recorded runs, relative to the repository's root.
FOLDER = Path("docs") / "reproductions"

INTRO = """# Reproductions

Each section below the table is one run of `dpopt reproduce <name>` at its full size (the preset's
seeds): a short reading of it, then the report the command wrote (`results.md`, whose data are in
`results.json` beside it) and the figures it drew. Its first line gives the commit whose code ran,
the date, and the wall time of the whole command on the 2 cores of the machine it ran on
(`/usr/bin/time`, a fresh cache: data preparation included; `DATA` stands for the folder of the data
sets). Where a later commit touches the code
a preset runs, the section names it and says why it cannot move the numbers;
`tests/test_published.py` fails otherwise, so these tables describe the code that ships.

Numbers marked NOT PRIVATE are computed from the training data without noise (training objective,
gradient norms, stationarity, times): the papers report them, and they carry no privacy guarantee.
Every ε is the run's ledger's. The hyper-parameters are the presets' (`src/dpopt/experiments/presets/`),
chosen as each report says, on seeds other than the reported ones and without privacy accounting,
as the papers do. This file is generated from `docs/reproductions/` by
`python -m dpopt.experiments.published`.
"""


def duration(seconds: float) -> str:
    """``2 h 3 min 4 s``, ``3 min 4 s`` or ``4 s``."""
    whole = int(seconds + 0.5)  # halves up
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(hours or minutes) + [f"{secs} s"]
    return " ".join(parts)


@dataclass(frozen=True)
class Run:
    """One recorded run (a table of ``runs.toml``): see the module's docstring; ``busy`` when other
    jobs shared the cores for much of it (its wall time is then no measure of the command's cost)."""

    name: str
    commit: str
    date: str
    start: str
    wall_s: float
    command: str
    machine: str
    figures: tuple[str, ...] = ()
    busy: bool = False
    unchanged_by: Mapping[str, str] = field(default_factory=dict)


def shown_wall(run: Run) -> str:
    """The run's wall time as the reports and ``dpopt reproduce --help`` show it."""
    return duration(run.wall_s) + (" (busy)" if run.busy else "")


@dataclass(frozen=True)
class Quick:
    """One timed ``dpopt reproduce <name> --quick`` (the smoke version): the commit whose code ran,
    its date, its wall time under ``/usr/bin/time`` (fresh cache) and the machine's load."""

    name: str
    commit: str
    date: str
    wall_s: float
    machine: str


@dataclass(frozen=True)
class Records:
    """``runs.toml``: the recorded runs in its order; ``not_rerun``: name → why an experiment's last
    published section (kept in ``<name>/previous.md``) was not rerun on the current code; ``not_run``:
    name → why an experiment has never been run here; ``quick``: the timed ``--quick`` runs."""

    runs: list[Run]
    not_rerun: dict[str, str]
    not_run: dict[str, str]
    quick: list[Quick] = field(default_factory=list)


def recorded(root: Path) -> Records:
    """The records of ``root / FOLDER / "runs.toml"``."""
    tables = tomllib.loads((root / FOLDER / "runs.toml").read_text())
    not_rerun, not_run = tables.pop("not_rerun", {}), tables.pop("not_run", {})
    quick = [Quick(name=name, **table) for name, table in tables.pop("quick", {}).items()]
    runs = [Run(name=name, **{**table, "figures": tuple(table.get("figures", ()))}) for name, table in tables.items()]
    return Records(runs, not_rerun, not_run, quick)


def _demoted(path: Path) -> str:
    """A Markdown file without its title line, its other headings one level down."""
    lines = path.read_text().splitlines()
    body = lines[1:] if lines and lines[0].startswith("# ") else lines
    return "\n".join(re.sub(r"^(#+) ", r"#\1 ", line) for line in body).strip()


def _section(root: Path, run: Run) -> list[str]:
    lines = [f"## {run.name}", "",
             f"Run on {run.date} from {run.start} UTC at git {run.commit}: **{shown_wall(run)}** of wall time "
             f"({run.machine}). Command: `{run.command}`.", ""]
    if run.unchanged_by:
        lines += [f"Later commits that touch the code {run.name} runs, none of which can move its numbers:", ""]
        lines += [f"* {commit}: {why}" for commit, why in run.unchanged_by.items()] + [""]
    reading = root / FOLDER / run.name / "reading.md"
    if reading.exists():
        lines += [reading.read_text().strip(), ""]
    lines += [_demoted(root / FOLDER / run.name / "results.md"), ""]
    return lines + [f"![{figure}]({(FOLDER / run.name / figure).as_posix()})\n" for figure in run.figures]


def document(root: Path) -> str:
    """REPRODUCTIONS.md as the records under ``root / FOLDER`` give it."""
    records = recorded(root)
    table = ["| experiment | run | git | wall time | command |", "|---|---|---|---|---|"]
    table += [f"| [{run.name}](#{run.name}) | {run.date} {run.start} UTC | {run.commit} | {shown_wall(run)} | "
              f"`{run.command}` |" for run in records.runs]
    total = sum(run.wall_s for run in records.runs)
    parts = [INTRO.strip(), "", *table, "",
             f"In all: **{duration(total)}** of wall time, the runs one after another on the same 2 cores.", ""]
    parts += [f"* Not rerun on the current code: **{name}**: {why}" for name, why in records.not_rerun.items()]
    parts += [f"* Never run here: **{name}**: {why}" for name, why in records.not_run.items()] + [""]
    if records.quick:
        parts += ["`--quick`, the smoke version (2 seeds, a quarter of each method's steps, the preset's smaller "
                  "problems where it has them: numbers not comparable with the papers), timed the same way:", "",
                  "| experiment | run | git | wall time | machine |", "|---|---|---|---|---|"]
        parts += [f"| {q.name} | {q.date} | {q.commit} | {duration(q.wall_s)} | {q.machine} |" for q in records.quick]
        timed = {q.name for q in records.quick}
        untimed = [name for name in [run.name for run in records.runs] + [*records.not_rerun, *records.not_run]
                   if name not in timed]
        parts += ["", f"Not timed with `--quick`: {', '.join(untimed)}.", ""] if untimed else [""]
    for run in records.runs:
        parts += _section(root, run)
    if records.not_rerun:
        parts += ["The sections of experiments not yet rerun on the current code follow, as they were published.", ""]
    for name, why in records.not_rerun.items():
        parts += [f"## {name}", "", f"**Not rerun on the current code**: {why} Its section as last published "
                  "follows unchanged; its numbers describe the code of its own commit.", "",
                  _demoted(root / FOLDER / name / "previous.md"), ""]
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    Path("REPRODUCTIONS.md").write_text(document(Path(".")))
