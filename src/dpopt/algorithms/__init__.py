"""Algorithms: one file per paper algorithm, each a frozen dataclass of hyper-parameters that
follows :class:`dpopt.base.Algorithm`; :mod:`~dpopt.algorithms.registry` builds them by name.

The classes are imported on first use, so that the registry (and ``dpopt --help``) needs no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it.
_EXPORTS = {
    **dict.fromkeys(("AClip", "RestartedAClip", "Stage"), "aclip"),
    "AdamBC": "adam",
    **dict.fromkeys(("DIFF2", "LocalSteps"), "diff2"),
    "DPAGD": "dp_agd",
    **dict.fromkeys(("DPSGD", "dp_gd", "rrpsgd"), "dp_sgd"),
    "DPSRM": "dp_srm",
    "DPSUR": "selective",
    **dict.fromkeys(("O2NC", "O2NCMulti"), "o2nc"),
    "Storm": "storm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public class or function, imported from its module on first use; or a submodule
    (``dpopt.algorithms.dp_agd``), as an eager package would have it."""
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
