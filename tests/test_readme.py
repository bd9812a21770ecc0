"""The Python blocks of the README and of the guides in ``docs/`` that took its examples run as
written (every block of those documents is marked ``<!-- test: run -->``).

A marker may name substitutions that keep a block cheap (``<!-- test: run, epochs=5 ->
epochs=0.05 -->``); each must occur in its block, so a marker cannot silently stop applying.
The data registry reads the shared data folder (``$DPOPT_DATA``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "python-api.md", ROOT / "docs" / "tuning.md")
MARKED = re.compile(r"<!-- test: run(?P<subs>(?:, [^\n]*?)?) -->\n```python\n(?P<code>.*?)```", re.S)


def blocks(document: Path) -> list[str]:
    """The marked Python blocks of ``document``, with their markers' substitutions made."""
    found = []
    for match in MARKED.finditer(document.read_text()):
        code = match["code"]
        for sub in filter(None, (part.strip() for part in match["subs"].split(", "))):
            old, new = sub.split(" -> ")
            assert old in code, f"{document.name}: the marker's substitution {sub!r} no longer applies"
            code = code.replace(old, new)
        found.append(code)
    return found


BLOCKS = [(document, code) for document in DOCUMENTS for code in blocks(document)]


def test_the_documents_mark_every_python_block():
    assert [len(blocks(document)) for document in DOCUMENTS] == [
        document.read_text().count("```python") for document in DOCUMENTS]
    assert len(BLOCKS) == 8


@pytest.mark.parametrize(("document", "code"), BLOCKS,
                         ids=[f"{document.stem}-block{i}" for i, (document, _) in enumerate(BLOCKS)])
def test_a_readme_block_runs(document, code, shared_data_dir, monkeypatch, capsys):
    monkeypatch.setenv("DPOPT_DATA", str(shared_data_dir))
    exec(compile(code, str(document), "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert printed.strip(), "every marked block prints its result"
