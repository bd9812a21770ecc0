"""dpopt: differentially private optimisers with exact, checked privacy accounting.

Public API (re-exports only): algorithms, the ledger and calibration, the training loop, the
model fixer (``dpopt.fix``); recurrent layers for the per-record engines in ``dpopt.nn``.
Each is imported on first use (``dpopt.run`` imports torch then), so that ``import dpopt`` and
the command line's accounting commands start without torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: Public name -> the submodule that defines it.
_EXPORTS = {
    **dict.fromkeys(("Ledger", "calibrate", "epsilon_of"), "accounting"),
    **dict.fromkeys(("AClip", "DIFF2", "DPAGD", "DPSGD", "DPSRM", "DPSUR", "O2NC", "O2NCMulti", "LocalSteps",
                     "RestartedAClip", "Stage", "Storm", "dp_gd", "rrpsgd"), "algorithms"),
    "fit": "fit",
    "fix": "fixing",
    "Private": "private",
    "tune": "tuning",
    **dict.fromkeys(("SeededNoise", "SystemNoise"), "mechanisms"),
    **dict.fromkeys(("History", "run"), "train"),
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported from its submodule on first use; or a submodule (``dpopt.oracles``),
    as an eager package would have it."""
    if name not in _EXPORTS:
        if name.startswith("_"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package, whose public names stay the objects above once a submodule of the same name
    is imported (``dpopt.fit`` is the function even after ``import dpopt.fit``: the import system
    would set the package's attribute to the submodule)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
