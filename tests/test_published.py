"""REPRODUCTIONS.md is generated from the recorded runs, and each run describes the code that ships.

Finding (issue 41): REPRODUCTIONS.md's tables "were made before that change", a section was
"Stale since 2026-11-23 (not rerun yet)", and nothing tied a table to the code that made it. Now
each section is a recorded run (``docs/reproductions/runs.toml``) whose commit is checked against
the history of the code its preset runs (:func:`dpopt.experiments.sources.code_files`): a later
commit touching that code fails the check unless the record says why it cannot move the numbers.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from dpopt.cli.reproduce import MEASURED, NOT_MEASURED
from dpopt.experiments import EXPERIMENTS
from dpopt.experiments.published import Run, document, duration, recorded, shown_wall
from dpopt.experiments.sources import bench_code_files, code_files

ROOT = Path(__file__).resolve().parents[1]


def _history() -> bool:
    """Whether ``ROOT`` is a git checkout with its history (a clone, not an exported tree)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


needs_history = pytest.mark.skipif(not _history(), reason="needs the project's git history (a full clone)")


def changes(files: list[Path], commit: str, unchanged_by: Mapping[str, str]) -> list[str]:
    """The commits after ``commit`` that change ``files`` and that ``unchanged_by`` does not list."""
    log = subprocess.run(["git", "log", "--format=%H", f"{commit}..HEAD", "--", *map(str, files)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [found[:7] for found in log.stdout.split() if not any(found.startswith(listed) for listed in unchanged_by)]


def unexplained(run: Run) -> list[str]:
    """The commits after ``run.commit`` that change the code its preset runs and that its record
    does not list in ``unchanged_by``."""
    return changes(code_files(run.name), run.commit, run.unchanged_by)


def test_reproductions_md_is_generated_from_the_recorded_runs():
    assert (ROOT / "REPRODUCTIONS.md").read_text() == document(ROOT), \
        "regenerate it: python -m dpopt.experiments.published"


def test_every_experiment_has_a_recorded_run_or_says_why_not():
    records = recorded(ROOT)
    named = [run.name for run in records.runs] + list(records.not_rerun) + list(records.not_run)
    assert sorted(named) == sorted(EXPERIMENTS)  # each once
    assert all((ROOT / "docs" / "reproductions" / name / "previous.md").is_file() for name in records.not_rerun)
    for run in records.runs:
        folder = ROOT / "docs" / "reproductions" / run.name
        assert (folder / "results.md").read_text().startswith(f"# {run.name}\n"), run.name
        assert all((folder / figure).is_file() for figure in run.figures), run.name


@needs_history
def test_every_sections_run_is_of_the_code_its_preset_runs_now():
    runs = recorded(ROOT).runs
    assert {run.name: unexplained(run) for run in runs} == {run.name: [] for run in runs}


@needs_history
def test_a_section_older_than_a_change_to_its_code_is_caught():
    """The mutants: the dp-srm-ijcnn1 record moved back to just before the last commit (up to its
    run's) that changed the code it runs; and its listed commits' reasons dropped."""
    run = next(run for run in recorded(ROOT).runs if run.name == "dp-srm-ijcnn1")
    files = [str(path) for path in code_files(run.name)]
    last = subprocess.run(["git", "log", "-1", "--format=%H", run.commit, "--", *files], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert last[:7] in unexplained(dataclasses.replace(run, commit=f"{last}~1"))
    if run.unchanged_by:
        assert unexplained(dataclasses.replace(run, unchanged_by={}))


@needs_history
def test_bench_md_is_of_the_code_the_bench_runs_now():
    """BENCH.md and docs/bench.json come from one run (docs/bench-run.toml): its commit and date are in
    BENCH.md's header, and every later change to the bench's code says why it cannot move them; the
    mutant without those reasons is caught."""
    record = tomllib.loads((ROOT / "docs" / "bench-run.toml").read_text())
    assert f"Run on {record['date']} at git {record['commit']}" in (ROOT / "BENCH.md").read_text()
    assert changes(bench_code_files(), record["commit"], record["unchanged_by"]) == []
    assert changes(bench_code_files(), record["commit"], {}) != []


def test_the_code_a_preset_runs_is_its_own_modules_and_what_they_import():
    ijcnn1 = {str(path) for path in code_files("dp-srm-ijcnn1")}
    assert {"src/dpopt/experiments/dp_srm_ijcnn1.py", "src/dpopt/experiments/presets/dp-srm-ijcnn1.toml",
            "src/dpopt/algorithms/dp_srm.py", "src/dpopt/accounting/calibration.py",
            "src/dpopt/experiments/reproduce.py"} <= ijcnn1
    assert not {"src/dpopt/experiments/mnist_sota.py", "src/dpopt/experiments/presets/mnist-sota.toml",
                "src/dpopt/algorithms/o2nc.py", "src/dpopt/cli/reproduce.py",
                "src/dpopt/experiments/published.py"} & ijcnn1
    sota = {str(path) for path in code_files("mnist-sota")}
    assert {"src/dpopt/experiments/mnist_sota.py", "src/dpopt/oracles/ghost/grams.py",
            "src/dpopt/augmentation.py", "src/dpopt/private.py"} <= sota


def test_the_help_shows_the_recorded_wall_times():
    records = recorded(ROOT)
    assert ({run.name: MEASURED[run.name][0] for run in records.runs}
            == {run.name: shown_wall(run) for run in records.runs})
    assert all(MEASURED[name][0] == NOT_MEASURED for name in records.not_run)
    assert all("older code" in MEASURED[name][0] for name in records.not_rerun)
    quick = {run.name: duration(run.wall_s) for run in records.quick}
    assert {name: costs[1] for name, costs in MEASURED.items()} == {name: quick.get(name, NOT_MEASURED)
                                                                     for name in MEASURED}


def test_durations_read_as_hours_minutes_and_seconds():
    assert [duration(s) for s in (4.4, 64, 3600, 7384.6)] == ["4 s", "1 min 4 s", "1 h 0 min 0 s", "2 h 3 min 5 s"]
