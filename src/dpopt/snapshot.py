"""One run's state as one value, and its checkpoint: everything a run needs to continue exactly.

A :class:`Snapshot` is taken by :meth:`dpopt.train.Stepper.snapshot` and put back by
:meth:`~dpopt.train.Stepper.restore`: the algorithm's state (θ included), the next step, both
generators' states, the ledger, the run's id and the settings it must be resumed with; for
:func:`dpopt.train.train`'s loop also its :class:`Progress` (the history logged so far). Both
loops, :func:`dpopt.train.train` and :class:`dpopt.Private`, checkpoint through the two functions
here, in one format:

* :func:`write`: the snapshot written atomically, tagged under the user's checkpoint key
  (:func:`dpopt.checkpoint.save`), then recorded as its run's latest in the journal
  (:func:`dpopt.journal.written`);
* :func:`read`: the file's tag verified under the key (:func:`dpopt.checkpoint.load`), then the
  snapshot refused unless it belongs to this run (same settings), its ledger is what the plan
  spends in its steps (:mod:`dpopt.resume`) and it is its run's latest (:func:`dpopt.journal.resume`).

No privacy event: a snapshot releases nothing. It is secret (it holds the generators' states, from
which the noise can be replayed), like the seed. A checkpoint of an earlier dpopt version (a
table of keys, not a snapshot) is refused in one line; its run is started again in another
``--out``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from . import checkpoint, journal, resume
from ._validate import DpoptError
from .accounting.ledger import LedgerState

if TYPE_CHECKING:
    from .base import S
    from .plan import Plan


@dataclasses.dataclass(frozen=True)
class Progress:
    """What :func:`dpopt.train.train`'s loop has counted and logged so far: the records visited
    and expected, the private ``records`` and the NOT PRIVATE ``diagnostics`` logged (what they
    hold: :class:`dpopt.train.History`), the steps' CPU and wall seconds and the step after which
    θ was not finite (None: it is)."""

    visited: int
    expected: float
    records: list[dict[str, float]]
    diagnostics: list[dict[str, float]]
    cpu_time_s: float
    wall_time_s: float
    diverged_at: int | None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A run after ``step`` steps: the algorithm's ``state`` (θ is ``state.theta``), the states of
    the sampling generator and of the noise source's generator, the ledger's state, the run's id,
    the ``settings`` a resume must match (:func:`dpopt.resume.describe`) and, for
    :func:`dpopt.train.train`, its :class:`Progress` (None for :class:`dpopt.Private`). It refers
    to the state's tensors: write it, or restore it, before the run steps on."""

    settings: dict[str, str]
    run: str
    step: int
    state: Any
    sample_gen: Tensor
    noise_gen: Tensor
    ledger: LedgerState
    progress: Progress | None = None

    @property
    def theta(self) -> Tensor:
        """θ after ``step`` steps."""
        return self.state.theta


def write(path: Path, snapshot: Snapshot, key: checkpoint.Key) -> None:
    """Write ``snapshot`` to ``path`` atomically, tagged under ``key``; the journal records it as
    its run's latest checkpoint."""
    checkpoint.save(path, snapshot, key)
    journal.written(snapshot.run, snapshot.step)


def read(path: Path, key: checkpoint.Key, *, settings: dict[str, str], plan: Plan[S], stop_at: int, once: bool,
         progress: bool) -> Snapshot:
    """The snapshot :func:`write` wrote to ``path``, once it is known to be authentic, of this run
    (``settings``), with a ledger of what ``plan`` spends in its steps (at most ``stop_at``) and
    its run's latest; the journal then records it resumed (``once``: refused if it was resumed
    before). ``progress``: whether the run's loop keeps a :class:`Progress` (:func:`dpopt.train.train`'s
    does). Every refusal is one line naming the file and keeps it: it records the ε already spent."""
    name = f"checkpoint={str(path)!r}"
    saved = checkpoint.load(path, key)
    loop = "dpopt.run" if progress else "dpopt.Private"
    if not isinstance(saved, Snapshot):
        raise DpoptError(f"{name} is not a checkpoint of {loop} (it holds other data, or was written by an earlier "
                         "dpopt, whose checkpoints are not read); it was not used: start the run again in another "
                         "--out")
    if (saved.progress is not None) != progress:
        raise DpoptError(f"{name} is a checkpoint of {'dpopt.run' if saved.progress else 'dpopt.Private'}, not of "
                         f"{loop}; it was not used")
    resume.check_settings(name, saved.settings, settings)
    resume.checked_ledger(name, saved.ledger, saved.step, plan, stop_at=stop_at)
    journal.resume(saved.run, saved.step, name, once=once)
    return saved
