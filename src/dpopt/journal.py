"""The curator's own state, kept outside every ``--out``: the key that authenticates checkpoints,
and the journal of the checkpoints each run wrote and resumed.

The folder is ``$DPOPT_STATE`` if set, else the user's configuration folder
(``platformdirs.user_config_dir("dpopt")``), made private (mode 0700). It is used only while it is
the user's own and private: a folder of another user, or one that group or others may read or
write (where anyone could plant the key or rewind the journal), is refused with the command that
fixes it, never silently repaired; and the commands that write an ``--out`` refuse a state folder
inside it (:func:`outside`: the key would travel, and be published, with the outputs). It holds:

* ``checkpoint.key``: 32 bytes from ``os.urandom``, mode 0600, made on first use (atomically: of
  two processes making it at once, both use the one that was linked first); a key file of another
  user, or that group or others may read or write, is refused. Every training
  checkpoint carries an HMAC-SHA256 tag under it (:meth:`Key.tag`, :mod:`dpopt.checkpoint`), and a
  checkpoint whose tag does not verify is refused: an edited checkpoint (its digest recomputed or
  not) or one written under another key is never resumed.
* ``runs/<run id>.json``, one per run: ``{"latest": step, "resumed": [steps]}``, the latest step
  the run checkpointed or resumed and the steps whose checkpoints were resumed. A run's id is 128
  random bits drawn at its start and stored in its checkpoints. Written atomically, under the
  lock ``runs.lock``.
* ``bench/<bench id>.json``: the secret of a ``dpopt bench`` seeded from the operating system and
  the ``--out`` it belongs to (:func:`dpopt.bench.randomness`).

:func:`resume` refuses a checkpoint older than its run's latest (a rewind: the data would pass
through more noised steps than the resumed ledger counts) and, where asked, a second resume of
one checkpoint (a fork: two continuations of one state, each reporting only its own ε).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import filelock
import platformdirs

from . import atomic
from ._validate import DpoptError
from .checkpoint import Key

#: Seconds to wait for another process's journal write (a few milliseconds) before giving up.
LOCK_TIMEOUT = 60.0
_RUN_ID = re.compile(r"[0-9a-f]{32}")


def _path() -> Path:
    env = os.environ.get("DPOPT_STATE")
    return Path(env).expanduser() if env else Path(platformdirs.user_config_dir("dpopt"))


def folder() -> Path:
    """The state folder (created, mode 0700): ``$DPOPT_STATE``, else the user's configuration folder;
    refused unless it is the user's and private (:func:`owner_only`)."""
    path = _path()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner_only(path, f"the state folder {str(path)!r}", f"chmod 700 {str(path)!r}, or set DPOPT_STATE to a "
                   "new folder of your own")
    except OSError as err:
        raise DpoptError(f"DPOPT_STATE={str(path)!r} must be a writable directory ({err.strerror}): dpopt keeps the "
                         "checkpoint key and the journal of runs there") from None
    return path


#: What a state folder or key file open to other users risks (:func:`owner_only`).
KEY_RISK = ("anyone who can read it knows the checkpoint key, anyone who can write it can plant one or rewind the "
            "journal")


def owner_only(path: Path, name: str, fix: str, risk: str = KEY_RISK) -> None:
    """Refuse ``path`` (a DpoptError naming it as ``name``, saying the ``risk`` and the ``fix``) unless
    it belongs to this user and neither group nor others may read or write it: whoever can write the
    state folder can plant a key or rewind the journal, and whoever can read the key can forge a tag
    under it (a secret seed's file: whoever can read it knows the seed, whoever can write it sets it)."""
    status = path.stat()
    if status.st_uid != os.getuid():
        raise DpoptError(f"{name} belongs to another user (uid {status.st_uid}, not {os.getuid()}): what is in it "
                         f"may have been planted; it was not used. Fix: {fix}")
    if status.st_mode & 0o077:
        raise DpoptError(f"{name} is open to other users (mode {stat.S_IMODE(status.st_mode):04o}): {risk}; it was "
                         f"not used. Fix: {fix}")


def outside(out: Path) -> None:
    """Refuse an output folder ``out`` that holds the state folder (or is it), in one line: the key
    and the journal would travel, and be published, with the outputs, and whoever can write
    ``out`` could replace them."""
    state, where = _path().resolve(), Path(out).resolve()
    if state == where or where in state.parents:
        raise DpoptError(f"the state folder {str(state)!r} (DPOPT_STATE) is inside out={str(out)!r}: the checkpoint "
                         "key and the journal would travel with the outputs; set DPOPT_STATE to a folder outside "
                         "--out")


def key(out: Path | None = None) -> Key:
    """The user's checkpoint key, made on first use; refused if its file is not the user's own and
    private (:func:`owner_only`), or, with ``out``, if the state folder is inside ``out`` (:func:`outside`)."""
    if out is not None:
        outside(out)
    path = folder() / "checkpoint.key"
    try:
        if not path.exists():
            atomic.create(path, os.urandom(32))
        owner_only(path, f"the checkpoint key {str(path)!r}", f"delete it (dpopt makes a new key; checkpoints "
                   f"tagged under this one are then refused), or, if no one else ever had access, chmod 600 "
                   f"{str(path)!r}")
        secret = path.read_bytes()
    except OSError as err:
        raise DpoptError(f"the checkpoint key {str(path)!r} cannot be made or read ({err.strerror})") from None
    if len(secret) != 32:
        raise DpoptError(f"{str(path)!r} is not a dpopt checkpoint key (32 bytes); checkpoints are not written or "
                         "resumed without it")
    return Key(secret, path)


def new_run() -> str:
    """A new run's id: 128 bits from the operating system, in hex."""
    return os.urandom(16).hex()


def written(run: str, step: int) -> None:
    """Record that ``run`` wrote a checkpoint of step ``step``."""
    with _entry(run) as entry:
        entry["latest"] = max(entry["latest"], step)


def resume(run: str, step: int, name: str, *, once: bool) -> None:
    """Record that checkpoint ``name``, of step ``step`` of ``run``, is resumed; or refuse it, in
    one line naming the step: if the run already checkpointed or resumed a later step (a rewind),
    or with ``once``, if this step's checkpoint was resumed before (a fork)."""
    with _entry(run) as entry:
        if step < entry["latest"]:
            raise DpoptError(
                f"{name} holds step {step} of run {run}, which already checkpointed or resumed step "
                f"{entry['latest']}: resuming it would rewind the run (the data would pass through more noised steps "
                "than its ε counts); it was not used. Resume the run's latest checkpoint, or start a new run in "
                "another --out")
        if once and step in entry["resumed"]:
            raise DpoptError(
                f"{name} holds step {step} of run {run}, which was already resumed once: resuming it again would "
                "fork the run (two continuations of one state, each counting only its own ε); it was not used. "
                "Continue from the resumed run's latest checkpoint, or start a new run")
        entry["latest"] = step
        entry["resumed"] = sorted({*entry["resumed"], step})


class Entry(TypedDict):
    """A run's journal entry: its latest checkpoint's step and the steps it was resumed from."""

    latest: int
    resumed: list[int]


@contextlib.contextmanager
def _entry(run: str) -> Iterator[Entry]:
    """The journal entry of ``run`` (a new run's: nothing yet), written back if the body changed it."""
    if not _RUN_ID.fullmatch(run):
        raise DpoptError(f"run={run!r} is not a run id (32 hex digits)")
    state = folder()
    (state / "runs").mkdir(mode=0o700, exist_ok=True)
    path = state / "runs" / f"{run}.json"
    try:
        with filelock.FileLock(state / "runs.lock", timeout=LOCK_TIMEOUT):
            entry = _read(path)
            before = dict(entry)
            yield entry
            if entry != before:
                atomic.write_text(path, json.dumps(entry, separators=(",", ":")))
    except filelock.Timeout:
        raise DpoptError(f"the journal lock {str(state / 'runs.lock')!r} stayed held for {LOCK_TIMEOUT:g} s by "
                         "another process; nothing was resumed or recorded") from None


def _read(path: Path) -> Entry:
    if not path.exists():
        return {"latest": 0, "resumed": []}
    try:
        entry = json.loads(path.read_text())
        valid = (isinstance(entry, dict) and set(entry) == {"latest", "resumed"} and type(entry["latest"]) is int
                 and isinstance(entry["resumed"], list) and all(type(s) is int for s in entry["resumed"]))
    except (OSError, ValueError):
        valid = False
    if not valid:
        raise DpoptError(f"the journal entry {str(path)!r} is not one dpopt wrote; without it no checkpoint of its run "
                         "is resumed (start a new run in another --out)")
    return entry
