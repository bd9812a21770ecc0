"""What a command shows: one convention for every command.

With ``--json``: one JSON document on standard output and nothing else (strict JSON:
:func:`dpopt.report.to_json`). Without: a short summary for a person, a small table of the key
numbers, a few lines of what they mean, and the paths written. Warnings and progress bars go to
standard error, never to standard output.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import report

#: Exit code of a ``run`` that diverged (θ or its objective not finite), after writing what it has.
EXIT_DIVERGED = 3


@dataclass(frozen=True)
class Output:
    """A command's result: ``document`` is what ``--json`` prints; ``table`` (rows of the same
    columns, in order), ``lines`` and ``written`` (the files and folders written) are the summary
    for a person. ``error``: a line for standard error after the result, with exit code
    ``exit_code`` (0: done)."""

    document: Mapping[str, Any]
    table: Sequence[Mapping[str, Any]] = ()
    lines: Sequence[str] = ()
    written: Sequence[Path | str] = ()
    exit_code: int = 0
    error: str | None = None

    def text(self) -> str:
        """The summary for a person: the table, the lines, then the paths written (one a line)."""
        parts = [table(self.table)] if self.table else []
        parts += list(self.lines)
        if self.written:
            parts += ["written:", *(f"  {path}" for path in self.written)]
        return "\n".join(parts)

    def show(self, as_json: bool) -> int:
        """Print the result (JSON, or the summary); the error line, if any, to standard error; the
        exit code."""
        print(report.to_json(self.document) if as_json else self.text())
        if self.error is not None:
            sys.stderr.write(f"dpopt: error: {self.error}\n")
        return self.exit_code


def cell(value: object) -> str:
    """A table cell: numbers to four significant digits, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "∞" if math.isinf(value) and value > 0 else f"{value:.4g}"
    return str(value)


def table(rows: Sequence[Mapping[str, object]]) -> str:
    """``rows`` as an aligned text table under a header of their keys (the first row's, in order,
    then any other row's); a missing value is "-"."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(line[k]) for line in [columns, *cells]) for k in range(len(columns))]
    lines = [columns, ["-" * width for width in widths], *cells]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in lines)
