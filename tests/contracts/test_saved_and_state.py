"""Mutation tests of what a bench or a reproduction resumes from, and of the folder its key lives in.

Two contracts, each checked by one measurement that passes on the honest code and catches every
mutant of it (a mutant is the code before its fix, or the fix with one of its checks left out):

* a saved job (:class:`dpopt.jobs.Saved`) is loaded only if it is authenticated
  under the user's checkpoint key and holds the job asked for. :func:`forgeries_loaded` offers a
  pool three saved files: the honest one, one rewritten with its digest recomputed ("a forged
  job"), and another job's genuine file copied over it ("a renamed job"). Mutants: the loader
  that checked the digest only (the code before), and one that checks the tag but not the job.
* the state folder and its key are used only while they are the user's own and private.
  :func:`loose_state_used` offers :func:`dpopt.journal.key` an honest private state, a key file
  of mode 0644 ("a world-readable key", e.g. planted with chosen bytes) and a folder of mode
  0777. Mutant: the check of the file modes left out (the code before).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from dpopt import checkpoint, journal
from dpopt._validate import DpoptError
from dpopt.jobs import Pool, Saved


@dataclass(frozen=True)
class Job:
    """A job whose result is its ``value``; ``runs`` counts the calls of :meth:`run`."""

    value: float
    runs: list[float]

    def run(self, problem: object) -> dict[str, float]:
        self.runs.append(self.value)
        return {"test_error": self.value, "epsilon": 1.0}

    def described(self, problem: object) -> dict[str, str]:
        return {"job": f"Job({self.value})"}


def loaded(folder: Path, job: Job) -> dict[str, float] | str:
    """What a fresh pool gives for ``job`` from ``folder``: its result, or the refusal's message."""
    try:
        return Pool(1, saved=Saved(folder, "contract")).start(job, None).result()
    except DpoptError as err:
        return str(err)


def forgeries_loaded(folder: Path) -> dict[str, dict[str, float] | str]:
    """Save the results of two jobs, then load the first as saved, forged and renamed: what came back
    each time (honest: the saved result; a forgery: the refusal)."""
    runs: list[float] = []
    honest, other = Job(0.25, runs), Job(0.5, runs)
    for job in (honest, other):
        loaded(folder, job)
    saved = Saved(folder, "contract")
    path, other_path = saved.path(honest, None, None), saved.path(other, None, None)
    found = {"honest": loaded(folder, honest)}
    genuine = path.read_bytes()
    kept = checkpoint.load(path)
    kept["result"] = {"test_error": 0.0123, "epsilon": 0.05}
    checkpoint.save(path, kept)  # its digest recomputed; no key
    found["a forged job"] = loaded(folder, honest)
    path.write_bytes(other_path.read_bytes())
    found["a renamed job"] = loaded(folder, honest)
    path.write_bytes(genuine)
    assert runs == [0.25, 0.5]  # every load was a load: no job ran again
    return found


def digest_only(self: Saved, name: str) -> object:
    """The loader before the fix: the sha256 checked, no tag, no job."""
    return checkpoint.load(self.at(name))["result"]


def tag_only(self: Saved, name: str) -> object:
    """The fix without its check of the job a file holds."""
    return checkpoint.load(self.at(name), self.key)["result"]


def test_the_honest_loader_refuses_every_forgery_and_loads_the_saved_job(tmp_path):
    found = forgeries_loaded(tmp_path)
    assert found["honest"] == {"test_error": 0.25, "epsilon": 1.0}
    assert found["a forged job"].startswith("saved job: checkpoint=") and "is not authenticated: it carries no tag" in (
        found["a forged job"])
    assert found["a renamed job"].startswith("saved job ") and "holds another job's result" in found["a renamed job"]


@pytest.mark.parametrize(("mutant", "accepts"), [(digest_only, ["a forged job", "a renamed job"]),
                                                 (tag_only, ["a renamed job"])])
def test_the_forgery_check_catches_every_mutant_loader(tmp_path, monkeypatch, mutant, accepts):
    monkeypatch.setattr(Saved, "load", mutant)
    found = forgeries_loaded(tmp_path)
    assert found["honest"] == {"test_error": 0.25, "epsilon": 1.0}
    assert [name for name in ("a forged job", "a renamed job") if isinstance(found[name], dict)] == accepts


def loose_state_used(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Whether :func:`dpopt.journal.key` gives a key from a private state folder ("honest"), from one
    whose key file is 0644 with chosen bytes ("a world-readable key") and from a 0777 folder."""
    used = {}
    for case, folder_mode, key_mode in [("honest", 0o700, None), ("a world-readable key", 0o700, 0o644),
                                        ("a world-writable folder", 0o777, None)]:
        folder = root / case.replace(" ", "-")
        folder.mkdir()
        folder.chmod(folder_mode)
        if key_mode is not None:
            (folder / "checkpoint.key").write_bytes(b"chosen by someone else, 32 bytes")
            (folder / "checkpoint.key").chmod(key_mode)
        monkeypatch.setenv("DPOPT_STATE", str(folder))
        try:
            journal.key()
            used[case] = True
        except DpoptError:
            used[case] = False
    return used


def test_the_honest_state_check_refuses_a_loose_key_or_folder_and_uses_a_private_one(tmp_path, monkeypatch):
    assert loose_state_used(tmp_path, monkeypatch) == {"honest": True, "a world-readable key": False,
                                                       "a world-writable folder": False}


def test_the_state_check_catches_the_mutant_that_ignores_the_modes(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "owner_only", lambda *args, **kwargs: None)
    assert loose_state_used(tmp_path, monkeypatch) == {"honest": True, "a world-readable key": True,
                                                       "a world-writable folder": True}
