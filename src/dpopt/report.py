"""Results as files: JSON, a Markdown table and PNG figures, each written atomically.

JSON is strict (RFC 8259: no ``NaN`` or ``Infinity`` tokens, which strict parsers reject): a NaN
(a value not computed, or undefined, e.g. the spread of ε = ∞) is written as ``null``, +∞ and −∞
as the strings ``"inf"`` and ``"-inf"`` (ε of a non-private run; an objective that overflowed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import checkpoint

if TYPE_CHECKING:  # numpy is imported where it is used: the command line's parser starts without it
    import numpy as np


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for one value)."""
    import numpy as np

    array = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):  # ε = ∞ for non-private runs: its spread is undefined (NaN)
        return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0}


def _fmt(value: Any) -> str:
    if isinstance(value, dict) and "mean" in value:
        return f"{_fmt(value['mean'])} ({_fmt(value['std'])})"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞"
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` (dicts) with the given ``columns``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(column, "")) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced (NaN by None, ±∞ by "inf"/"-inf"), in nested
    dicts, lists and tuples, numpy values and tensors (as lists) included."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars, tensors
        return finite(value.tolist())
    return value


def to_json(payload: Any, *, indent: int | None = None) -> str:
    """``payload`` as strict JSON (see the module docstring); objects JSON has no form for are
    written as their ``str``. Raises ValueError rather than ever writing a NaN or ∞ token."""
    return json.dumps(finite(payload), indent=indent, default=str, allow_nan=False)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    checkpoint.write_text(path, to_json(payload, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    checkpoint.write_text(path, text)


#: Largest magnitude a figure draws (see :func:`curves_figure`).
DRAWABLE = 1e100


def curves_figure(path: Path, panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], *,
                  xlabel: str | dict[str, str], log_y: bool = True, log_x: bool = False) -> int:
    """One subplot per panel title; each maps a line label to (x, y); saved atomically as PNG.
    ``xlabel``: one label for every panel, or one per panel title. Points that cannot be drawn
    (a coordinate that is not finite, beyond ±:data:`DRAWABLE` (a diverging run; matplotlib's
    log-axis ticks overflow near 1e300), or ≤ 0 on a log axis) are left out, and a panel that lost
    some says how many under its title. Returns the number of points left out."""
    import io

    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    omitted = 0
    for ax, (title, lines) in zip(axes[0], panels.items()):
        left_out = 0
        for label, (x, y) in lines.items():
            x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
            drawable = ((np.abs(x) <= DRAWABLE) & (np.abs(y) <= DRAWABLE)  # (False for NaN)
                        & ((x > 0) | (not log_x)) & ((y > 0) | (not log_y)))
            left_out += int((~drawable).sum())
            ax.plot(x[drawable], y[drawable], label=label)
        ax.set_title(title if not left_out else f"{title}\n({left_out} points not shown: not finite, beyond "
                     f"{DRAWABLE:.0e}{' or ≤ 0' if log_x or log_y else ''})",
                     fontsize=None if not left_out else 9)
        omitted += left_out
        ax.set_xlabel(xlabel if isinstance(xlabel, str) else xlabel[title])
        if log_y:
            ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    checkpoint.write_bytes(path, buffer.getvalue())
    return omitted
