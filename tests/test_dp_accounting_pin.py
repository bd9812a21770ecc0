"""dp-accounting is pinned exactly, because :mod:`dpopt.accounting.fast` calls private functions of
it: the installed version must be the pinned one, and every private name ``fast`` reads from a
dp_accounting module must exist there and be listed in the pin's comment in ``pyproject.toml``.

Mutants caught: a loose pin (``dp-accounting>=0.6,<0.7``), an installed version other than the
pin, a private name that the installed dp_accounting lacks."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import tomllib
import types
from pathlib import Path

import pytest
from dp_accounting.pld import privacy_loss_distribution

from dpopt.accounting import fast

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pin() -> str:
    """The version ``pyproject.toml`` pins dp-accounting to; fails unless it is one exact version."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (requirement,) = [d for d in dependencies if d.replace("_", "-").startswith("dp-accounting")]
    name, sep, version = requirement.partition("==")
    assert sep and name.strip() == "dp-accounting" and version.strip(), (
        f"pyproject.toml must pin dp-accounting to one version (dp-accounting==X), not {requirement!r}: "
        "dpopt.accounting.fast uses its private names")
    return version.strip()


def _private_names() -> list[tuple[str, str]]:
    """``(module, name)`` of every private attribute ``fast`` reads from a dp_accounting module."""
    found = []
    for node in ast.walk(ast.parse(inspect.getsource(fast))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            owner = getattr(fast, node.value.id, None)
            if isinstance(owner, types.ModuleType) and owner.__name__.startswith("dp_accounting"):
                found.append((owner.__name__, node.attr))
    return sorted(set(found))


def _missing(names: list[tuple[str, str]]) -> list[str]:
    return [f"{module}.{name}" for module, name in names if not hasattr(importlib.import_module(module), name)]


def test_installed_dp_accounting_is_the_pinned_version() -> None:
    installed, pinned = importlib.metadata.version("dp-accounting"), _pin()
    assert installed == pinned, (
        f"dp-accounting {installed} is installed but pyproject.toml pins {pinned}: dpopt.accounting.fast uses its "
        f"private names {[name for _, name in _private_names()]}; run tests/test_gaussian_pld.py on {installed} "
        "before moving the pin")


def test_the_private_names_fast_uses_exist_and_are_listed_with_the_pin() -> None:
    names = _private_names()
    assert {name for _, name in names} == {"_create_pld_pmf_from_monotone_privacy_loss",
                                           "_pld_for_subsampled_mechanism"}
    missing = _missing(names)
    assert not missing, f"dp_accounting {importlib.metadata.version('dp-accounting')} lacks {missing}, which " \
                        "dpopt.accounting.fast calls"
    unlisted = [name for _, name in names if name not in PYPROJECT.read_text()]
    assert not unlisted, f"pyproject.toml's comment on the dp-accounting pin must name {unlisted}"


def test_a_missing_private_name_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(privacy_loss_distribution, "_pld_for_subsampled_mechanism")
    assert _missing(_private_names()) == ["dp_accounting.pld.privacy_loss_distribution._pld_for_subsampled_mechanism"]
