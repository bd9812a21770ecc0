"""The shape of the house, measured from the source: every module in one layer of the table in
``docs/design.md`` and importing only from the layers below, no import circles among dpopt's
modules, no source file over :data:`MAX_LINES` lines, and at most :data:`MAX_ANY_SIGNATURES`
function signatures that mention ``typing.Any``.

An import is an edge from the importing module to the module it names (``from .x import y``: to
``x``, or to ``x.y`` where that is a module itself). Imports at module level count, including
those under ``if TYPE_CHECKING:`` (a circle a type checker must untangle is a circle a reader
must too); imports inside a function body (lazy, made at call time) do not. Importing
``a.b.c`` also runs ``a/__init__`` and ``a.b/__init__``; those implicit edges are left out, so
a package's ``__init__`` may re-export its own modules. The layers count the imports inside
functions too: a lazy import must go down as well. Modules imported by a name computed at run time
(``importlib``: the package's lazy public names, the classes a checkpoint names) are no import of
the source and are not measured.

What the rest of the tree does not yet satisfy is listed in :data:`ALLOWED_CYCLES` and
:data:`ALLOWED_LONG_FILES`, each with its reason; an entry that no longer applies fails the test
too, so the lists only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
DESIGN = SRC.parent / "docs" / "design.md"

#: Lines a source file may have.
MAX_LINES = 450

#: Function signatures (parameters and return) in ``src/`` that may mention ``Any``: where the type
#: is truly open (what a checkpoint decodes to, a module's lazy ``__getattr__`` or a wrapper's
#: delegation, an algorithm whose state type depends on its name in the registry, a checked TOML
#: file's values, keyword options passed on by name). An alias of ``Any`` counts as ``Any`` only where
#: it is spelt so; write the precise type instead.
MAX_ANY_SIGNATURES = 15

#: Attribute probes left in ``src/`` (``hasattr(x, "a")``, ``getattr(x, "a")`` or ``getattr(x, "a", default)``
#: with a literal name), per file: (how many, why). A capability of one of dpopt's own types is a
#: protocol of :mod:`dpopt.base` asked with ``isinstance``, or a method of the base class; what stays
#: here probes objects dpopt does not define.
ALLOWED_PROBES: dict[str, tuple[int, str]] = {
    "dpopt/augmentation.py": (2, "a user's loss function may have no __name__ (a partial, a callable object)"),
    "dpopt/optim.py": (1, "the name of a user's closure, which may have no __name__"),
    "dpopt/oracles/torch_model.py": (1, "the name of a user's loss function, which may have no __qualname__"),
    "dpopt/oracles/layout.py": (2, "a user's loss function's code and name, which a partial or callable object lacks"),
    "dpopt/codec.py": (2, "a NamedTuple has no base class to ask isinstance of: its _fields tell it"),
    "dpopt/data/idx.py": (1, "the name of a user's stream: a file has one, an in-memory buffer none"),
    "dpopt/data/libsvm.py": (1, "the name of a user's stream: a file has one, an in-memory buffer none"),
    "dpopt/fixing.py": (1, "any torch module's inplace flag (activations, dropout: no common base)"),
    "dpopt/oracles/guards.py": (1, "track_running_stats of any module, a user's own layers following torch too"),
    "dpopt/oracles/ghost/functional.py": (3, "attributes of torch layers that some of the known kinds lack"),
    "dpopt/oracles/ghost/stages.py": (2, "a user's layer class's own forward; a Hugging Face model's flag"),
    "dpopt/oracles/hf.py": (8, "Hugging Face models and configs, whose classes dpopt does not import"),
    "dpopt/oracles/loaded.py": (1, "a user's dataset: map-style is having __getitem__ and __len__ (torch's own test)"),
    "dpopt/oracles/records.py": (1, "a user's data: padded records are flagged by a pads attribute"),
    "dpopt/report.py": (1, "numpy arrays and scalars and tensors, told apart without importing numpy or torch"),
    "dpopt/train.py": (1, "closed_form read every step: an attribute read, not an isinstance check (microseconds)"),
}

#: Import circles not yet broken (each as the set of modules of one strongly connected component).
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

#: Source files (relative to ``src/``) over :data:`MAX_LINES` lines, not yet split.
ALLOWED_LONG_FILES: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports not inside a function (nor a class body's methods): at module level, or under
    a module-level ``if`` (``if TYPE_CHECKING:``), ``try`` or ``with``."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            todo += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            if isinstance(node, ast.Try):
                todo += [stmt for handler in node.handlers for stmt in handler.body]
    return found


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The dpopt modules that ``node`` in module ``name`` (file ``path``) imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    found = set()
    for alias in node.names:
        found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return found & known


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of ``tree``, inside functions too."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(*, lazy: bool = False) -> dict[str, set[str]]:
    """Module → the dpopt modules it imports at module level (TYPE_CHECKING imports included); with
    ``lazy``, also those it imports inside functions."""
    found = modules()
    known = set(found)
    imports = all_imports if lazy else module_level_imports
    return {name: set().union(*(imported(name, path, node, known)
                                for node in imports(ast.parse(path.read_text(), str(path)))))
            for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_a_circle_through_a_type_checking_import_and_not_a_lazy_one(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["e"]]
    source = ("from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from .c import C\n"
              "def f():\n    from .d import D\n")
    nodes = module_level_imports(ast.parse(source))
    package = SRC / "dpopt" / "oracles"
    assert set().union(*(imported("dpopt.oracles.a", package / "a.py", node,
                                  {"dpopt.oracles.b", "dpopt.oracles.c", "dpopt.oracles.d"}) for node in nodes)
                       ) == {"dpopt.oracles.b", "dpopt.oracles.c"}


def test_the_graph_resolves_relative_imports_to_modules():
    graph = import_graph()
    assert "dpopt.oracles.ghost" in graph["dpopt.oracles.torch_model"]  # from . import ghost
    assert "dpopt._validate" in graph["dpopt.oracles.torch_model"]  # from .. import _validate
    assert "dpopt.oracles.ghost.stages" in graph["dpopt.oracles.ghost.blocks"]  # from .stages import ...


def test_no_import_cycles_among_dpopt_modules():
    found = set(cycles(import_graph()))
    new = [sorted(cycle) for cycle in found - set(ALLOWED_CYCLES)]
    assert not new, f"import circles: {new}"
    stale = [sorted(cycle) for cycle in set(ALLOWED_CYCLES) - found]
    assert not stale, f"no longer circles, remove them from ALLOWED_CYCLES: {stale}"


def test_no_source_file_over_the_line_limit():
    lengths = {str(path.relative_to(SRC)): len(path.read_text().splitlines()) for path in SRC.rglob("*.py")}
    long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    new = {path: n for path, n in long.items() if path not in ALLOWED_LONG_FILES}
    assert not new, f"files over {MAX_LINES} lines: {new}"
    stale = sorted(set(ALLOWED_LONG_FILES) - set(long))
    assert not stale, f"no longer over {MAX_LINES} lines, remove them from ALLOWED_LONG_FILES: {stale}"


def test_only_the_command_line_parses_command_lines():
    """Library functions take typed values: ``argparse`` (and its ``Namespace``) appear only under
    ``dpopt/cli/``, where each command parses its arguments into a typed request."""
    outside = [str(path.relative_to(SRC)) for name, path in modules().items()
               if not (name == "dpopt.cli" or name.startswith("dpopt.cli."))
               and ("argparse" in path.read_text() or "Namespace" in path.read_text())]
    assert outside == []
    assert "argparse" in (SRC / "dpopt" / "cli" / "common.py").read_text()  # the check looks where it should


def signatures_mentioning_any(tree: ast.AST) -> list[str]:
    """The functions of ``tree`` whose annotated parameters or return type mention ``Any``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            annotations = [a.annotation for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                                  arguments.vararg, arguments.kwarg] if a is not None]
            if any(_mentions_any(annotation) for annotation in [*annotations, node.returns] if annotation is not None):
                found.append(node.name)
    return found


def _mentions_any(annotation: ast.expr) -> bool:
    for name in ast.walk(annotation):
        if isinstance(name, ast.Constant) and isinstance(name.value, str):  # a quoted annotation (or a Literal's text)
            try:
                if _mentions_any(ast.parse(name.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
        if isinstance(name, ast.Name) and name.id == "Any" or isinstance(name, ast.Attribute) and name.attr == "Any":
            return True
    return False


def test_few_signatures_mention_any():
    counted = {str(path.relative_to(SRC)): signatures_mentioning_any(ast.parse(path.read_text()))
               for path in SRC.rglob("*.py")}
    total = sum(len(names) for names in counted.values())
    assert total <= MAX_ANY_SIGNATURES, {path: names for path, names in counted.items() if names}


def test_the_any_counter_sees_any_in_parameters_returns_and_nested_types():
    tree = ast.parse("def a(x: Any) -> int: ...\ndef b(*, y: dict[str, typing.Any]) -> None: ...\n"
                     "def c(**k: object) -> list[Any]: ...\ndef d(x: int) -> str: ...\n"
                     "def e(x: 'Any') -> None: ...\n")
    assert signatures_mentioning_any(tree) == ["a", "b", "c", "e"]


def layer_table(text: str) -> list[tuple[str, list[str]]]:
    """The layer table of ``text`` (``docs/design.md``), top row first: each row's label and the
    entries of its modules cell (``x.py``, a package ``x/``, or the package's ``__init__.py``)."""
    lines = text.splitlines()
    start = lines.index("| layer | modules |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        label, cell = (part.strip() for part in line.strip().strip("|").split("|"))
        rows.append((label, re.findall(r"`([^`]+)`", cell)))
    return rows


def holds(entry: str, module: str) -> bool:
    """Whether ``entry`` of the layer table holds the dpopt module ``module``."""
    if entry == "__init__.py":
        return module == "dpopt"
    name = "dpopt." + entry.removesuffix("/").removesuffix(".py").replace("/", ".")
    return module == name or entry.endswith("/") and module.startswith(name + ".")


def layer_problems(rows: list[tuple[str, list[str]]], graph: dict[str, set[str]]) -> list[str]:
    """What breaks the layers ``rows`` (top first) in ``graph``: a module that no entry or several
    entries hold, an entry that holds no module, and an import between two entries that does not go
    to a lower row (within one entry, a package's modules import each other freely)."""
    problems, place = [], {}
    for module in sorted(graph):
        holders = [(depth, entry) for depth, (_, entries) in enumerate(rows) for entry in entries
                   if holds(entry, module)]
        if len(holders) == 1:
            place[module] = holders[0]
        else:
            named = ", ".join(f"`{entry}` (layer {rows[depth][0]})" for depth, entry in holders)
            problems.append(f"{module} is held by {len(holders)} entries of the layer table, not one"
                            + (f": {named}" if named else ""))
    problems += [f"`{entry}` (layer {label}) holds no module" for label, entries in rows for entry in entries
                 if not any(holds(entry, module) for module in graph)]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if module in place and target in place and place[module][1] != place[target][1] \
                    and place[target][0] <= place[module][0]:
                problems.append(f"{module} (layer {rows[place[module][0]][0]}) imports {target} "
                                f"(layer {rows[place[target][0]][0]}), which is not below it")
    return problems


def test_every_module_sits_in_one_layer_and_imports_only_from_the_layers_below():
    assert layer_problems(layer_table(DESIGN.read_text()), import_graph(lazy=True)) == []


def test_the_layer_check_names_an_import_up_or_within_a_row_and_a_module_in_no_row_or_two():
    rows = [("1", ["cli/", "__init__.py"]), ("2", ["journal.py", "report.py"]), ("3", ["checkpoint.py", "oracles/"]),
            ("4", ["models.py", "oracles/records.py"]), ("5", ["gone.py"])]
    graph = {"dpopt": set(), "dpopt.cli.run": {"dpopt.journal"}, "dpopt.journal": {"dpopt.report"},
             "dpopt.report": {"dpopt.checkpoint"}, "dpopt.checkpoint": set(), "dpopt.models": {"dpopt.oracles"},
             "dpopt.oracles": set(), "dpopt.oracles.ghost.stages": {"dpopt.oracles"},
             "dpopt.oracles.records": set(), "dpopt.codec": set()}
    assert layer_problems(rows, graph) == [
        "dpopt.codec is held by 0 entries of the layer table, not one",
        "dpopt.oracles.records is held by 2 entries of the layer table, not one: `oracles/` (layer 3), "
        "`oracles/records.py` (layer 4)",
        "`gone.py` (layer 5) holds no module",
        "dpopt.journal (layer 2) imports dpopt.report (layer 2), which is not below it",
        "dpopt.models (layer 4) imports dpopt.oracles (layer 3), which is not below it",
    ]


def test_the_lazy_graph_sees_imports_inside_functions():
    lazy, eager = import_graph(lazy=True), import_graph()
    assert "dpopt.codec" in lazy["dpopt.checkpoint"] - eager["dpopt.checkpoint"]  # imported in save and load


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports in ``graph`` of a package's private module (a name starting with ``_`` inside a
    package below ``dpopt``, e.g. ``dpopt.experiments._runner``) from outside that package."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            package, _, leaf = target.rpartition(".")
            if leaf.startswith("_") and package != "dpopt" and not module.startswith(package + "."):
                found.append(f"{module} imports {target}, a private module of {package}")
    return found


def test_no_module_imports_another_packages_private_module():
    """The bench and the reproductions share what they both need through :mod:`dpopt.jobs`, never
    through the other's private modules (the bench once imported ``experiments._runner``)."""
    assert private_imports(import_graph(lazy=True)) == []
    old = {"dpopt.bench": {"dpopt.experiments._runner", "dpopt.jobs"}, "dpopt.experiments.reproduce":
           {"dpopt.experiments._runner", "dpopt._validate"}}
    assert private_imports(old) == ["dpopt.bench imports dpopt.experiments._runner, a private module of "
                                    "dpopt.experiments"]



def attribute_probes(tree: ast.AST) -> list[int]:
    """The lines of ``tree``'s attribute probes: every ``hasattr`` call, and every ``getattr`` call
    whose name is a literal string (with or without a default); ``getattr(x, name)`` with a
    computed name reads by a name from a table, and is no probe."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id == "hasattr" or node.func.id == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append(node.lineno)
    return sorted(found)


def test_capabilities_are_asked_with_isinstance_not_attribute_probes():
    counted = {str(path.relative_to(SRC)): len(attribute_probes(ast.parse(path.read_text())))
               for path in sorted(SRC.rglob("*.py"))}
    new = {path: n for path, n in counted.items() if n > ALLOWED_PROBES.get(path, (0, ""))[0]}
    assert not new, f"attribute probes (ask isinstance of a protocol of dpopt.base instead): {new}"
    stale = {path: n for path, n in counted.items() if path in ALLOWED_PROBES and n < ALLOWED_PROBES[path][0]}
    assert not stale, f"fewer probes than ALLOWED_PROBES says, lower its counts: {stale}"
    assert set(ALLOWED_PROBES) <= set(counted)


def test_the_probe_counter_sees_hasattr_and_getattr_by_a_literal_name_only():
    tree = ast.parse("hasattr(x, 'events')\nstate = getattr(algorithm, 'state_dict', None)\ny = getattr(x, 'z')\n"
                     "w = getattr(module, name)\nv = getattr(m, f'{a}_b')\nobj.getattr(x, 'q', None)\n"
                     "def f(oracle):\n    return getattr(oracle, 'data_digest', 'no digest')\n")
    assert attribute_probes(tree) == [1, 2, 3, 8]
