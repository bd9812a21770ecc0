"""Progress on standard error: a tqdm bar on a terminal, else a plain line every :data:`EVERY_S` seconds.

A log file or a pipe cannot show a bar (its carriage returns pile up), and a long run that prints
nothing there looks stuck: :class:`Lines` prints ``desc: done/total units done, elapsed s`` at most
once every :data:`EVERY_S` seconds, and a last one at the end, so a task shorter than that prints
nothing; with ``beat`` it also prints one every :data:`EVERY_S` seconds while no unit finishes (a
reproduction whose runs take minutes each). Progress shows counts and times only, never a number
computed from the data.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeAlias

from tqdm import tqdm

#: Seconds between two progress lines when standard error is not a terminal: ``$DPOPT_PROGRESS_SECONDS``
#: (``inf``: none), else 10.
EVERY_S = float(os.environ.get("DPOPT_PROGRESS_SECONDS", "10"))


class Lines:
    """A progress counter written as plain lines to standard error: ``update`` adds done units and
    prints a line if :data:`EVERY_S` seconds (by ``clock``) have passed since the last one (or the
    start); ``close`` prints a last one if any was printed. With ``beat``, a thread calls
    ``update(0)`` every :data:`EVERY_S` seconds until ``close``, so lines come while no unit
    finishes. The part of tqdm's interface dpopt uses (``total``, ``n``, ``update``,
    ``set_postfix_str``, ``refresh``, ``close``, a context manager)."""

    def __init__(self, total: int, *, desc: str, unit: str = "it", initial: int = 0,
                 clock: Callable[[], float] = time.monotonic, beat: bool = False) -> None:
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.postfix = ""
        self.printed = self.closed = False
        self._clock = clock
        self._start = self._last = clock()
        self._lock, self._stopped = threading.Lock(), threading.Event()  # updates come from several threads
        if beat and 0 < EVERY_S < math.inf:  # (at 0 every update prints; at ∞ nothing does)
            threading.Thread(target=self._beat, name=f"progress of {desc}", daemon=True).start()

    def _beat(self) -> None:
        while not self._stopped.wait(EVERY_S):
            self.update(0)

    def update(self, done: int = 1) -> None:
        with self._lock:
            self.n += done
            now = self._clock()
            if now - self._last >= EVERY_S and not self.closed:
                self._line(now)

    def _line(self, now: float) -> None:
        self._last = now
        self.printed = True
        of = f"/{self.total}" if self.total else ""  # 0: not known
        postfix = f" ({self.postfix})" if self.postfix else ""
        sys.stderr.write(f"{self.desc}: {self.n}{of} {self.unit}s done, {now - self._start:.0f} s{postfix}\n")
        sys.stderr.flush()

    def set_postfix_str(self, postfix: str) -> None:
        self.postfix = postfix

    def refresh(self) -> None:
        """Nothing: a line is printed by :meth:`update` when it is due."""

    def close(self) -> None:
        """A last line, where lines were printed (a short task prints none)."""
        self._stopped.set()
        with self._lock:
            if self.printed and not self.closed:
                self._line(self._clock())
            self.closed = True

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


#: What :func:`bar` gives.
Bar: TypeAlias = "tqdm[None] | Lines"


def bar(total: int, *, desc: str, unit: str = "it", initial: int = 0, enabled: bool = True,
        leave: bool = False, beat: bool = False) -> Bar:
    """Progress over ``total`` units: a tqdm bar if standard error is a terminal, else :class:`Lines`
    (with ``beat``: a line every :data:`EVERY_S` seconds even while no unit finishes); nothing shown
    unless ``enabled``."""
    if enabled and not sys.stderr.isatty():
        return Lines(total, desc=desc, unit=unit, initial=initial, beat=beat)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, leave=leave,
                dynamic_ncols=True)
