"""Argument checks at the edge of the library, with one message style.

Every check raises :class:`DpoptError` (a ``ValueError``) whose message names the
argument, its value and the allowed range, e.g. ``"epsilon=-1 must be > 0"``. The CLI
prints that one line and exits with code 2. A setting that runs but whose guarantee means
little is warned about with :class:`DpoptWarning` (the CLI prints ``dpopt: warning: …``).
"""

from __future__ import annotations

import logging
import math
import re
import sys
import warnings
from collections.abc import Iterable
from typing import TextIO, TypeVar

T = TypeVar("T")

#: A target ε above this is run, with a warning: e^ε bounds how much more likely any output may
#: become when one record is added, and e^100 ≈ 10^43 bounds nothing a reader can use.
IMPLAUSIBLE_EPSILON = 100.0


class DpoptError(ValueError):
    """Invalid input: the message names the argument and the allowed values."""


class DpoptWarning(UserWarning):
    """A setting dpopt runs, but whose guarantee may not mean what one expects."""


def warnings_in_one_line() -> None:
    """From now on, show dpopt's warnings (:class:`DpoptWarning`) as one line ``dpopt: warning: …``
    on standard error, each distinct message once (a reproduction's runs each warned alike: the
    same line dozens of times); other warnings as Python shows them. Installed by the command line
    (within ``warnings.catch_warnings()``, once per command) and by the worker processes of a
    reproduction or a bench (once per process), so that every process of a command shows them alike."""
    warnings.simplefilter("always", DpoptWarning)
    shown = warnings.showwarning
    seen: set[str] = set()  # the messages shown

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not issubclass(category, DpoptWarning):
            shown(message, category, filename, lineno, file, line)
        elif str(message) not in seen:
            seen.add(str(message))
            sys.stderr.write(f"dpopt: warning: {message}\n")

    warnings.showwarning = show
    accountant = logging.getLogger("absl")  # dp_accounting logs through absl; each kind once per command
    for note in accountant.filters:
        if isinstance(note, AccountantNotes):
            accountant.removeFilter(note)
    accountant.addFilter(AccountantNotes())


class AccountantNotes(logging.Filter):
    """dp_accounting's log messages (through absl's logger) as dpopt's warnings: each kind of
    message (its text with the numbers left out) shown once per command (per worker process), as one line
    ``dpopt: warning: dp_accounting: …``, instead of absl's ``WARNING:absl:…`` at every
    occurrence (the RDP accountant's note that it left out an order whose series did not converge
    comes once per order and step count; ε is then the minimum over the other orders, still an
    upper bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
        if record.levelno >= logging.WARNING and kind not in self.seen:
            self.seen.add(kind)
            sys.stderr.write(f"dpopt: warning: dp_accounting: {text} (further messages of this kind not shown)\n")
        return False


def meaningful_delta(delta: float, n: int, *, allow_large_delta: bool, override: str) -> float:
    """``delta`` must be in (0, 1) and, unless ``allow_large_delta``, below 1/n for a data set of
    ``n`` records: the mechanism that publishes each record whole with probability δ is
    (0, δ)-DP, and with δ ≥ 1/n it publishes nδ ≥ 1 records in expectation. ``override`` is how
    the caller's user allows it (a flag or a keyword), named in the error."""
    number = open_unit("delta", delta)
    if number * n >= 1 and not allow_large_delta:
        raise DpoptError(f"delta={delta!r} must be < 1/n = {1 / n:.3g} for n={n} records: with δ ≥ 1/n, publishing "
                         f"each record whole with probability δ (about nδ = {number * n:.3g} records) meets the "
                         f"guarantee; give a smaller delta, or {override} to accept this knowingly")
    return number


def plausible_epsilon(epsilon: float) -> None:
    """Warn (:class:`DpoptWarning`) about a target ε above :data:`IMPLAUSIBLE_EPSILON`."""
    if epsilon > IMPLAUSIBLE_EPSILON:
        warnings.warn(DpoptWarning(f"epsilon={epsilon:g} is above {IMPLAUSIBLE_EPSILON:g}: e^ε bounds how much more "
                                   "likely an output may become with one record added, and this bound says nothing "
                                   "useful; the run goes ahead"), stacklevel=3)


def positive(name: str, value: float, *, allow_inf: bool = False) -> float:
    """``value`` must be a finite number > 0 (or +inf when ``allow_inf``)."""
    number = _number(name, value)
    if not number > 0 or (math.isinf(number) and not allow_inf):
        bound = "> 0" if allow_inf else "> 0 and finite"
        raise DpoptError(f"{name}={value!r} must be {bound}")
    return number


def non_negative(name: str, value: float) -> float:
    """``value`` must be a finite number >= 0."""
    number = _number(name, value)
    if not (number >= 0 and math.isfinite(number)):
        raise DpoptError(f"{name}={value!r} must be >= 0 and finite")
    return number


def open_unit(name: str, value: float) -> float:
    """``value`` must lie in the open interval (0, 1)."""
    number = _number(name, value)
    if not 0 < number < 1:
        raise DpoptError(f"{name}={value!r} must be in (0, 1)")
    return number


def unit_interval(name: str, value: float, *, include_zero: bool = False) -> float:
    """``value`` must lie in (0, 1] (or [0, 1] when ``include_zero``)."""
    number = _number(name, value)
    low_ok = number >= 0 if include_zero else number > 0
    if not (low_ok and number <= 1):
        interval = "[0, 1]" if include_zero else "(0, 1]"
        raise DpoptError(f"{name}={value!r} must be in {interval}")
    return number


def positive_int(name: str, value: int, *, maximum: int | None = None,
                 maximum_name: str | None = None) -> int:
    """``value`` must be an integer in [1, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise DpoptError(f"{name}={value!r} must be an integer >= 1")
    if value < 1 or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum_name or maximum}"
        if maximum is not None and maximum_name:
            upper = f" and <= {maximum_name}={maximum}"
        raise DpoptError(f"{name}={value!r} must be >= 1{upper}")
    return value


def one_of(name: str, value: object, allowed: Iterable[T]) -> T:
    """``value`` must be one of ``allowed``: the allowed option equal to it."""
    options = list(allowed)
    for option in options:
        if value is option or value == option:  # (as `value in options` compares)
            return option
    listed = ", ".join(str(option) for option in options)
    raise DpoptError(f"{name}={value!r} must be one of: {listed}")


def _number(name: str, value: float) -> float:
    if isinstance(value, bool):
        raise DpoptError(f"{name}={value!r} must be a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DpoptError(f"{name}={value!r} must be a number") from None
    if math.isnan(number):
        raise DpoptError(f"{name}={value!r} must be a number, not NaN")
    return number
