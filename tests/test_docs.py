"""The design documents in ``docs/`` stay true to the tree: every section and rule that code cites
exists, and every module, file and test the documents name exists.

* ``docs/algorithms.md`` has the sections §0 … §7 and ``docs/design.md`` the rules 1 … 10, in
  order; a citation "docs/algorithms.md §N" or "docs/design.md rule N" anywhere in the source, the
  tests or the Markdown files names one of them.
* A path in backticks (``algorithms/registry.py``, ``correlation/``, ``data/catalogue.toml``) is a
  file or folder of the repository, of ``src/dpopt/`` or, written relative to the package of its
  table row (``registry.py``), below them; ``tests/x.py::test_y`` is a test function of that file;
  a dotted name of dpopt (``dpopt.oracles.ghost.KNOWN_LAYERS``, ``sampling.CyclicPoisson``)
  resolves to a module or an attribute of one.
* Every test the Markdown files at the top of the repository name (SECURITY.md's table of what is
  protected, the README), ``tests/x.py::test_y`` or a bare ``::test_z`` after it, exists: a
  renamed or deleted test would otherwise leave a security claim pointing at nothing.
* The README stays a ten-minute read (at most :data:`README_LINES` lines; the rest is in ``docs/``),
  and every relative link of the README and of ``docs/*.md`` reaches a file, and the heading its
  ``#anchor`` names, if any.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "dpopt"
ALGORITHMS = ROOT / "docs" / "algorithms.md"
DESIGN = ROOT / "docs" / "design.md"
DOCUMENTS = (ALGORITHMS, DESIGN)

SECTION = re.compile(r"^## §(\d+) ", re.MULTILINE)
RULE = re.compile(r"^### Rule (\d+)\. ", re.MULTILINE)
CITED_SECTION = re.compile(r"docs/algorithms\.md §(\d+)")
CITED_RULE = re.compile(r"docs/design\.md rule (\d+)")
CODE = re.compile(r"`([^`\s]+)`")
TEST = re.compile(r"^(tests/[\w/]+\.py)(?:::(\w+))?$")
PATH = re.compile(r"^[\w./*-]+(\.py|\.toml|\.md|/)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def names_in(document: Path) -> list[str]:
    return CODE.findall(document.read_text(encoding="utf-8"))


def test_the_algorithms_have_sections_0_to_7_and_the_design_rules_1_to_10():
    assert [int(n) for n in SECTION.findall(ALGORITHMS.read_text(encoding="utf-8"))] == list(range(8))
    assert [int(n) for n in RULE.findall(DESIGN.read_text(encoding="utf-8"))] == list(range(1, 11))


def test_every_citation_of_a_section_or_a_rule_resolves():
    files = [*SRC.rglob("*.py"), *SRC.rglob("*.toml"), *(ROOT / "tests").rglob("*.py"), *ROOT.glob("*.md"),
             *DOCUMENTS]
    text = "\n".join(path.read_text(encoding="utf-8") for path in files)
    sections = {int(n) for n in CITED_SECTION.findall(text)}
    rules = {int(n) for n in CITED_RULE.findall(text)}
    assert sections <= set(range(8)), sorted(sections)
    assert rules <= set(range(1, 11)), sorted(rules)


def paths(document: Path) -> list[str]:
    return [name for name in names_in(document) if PATH.match(name) and not TEST.match(name)]


def exists(name: str) -> bool:
    pattern = name.rstrip("/")
    return any(ROOT.glob(pattern)) or any(SRC.rglob(pattern)) or any((ROOT / "tests").rglob(pattern))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_named_path_exists(document):
    missing = [name for name in paths(document) if not exists(name)]
    assert paths(document) and not missing, missing


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_named_test_exists(document):
    tests = [TEST.match(name) for name in names_in(document) if TEST.match(name)]
    missing = [match[0] for match in tests
               if not (ROOT / match[1]).is_file()
               or (match[2] and f"def {match[2]}(" not in (ROOT / match[1]).read_text(encoding="utf-8"))]
    assert not missing, missing


def resolves(name: str) -> bool:
    """Whether the dotted ``name`` (``dpopt.`` optional) is a dpopt module or an attribute of one."""
    parts = name.removeprefix("dpopt.").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(["dpopt", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def dotted(document: Path) -> list[str]:
    """The dotted names of dpopt in ``document``: those that start with ``dpopt.`` or with a module
    of the package (``sampling.Poisson``), not method calls on a variable (``sampler.wrap``)."""
    modules = {path.stem for path in SRC.glob("*.py")} | {path.name for path in SRC.iterdir() if path.is_dir()}
    found = [name.split("(")[0] for name in names_in(document) if not PATH.match(name)]
    return [name for name in found if DOTTED.match(name) and name.split(".")[name.startswith("dpopt.")] in modules]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_named_module_and_attribute_exists(document):
    names = dotted(document)
    assert names and not [name for name in names if not resolves(name)], [n for n in names if not resolves(n)]


#: ``tests/<file>.py::<test>``, or ``::<test>`` after such a reference in the same cell.
REFERENCE = re.compile(r"(tests/[\w/]+\.py)((?:::\w+)?)|(?<![\w/.])::(\w+)")


def markdown_files() -> list[Path]:
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
    for document in markdown_files():
        for path, name in references(document.read_text()):
            file = ROOT / path
            if not file.is_file() or name not in functions_in(file):
                missing.append(f"{document.name}: {path}::{name}")
    assert not missing, missing


def test_the_reference_reader_finds_bare_names_after_their_file():
    text = "see `tests/a.py::one`, `::two` and `tests/b.py` then `::three`"
    assert references(text) == [("tests/a.py", "one"), ("tests/a.py", "two"), ("tests/b.py", "three")]


#: The README's length at most: what it is, the quick start, one example, the recommendation, links.
README_LINES = 250
#: ``[text](target)`` or ``![alt](target)``; the target without a title.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= README_LINES


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script, digits,
    ``_`` and ``-`` kept), each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(document: Path) -> list[str]:
    """The relative links of ``document`` (outside code blocks) whose file or heading is missing."""
    broken = []
    for target in LINK.findall(FENCE.sub("", document.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, name = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists() or (name and (file.suffix != ".md" or name not in anchors(file))):
            broken.append(target)
    return broken


@pytest.mark.parametrize("document", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda path: path.name)
def test_every_relative_link_reaches_a_file_and_its_heading(document):
    assert not broken_links(document)


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## Private tuning (ε, δ)\n")
    document = tmp_path / "doc.md"
    document.write_text("[ok](other.md#private-tuning-ε-δ), [self](#a-heading), [web](https://example.org)\n"
                        "# A heading\n[gone](missing.md), [no heading](other.md#tuning), ![img](other.md)\n"
                        "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(document) == ["missing.md", "other.md#tuning"]


CLI = ROOT / "docs" / "cli.md"


def test_the_hyper_parameter_tables_of_the_command_line_doc_are_generated_from_the_parameter_classes():
    from dpopt.cli.reference import with_tables

    text = CLI.read_text(encoding="utf-8")
    assert with_tables(text) == text, "regenerate them: python -m dpopt.cli.reference docs/cli.md"


def test_a_new_hyper_parameter_changes_the_generated_tables():
    """A field added to a parameter class is a row of the tables, so the document check above
    fails until the document shows it."""
    from dataclasses import dataclass

    from dpopt import _validate
    from dpopt.algorithms.params import DPSGDParams, knob
    from dpopt.algorithms.registry import ENTRIES, Entry
    from dpopt.cli.reference import tables, with_tables

    @dataclass(frozen=True)
    class WarmParams(DPSGDParams):
        warmup: int = knob(3, "steps at a smaller step size", check=_validate.positive_int, commands=("run",))

    generated = tables((*ENTRIES, Entry("warm", "dpopt.algorithms.dp_sgd:dp_sgd_from_params", "warm", WarmParams)))
    assert "| `warmup` | `--warmup` (run) | int | `3` | an integer ≥ 1 | steps at a smaller step size |" in generated
    assert generated.startswith(tables()) and generated != tables()
    with pytest.raises(_validate.DpoptError, match="no lines"):
        with_tables("# A document without the markers\n")
