"""A figure a reader can use, as a checkable property of a matplotlib Figure.

Rules (each broken one is reported as one line naming the axes):
- every axes draws something (lines, collections, images or patches) and has an x and a y label
  (a colour bar's axes: a label on its long axis);
- the suptitle, or else every axes' title, names ε and δ;
- the tick labels of each axis (major and minor, inside the view) are distinct and do not overlap;
- no legend's box covers a data point of a line or scatter (in display coordinates), or a title;
- nothing is cut off: every axes with its title, labels and tick labels, the suptitle and every
  legend lie inside the figure.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.collections import PathCollection


def problems(fig: Any) -> list[str]:
    """What makes ``fig`` hard to read, one line per broken rule (empty: legible)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for ax in fig.axes:
        name = _name(ax)
        if ax.get_label() == "<colorbar>":
            if not (ax.get_xlabel() or ax.get_ylabel()):
                found.append(f"{name}: colour bar without a label")
        else:
            if not (ax.lines or ax.collections or ax.images or ax.patches):
                found.append(f"{name}: empty axes")
            found += [f"{name}: no {which} label" for which, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel()))
                      if not label.strip()]
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _tick_labels(axis)
            repeated = sorted({label for label in labels if labels.count(label) > 1})
            if repeated:
                found.append(f"{name}: {which} tick labels repeated: {repeated}")
            overlapping = _overlapping_tick_labels(axis, renderer)
            if overlapping:
                found.append(f"{name}: {which} tick labels overlap: {overlapping}")
    suptitle = fig.get_suptitle()
    titles = [suptitle] if _names_privacy(suptitle) else [ax.get_title() for ax in plots]
    if not titles or not all(_names_privacy(title) for title in titles):
        found.append("neither the suptitle nor every axes' title names ε and δ")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    title_texts = [text for text in (fig._suptitle, *(ax.title for ax in fig.axes)) if text and text.get_text()]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in plots:
            if any(box.contains(x, y) for x, y in _points(ax)):
                found.append(f"legend covers data of {_name(ax)}")
        found += [f"legend covers the title {text.get_text()!r}" for text in title_texts
                  if box.overlaps(text.get_window_extent(renderer))]
    page = fig.bbox.padded(1.0)  # (a pixel of rounding)
    boxes = [(_name(ax), ax.get_tightbbox(renderer)) for ax in fig.axes]
    boxes += [("the suptitle", fig._suptitle.get_window_extent(renderer))] if suptitle else []
    boxes += [("a legend", legend.get_window_extent(renderer)) for legend in legends]
    found += [f"{name} is cut off at the figure's edge" for name, box in boxes
              if not (page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1)]
    return found


def _name(ax: Any) -> str:
    return f"axes {ax.get_title()!r}" if ax.get_title() else f"axes #{ax.figure.axes.index(ax)}"


def _names_privacy(title: str) -> bool:
    return "ε" in title and "δ" in title


def _tick_labels(axis: Any) -> list[str]:
    """The non-empty tick labels matplotlib draws on ``axis``: major, and minor ticks away from a major one."""
    low, high = sorted(axis.get_view_interval())
    inside = lambda locs: [v for v in locs if low - 1e-9 * abs(low) <= v <= high + 1e-9 * abs(high)]  # noqa: E731
    major = inside(axis.get_major_locator()())
    minor = [v for v in inside(axis.get_minor_locator()()) if not np.isclose(major, v, rtol=1e-10, atol=0).any()]
    return [text for formatter, locs in ((axis.get_major_formatter(), major), (axis.get_minor_formatter(), minor))
            for text in formatter.format_ticks(locs) if text.strip()]


def _overlapping_tick_labels(axis: Any, renderer: Any) -> list[tuple[str, str]]:
    """Pairs of tick labels drawn on ``axis`` (major and minor) whose boxes overlap."""
    drawn = [tick.label1 for tick in axis._update_ticks() if tick.label1.get_visible() and tick.label1.get_text()]
    boxes = [(label.get_text(), label.get_window_extent(renderer)) for label in drawn]
    return [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]


def _points(ax: Any) -> np.ndarray:
    """Every data point of the lines and scatter collections of ``ax``, in display coordinates."""
    points = [line.get_transform().transform(line.get_xydata()) for line in ax.lines if line.get_xydata().size]
    points += [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
               if isinstance(c, PathCollection)]
    return np.concatenate(points) if points else np.empty((0, 2))
