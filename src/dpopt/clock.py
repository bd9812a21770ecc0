"""The time a run's steps take, less the time spent logging and checkpointing."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class StepClock:
    """The CPU and wall seconds of a run's steps: the training loop's time, less the time it is
    :meth:`paused` for (logging, checkpoints). The clocks are read around those pauses, not
    around every step: reading the process's CPU clock is a system call (~2 µs, a few per cent
    of a GLM step)."""

    def __init__(self, cpu: float = 0.0, wall: float = 0.0) -> None:
        self.cpu, self.wall = cpu, wall
        self._start()

    def _start(self) -> None:
        self._since = (time.process_time(), time.perf_counter())

    def stop(self) -> None:
        """Add the time since the clock last started (or resumed)."""
        cpu, wall = self._since
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time not counted: the clock stops on entry and restarts on exit."""
        self.stop()
        try:
            yield
        finally:
            self._start()
