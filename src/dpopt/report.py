"""Results as files: JSON, a Markdown table and PNG figures, each written atomically."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for one value)."""
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


def write_json(path: Path, payload: dict[str, Any]) -> None:
    checkpoint.write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def write_text(path: Path, text: str) -> None:
    checkpoint.write_text(path, text)


def curves_figure(path: Path, panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], *,
                  xlabel: str | dict[str, str], log_y: bool = True, log_x: bool = False) -> None:
    """One subplot per panel title; each maps a line label to (x, y); saved atomically as PNG.
    ``xlabel``: one label for every panel, or one per panel title."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, (x, y) in lines.items():
            ax.plot(x, y, label=label)
        ax.set_title(title)
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
