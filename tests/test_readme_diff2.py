"""The DIFF2 command of docs/cli.md trains: run as written there, shortened to a few rounds, its training
objective (a NOT PRIVATE diagnostic) decreases.

Finding: the command as it was (``--lr 0.5`` and the default ``--clip-diff 0.01``, on raw
California Housing) diverged, objective 73 → 46.6 after a rise, and exited 0."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from dpopt.cli import main

COMMANDS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
ROUNDS = 60


def readme_diff2_command() -> list[str]:
    """docs/cli.md's ``dpopt run --algorithm diff2-gd …`` line(s), without optional ``[…]`` parts."""
    text = COMMANDS.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("dpopt run --algorithm diff2-gd"))
    return shlex.split(re.sub(r"\[.*?\]|#.*", "", line))[1:]


def test_the_readme_diff2_command_decreases_the_objective(tmp_path, capsys, shared_data_dir):
    argv = readme_diff2_command()
    argv[argv.index("--steps") + 1] = str(ROUNDS)
    code = main([*argv, "--seed", "0", "--diagnostics", "--json", "--out", str(tmp_path),
                 "--data-dir", str(shared_data_dir)])
    assert code == 0, capsys.readouterr().err
    objectives = [record["objective"] for record in
                  json.loads((tmp_path / "history.json").read_text())["diagnostics"]["records"]]
    assert len(objectives) >= 10
    assert max(objectives) <= objectives[0] * 1.01  # never rises above its start
    assert objectives[-1] <= 0.95 * objectives[0]
