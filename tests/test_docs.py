"""The documents name tests that exist: every ``tests/<file>.py::<test>`` (or ``::<test>`` after
such a reference in the same table cell) in the Markdown files at the top of the repository and
in ``docs/`` is a test function of that file. A renamed or deleted test would otherwise leave a
security claim pointing at nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"(tests/[\w/]+\.py)((?:::\w+)?)|(?<![\w/.])::(\w+)")


def documents() -> list[Path]:
    return sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])


def references(text: str) -> list[tuple[str, str]]:
    """``(file, test)`` pairs; a bare ``::name`` refers to the last file named before it."""
    found, current = [], None
    for match in REFERENCE.finditer(text):
        path, named, bare = match.groups()
        if path:
            current = path
            if named:
                found.append((path, named[2:]))
        elif current is not None:
            found.append((current, bare))
    return found


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_a_document_names_exists():
    missing = []
    for document in documents():
        for path, name in references(document.read_text()):
            file = ROOT / path
            if not file.is_file() or name not in functions_in(file):
                missing.append(f"{document.name}: {path}::{name}")
    assert not missing, missing


def test_the_reference_reader_finds_bare_names_after_their_file():
    text = "see `tests/a.py::one`, `::two` and `tests/b.py` then `::three`"
    assert references(text) == [("tests/a.py", "one"), ("tests/a.py", "two"), ("tests/b.py", "three")]
