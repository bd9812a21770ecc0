"""The README's Python blocks run as written (those marked ``<!-- test: run -->``).

A marker may name substitutions that keep a block cheap (``<!-- test: run, epochs=5 ->
epochs=0.05 -->``); each must occur in its block, so a marker cannot silently stop applying.
The data registry reads the shared data folder (``$DPOPT_DATA``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARKED = re.compile(r"<!-- test: run(?P<subs>(?:, [^\n]*?)?) -->\n```python\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    found = []
    for match in MARKED.finditer(README.read_text()):
        code = match["code"]
        for sub in filter(None, (part.strip() for part in match["subs"].split(", "))):
            old, new = sub.split(" -> ")
            assert old in code, f"the README marker's substitution {sub!r} no longer applies"
            code = code.replace(old, new)
        found.append((code.splitlines()[0], code))
    return found


def test_the_readme_marks_its_python_blocks():
    text = README.read_text()
    assert len(blocks()) == text.count("```python") == 8


@pytest.mark.parametrize("code", [code for _, code in blocks()], ids=[f"block{i}" for i in range(len(blocks()))])
def test_a_readme_block_runs(code, shared_data_dir, monkeypatch, capsys):
    monkeypatch.setenv("DPOPT_DATA", str(shared_data_dir))
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert printed.strip(), "every marked block prints its result"
