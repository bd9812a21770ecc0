"""The source files an experiment's numbers depend on: :func:`code_files`.

A reproduction runs the driver (:mod:`dpopt.experiments.reproduce`), its preset's own module and
file, and whatever they import. Following the imports of the source text, not of a run, gives a
superset of what a run executes: imports inside functions count, a string naming a module counts
as the registry's builders do (``"dpopt.algorithms.dp_sgd:from_params"``), and a name taken from a
lazy package (one with an ``_EXPORTS`` table) counts as its module. The experiments' package itself
is not followed: it imports every preset's module, of which a run uses one.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The repository's ``src`` folder and its root.
SRC = Path(__file__).resolve().parents[2]
ROOT = SRC.parent

#: A string naming a dpopt module (``"dpopt.algorithms.dp_sgd:from_params"``, as the registry names its
#: builders): followed like an import.
_MODULE_NAME = re.compile(r"^(dpopt(?:\.\w+)+)(?::\w+)?$")
#: The experiments' package: its ``__init__`` imports every preset's module, of which a run uses one.
_NOT_FOLLOWED = "dpopt.experiments"


def _file(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


@functools.cache
def _named(package: str, name: str) -> str:
    """The module ``from package import name`` loads: a submodule, the module a lazy package
    exports ``name`` from (its ``_EXPORTS``), or the package itself (looked up once a process)."""
    if _file(f"{package}.{name}"):
        return f"{package}.{name}"
    path = _file(package)
    if path is not None and path.name == "__init__.py" and "_EXPORTS" in path.read_text():
        exports: Mapping[str, str] = importlib.import_module(package)._EXPORTS
        if name in exports:
            return f"{package}.{exports[name].lstrip('.')}"
    return package


def _imports(module: str, path: Path) -> list[str]:
    """The modules ``module``'s source imports anywhere (functions included), names as a string
    (:data:`_MODULE_NAME`), or reaches as an attribute of an imported lazy package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name] = alias.name
                found.append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = _named(base, alias.name)
                found.append(bound[alias.asname or alias.name])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [match.group(1) for match in [_MODULE_NAME.match(node.value)] if match]
    found += [_named(bound[node.value.id], node.attr) for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and bound.get(node.value.id, "").startswith("dpopt")]
    return found


def closure(modules: Iterable[str]) -> list[Path]:
    """The source files of ``modules`` and of every dpopt module they import, transitively (see the
    module's docstring), relative to the repository's root."""
    seen: dict[str, Path] = {}
    todo = sorted(modules)
    while todo:
        module = todo.pop()
        while _file(module) is None and "." in module:
            module = module.rpartition(".")[0]
        path = _file(module)
        if module in seen or path is None or not module.startswith("dpopt"):
            continue
        seen[module] = path
        if module != _NOT_FOLLOWED:
            todo += [found for found in _imports(module, path) if found.startswith("dpopt")]
    return sorted(path.relative_to(ROOT) for path in seen.values())


def code_files(name: str) -> list[Path]:
    """The files whose change can move experiment ``name``'s numbers: its preset file and the
    :func:`closure` of the reproduction's driver and of the preset's own modules (a superset of what
    a run executes). Paths relative to the repository's root."""
    from . import EXPERIMENTS

    experiment = EXPERIMENTS[name]
    modules = {"dpopt.experiments.reproduce"} | {
        function.__module__ for function in (experiment.make_problem, experiment.make_methods, experiment.delta_of,
                                             experiment.describe, experiment.preparation, experiment.draw)
        if function is not None}
    preset = Path(__file__).resolve().parent / "presets" / f"{name}.toml"
    return sorted([*closure(modules), preset.relative_to(ROOT)])


def bench_code_files() -> list[Path]:
    """The files whose change can move ``dpopt bench``'s numbers: its problems' file and the
    :func:`closure` of the bench's package."""
    problems = SRC / "dpopt" / "bench" / "problems.toml"
    return sorted([*closure({"dpopt.bench", "dpopt.bench.tasks"}), problems.relative_to(ROOT)])
