"""Where a bench's tuning randomness comes from: the user's seed, or one secret drawn from the
operating system and kept in the user's state folder, never in ``--out``; every job's seed is
derived from it (repeat-and-select is private only while the number of trials, the candidates and
every trial's noise stay secret)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _validate, atomic, journal


@dataclass(frozen=True)
class Randomness:
    """Where a bench's tuning randomness comes from: one root ``secret`` (the user's ``--seed``, or
    128 bits from the operating system) from which every job's seed is derived (:meth:`seed`), and
    ``origin``, the sentence every output writes about it."""

    secret: int
    origin: str

    def seed(self, slot: int, job: str) -> int:
        """The seed of job ``job`` (its problem, ε and method) on seed slot ``slot`` (0, 1, …): 128 bits
        of ``SeedSequence(secret, spawn_key=(slot, h))``, h the first 64 bits of sha256(``job``). Every
        job draws its own randomness (K, candidates, noise): the rows of a published table are
        releases with independent noise, which composition needs (two releases sharing a noise draw
        would reveal the difference of their un-noised values)."""
        job_word = int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "little")
        words = np.random.SeedSequence(self.secret, spawn_key=(slot, job_word)).generate_state(4, dtype=np.uint32)
        return int.from_bytes(words.tobytes(), "little")


#: The file of ``--out``/runs naming a bench seeded from the operating system: 32 random hex digits
#: drawn at its first run, which name its secret in the state folder (public: it is not the secret).
BENCH_ID = "bench.id"
#: The file an earlier dpopt kept a bench's secret in, in ``--out``/runs.
OLD_SECRET = "secret"
SEEDED = ("seeded by the user (--seed or --seed-file; not written in the outputs): the bench is reproducible and "
          "every ε rests on the seed staying secret. Every job's randomness (the number of trials K, the candidates, "
          "each trial's sampling and noise) is derived from it; the methods of a seed share K and the candidate draws")
FROM_OS = ("from the operating system: one secret for this bench, from which every job's randomness (the number "
           "of trials K, the candidates, each trial's sampling and noise) is derived; the methods of a seed share K "
           "and the candidate draws. The secret is kept in the user's dpopt state folder (DPOPT_STATE), never in "
           "--out, so that the same command resumes unfinished jobs with it")
RESUMED = "; this run resumed with the secret an earlier run of this --out kept there"


def randomness(seed: int | None, out: Path) -> Randomness:
    """The bench's :class:`Randomness`: from ``seed``, or from the operating system.

    The secret of the latter is drawn at a bench's first run, before any job, and kept in the state
    folder (:func:`dpopt.journal.folder`: private, outside ``out``), in ``bench/<id>.json`` with the
    resolved ``out`` it belongs to; the id (random, not secret) is written to ``out``/runs/:data:`BENCH_ID`.
    A later run of the same ``out`` resumes with that secret. Refused, in one line saying how to start
    over: an id whose secret is not in the state folder (another user, machine or DPOPT_STATE; an
    edited id), an id whose secret belongs to another ``out`` (an id copied from another bench by
    whoever can write ``out``, or a moved folder: the other bench's K and noise would be drawn again
    here), and a secret an earlier dpopt kept in ``out`` (it may have been published with it)."""
    if seed is not None:
        _validate.non_negative("seed", seed)
        return Randomness(seed, SEEDED)
    runs, where = out / "runs", str(out.resolve())
    start_over = f"remove {str(runs)!r} (or use another --out) to start the bench over"
    if (runs / OLD_SECRET).exists():
        raise _validate.DpoptError(f"{str(runs / OLD_SECRET)!r} is a bench secret an earlier dpopt kept in --out, "
                                   f"where it can be published or edited with the outputs; {start_over}")
    named = runs / BENCH_ID
    if not named.exists():
        bench_id, secret = os.urandom(16).hex(), int.from_bytes(os.urandom(16), "little")
        kept = journal.folder() / "bench" / f"{bench_id}.json"
        kept.parent.mkdir(mode=0o700, exist_ok=True)
        atomic.write_text(kept, json.dumps({"out": where, "secret": f"{secret:032x}"}))  # (mode 0600)
        atomic.write_text(named, f"{bench_id}\n")
        return Randomness(secret, FROM_OS)
    bench_id = named.read_text().strip()
    kept = journal.folder() / "bench" / f"{bench_id}.json"
    if not re.fullmatch(r"[0-9a-f]{32}", bench_id) or not kept.exists():
        raise _validate.DpoptError(f"{str(named)!r} names no bench whose secret is in the state folder "
                                   f"{str(kept.parent)!r} (it was started by another user, machine or DPOPT_STATE, "
                                   f"or the file was edited), so its jobs cannot be resumed; {start_over}")
    record = json.loads(kept.read_text())
    if record["out"] != where:
        raise _validate.DpoptError(f"{str(named)!r} names the bench of out={record['out']!r}, not of this --out "
                                   f"({where!r}): resuming would draw that bench's randomness again here; move the "
                                   f"folder back, or {start_over}")
    return Randomness(int(record["secret"], 16), FROM_OS + RESUMED)
