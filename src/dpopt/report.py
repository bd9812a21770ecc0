"""Results as files: JSON, a Markdown table and PNG figures, each written atomically.

JSON is strict (RFC 8259: no ``NaN`` or ``Infinity`` tokens, which strict parsers reject): a NaN
(a value not computed, or undefined, e.g. the spread of ε = ∞) is written as ``null``, +∞ and −∞
as the strings ``"inf"`` and ``"-inf"`` (ε of a non-private run; an objective that overflowed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from . import atomic

if TYPE_CHECKING:  # numpy and matplotlib are imported where used: the command line's parser starts without them
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for one value)."""
    import numpy as np

    array = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):  # ε = ∞ for non-private runs: its spread is undefined (NaN)
        return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0}


def mean_std(value: Mapping[str, object], joined: str = "{} ({})") -> str:
    """A summary (:func:`summarise`) for a person: ``mean (std)`` (``joined`` places them), numbers
    to four significant digits; the mean alone where the spread is undefined (NaN or None: the ε = ∞
    of a non-private method over seeds shows ``∞``, not ``∞ (nan)``)."""
    std = value.get("std")
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return _fmt(value["mean"])
    return joined.format(_fmt(value["mean"]), _fmt(std))


def _fmt(value: object) -> str:
    if isinstance(value, dict) and "mean" in value:
        return mean_std(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞"
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` (dicts) with the given ``columns``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(column, "")) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def assignments(values: Mapping[str, object]) -> str:
    """``name = value, …`` of ``values`` (hyper-parameters, a model's options); "" if empty."""
    return ", ".join(f"{name} = {value}" for name, value in values.items())


def settings(value: object) -> str:
    """An algorithm's settings (any dataclass) for a person and for JSON: ``DPSGD(lr = 0.5, …,
    sampling = Poisson)``, its shown fields as :func:`assignments`, a class by its name and a
    dataclass field in this same form (Python's repr would show ``<class 'dpopt.sampling.Poisson'>``)."""
    if isinstance(value, type):
        return value.__name__
    if dataclasses.is_dataclass(value):
        shown = {field.name: settings(getattr(value, field.name)) for field in dataclasses.fields(value) if field.repr}
        return f"{type(value).__name__}({assignments(shown)})"
    return str(value)


def finite(value: object) -> object:
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


def to_json(payload: object, *, indent: int | None = None) -> str:
    """``payload`` as strict JSON (see the module docstring); objects JSON has no form for are
    written as their ``str``. Raises ValueError rather than ever writing a NaN or ∞ token."""
    return json.dumps(finite(payload), indent=indent, default=str, allow_nan=False)


def write_json(path: Path, payload: Mapping[str, object]) -> None:
    """``payload`` as strict JSON (:func:`to_json`, indented) at ``path``, written atomically."""
    atomic.write_text(path, to_json(payload, indent=2) + "\n")


#: Largest magnitude a figure draws (see :func:`curves_figure`).
DRAWABLE = 1e100
#: A log axis is drawn only over data spanning at least this factor: over less, matplotlib's log
#: tick labels repeat (e.g. "1.55×10⁻¹" at every tick of a nearly flat curve) and a linear axis reads better.
LOG_SPAN = 10.0


class Curve(NamedTuple):
    """One line of a panel: ``y`` against ``x``, and if given a band ``y ± spread`` (e.g. the
    standard deviation over seeds; the figure's title says which spread)."""

    x: Any
    y: Any
    spread: Any = None


def save_figure(path: Path, fig: Figure) -> None:
    """``fig`` as PNG at ``path``, written atomically; the figure is closed."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic.write_bytes(path, buffer.getvalue())


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only (Agg) backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves_figure(path: Path, panels: Mapping[str, Mapping[str, Curve | tuple[ArrayLike, ArrayLike]]], *, title: str,
                  xlabel: str | dict[str, str], ylabel: str | dict[str, str] | None = None,
                  log_y: bool = True, log_x: bool = False) -> int:
    """One subplot per panel title; each maps a line label to a :class:`Curve` (or ``(x, y)``);
    saved atomically as PNG. ``title``: the figure's title (it names ε and δ, and the spread of the
    bands if there are any). ``xlabel``, ``ylabel``: one label for every panel, or one per panel
    title (default y label: the panel's title). One legend for all panels, below them. Points
    that cannot be drawn (a coordinate that is not finite, beyond ±:data:`DRAWABLE` (a diverging run;
    matplotlib's log-axis ticks overflow near 1e300), or ≤ 0 on a log axis) are left out, and a panel
    that lost some says how many under its title; a panel left with nothing to draw is dropped and
    the title says so. Returns the number of points left out."""
    plt = pyplot()
    drawable = {name: _drawable(lines, log_x, log_y) for name, lines in panels.items()}
    omitted = sum(n for drawn in drawable.values() for _, n in drawn.values())
    kept = {name: drawn for name, drawn in drawable.items() if any(len(curve.x) for curve, _ in drawn.values())}
    dropped = [name for name in panels if name not in kept]
    fig, axes = plt.subplots(1, max(1, len(kept)), figsize=(4.5 * max(1, len(kept)) + 1.5, 3.8), squeeze=False,
                             layout="constrained")
    for ax, (name, drawn) in zip(axes[0], kept.items()):
        xs, ys = [curve.x for curve, _ in drawn.values()], [curve.y for curve, _ in drawn.values()]
        ax.set_xscale(scale(log_x, xs))
        ax.set_yscale(scale(log_y, ys))
        readable_log_ticks(ax.xaxis, xs)
        readable_log_ticks(ax.yaxis, ys)
        for label, (curve, _) in drawn.items():
            (line,) = ax.plot(curve.x, curve.y, label=label)
            if curve.spread is not None:  # on a log axis, a band reaching ≤ 0 is drawn from the mean up
                ax.fill_between(curve.x, lower_ends(ax, curve.y, curve.spread), curve.y + curve.spread,
                                color=line.get_color(), alpha=0.2, linewidth=0)
        left_out = sum(n for _, n in drawn.values())
        ax.set_title(name if not left_out else f"{name}\n({left_out} points not shown: not finite, beyond "
                     f"{DRAWABLE:.0e}{' or ≤ 0' if log_x or log_y else ''})", fontsize=10 if not left_out else 9)
        ax.set_xlabel(xlabel if isinstance(xlabel, str) else xlabel[name])
        ax.set_ylabel(name if ylabel is None else ylabel if isinstance(ylabel, str) else ylabel[name])
        ax.grid(alpha=0.3)
    if not kept:
        axes[0][0].remove()
    handles: dict[str, Any] = {}  # one legend entry per label, whichever panels draw it
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:  # below the panels: clear of the lines and of the title
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 4),
                   fontsize=8)
    text = title + (f"\n(not drawn, nothing drawable: {', '.join(dropped)})" if dropped else "")
    fig.suptitle("\n".join(textwrap.fill(line, int(13 * fig.get_figwidth())) for line in text.split("\n")),
                 fontsize=10)
    save_figure(path, fig)
    return omitted


def _drawable(lines: Mapping[str, Curve | tuple[ArrayLike, ArrayLike]], log_x: bool, log_y: bool
              ) -> dict[str, tuple[Curve, int]]:
    """Each line's drawable points (see :func:`curves_figure`) and how many it lost."""
    import numpy as np

    drawn = {}
    for label, curve in lines.items():
        x, y, spread = Curve(*curve)
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        spread = None if spread is None else np.asarray(spread, dtype=float)
        keep = ((np.abs(x) <= DRAWABLE) & (np.abs(y) <= DRAWABLE)  # (False for NaN)
                & ((x > 0) | (not log_x)) & ((y > 0) | (not log_y)))
        drawn[label] = (Curve(x[keep], y[keep], None if spread is None else spread[keep]), int((~keep).sum()))
    return drawn


def lower_ends(ax: Axes, mean: Sequence[float], spread: Sequence[float]) -> np.ndarray:
    """The lower ends of bands or error bars ``mean ± spread`` that ``ax``'s y axis can draw:
    ``mean − spread``, or the mean itself where that is ≤ 0 on a log axis."""
    import numpy as np

    centre = np.asarray(mean, dtype=float)
    low = centre - np.asarray(spread, dtype=float)
    return np.where((low > 0) | (ax.get_yscale() == "linear"), low, centre)


def readable_log_ticks(axis: Axis, values: Sequence[ArrayLike]) -> None:
    """On a log ``axis`` whose drawn ``values`` span less than two decades: ticks at 1, 2 and 5 ×
    10^k labelled as plain numbers (``%g``), minor ticks unlabelled. There matplotlib labels every
    minor tick in "a×10^b" form and neighbours (3×10⁰, 4×10⁰) overlap; over more decades its
    labels are the powers of ten, left as they are."""
    import numpy as np
    from matplotlib import ticker

    drawn = np.concatenate(values) if values else np.empty(0)
    if axis.get_scale() != "log" or not drawn.size or drawn.max() >= 100 * drawn.min():
        return
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def scale(log: bool, values: Sequence[ArrayLike]) -> str:
    """The scale of an axis: log if ``log`` was asked for and the drawn ``values`` span at least
    :data:`LOG_SPAN`, else linear."""
    import numpy as np

    drawn = np.concatenate(values) if values else np.empty(0)
    return "log" if log and drawn.size and drawn.max() >= LOG_SPAN * drawn.min() else "linear"
