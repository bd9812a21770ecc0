"""``./dev test`` lints before it tests: ruff, then mypy, then pytest, and a finding of either checker
stops it with a failing exit status before a test runs. Run on a copy of ``dev`` whose ``.venv`` holds
stand-ins that log their calls (no set-up, no real tools)."""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF, MYPY = "ruff check src tests benchmarks", "mypy "  # mypy reads its files from pyproject.toml


def dev_with_stand_ins(tmp_path: Path, failing: str | None) -> tuple[int, list[str]]:
    """``dev test`` in a copy of the repository's script whose tools only log their command lines (the
    Python stand-in answers the set-up's import check); ``failing``: the tool that exits 1. The exit
    status and the calls, in order."""
    shutil.copy(REPO / "dev", tmp_path / "dev")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    for tool in ("python", "ruff", "mypy"):
        status = 1 if tool == failing else 0
        script = bin_dir / tool
        script.write_text(f'#!/usr/bin/env bash\n[ "$1" = -c ] && exit 0\necho "{tool} $*" >> "{log}"\nexit {status}\n')
        script.chmod(0o755)
    environ = {key: value for key, value in os.environ.items() if key != "DPOPT_CACHE"}
    done = subprocess.run(["bash", str(tmp_path / "dev"), "test"], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, log.read_text().splitlines() if log.exists() else []


def test_dev_test_runs_ruff_then_mypy_then_pytest(tmp_path):
    assert dev_with_stand_ins(tmp_path, failing=None) == (0, [RUFF, MYPY, "python -m pytest -q"])


def test_a_ruff_finding_stops_dev_test_before_the_tests(tmp_path):
    assert dev_with_stand_ins(tmp_path, failing="ruff") == (1, [RUFF])


def test_a_mypy_finding_stops_dev_test_before_the_tests(tmp_path):
    assert dev_with_stand_ins(tmp_path, failing="mypy") == (1, [RUFF, MYPY])
