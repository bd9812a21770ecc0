"""``--seed-file PATH``: every command that takes ``--seed`` takes the same seed from a file, so that
it stays out of ``ps`` and the shell's history. A file-seeded command is the ``--seed`` command bit
for bit, says it was seeded by the user, and writes the seed nowhere; the two flags together, a file
that group or others may read or write, and a file that holds anything but one integer are refused
in one line (exit 2) that never shows the file's content."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from dpopt import bench, journal
from dpopt.cli import common, main

#: A seed long enough that its digits cannot turn up in the outputs by chance.
SEED = "73190486521734098651"
RUN = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--json"]
TUNE = ["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "3", "--grid",
        "lr=0.1,0.5", "--trials-mean", "1.5", "--json"]
AUDIT = ["audit", "--algorithm", "dp-gd", "--epsilon", "2", "--runs", "20", "--steps", "2", "--json"]
PROBLEM = """
[tiny]
task = { kind = "heavy-tailed", noise = "student-t", model = "ridge", n = 300, dim = 3, reg = 0.0 }
delta = 1e-5
validation_fraction = 0.2
epsilons = [1.0]
seeds = 1
trials = { mean = 1.5, shape = 1.0 }

[tiny.methods.dp-gd]
steps = 3
grid = { lr = [0.1, 1.0] }
"""


def seed_file(folder: Path, text: str = f"{SEED}\n", mode: int = 0o600) -> Path:
    path = folder / "seed"
    path.write_text(text)
    path.chmod(mode)
    return path


def leaked(out: Path) -> list[str]:
    """The files under ``out`` whose bytes hold the seed's digits."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and SEED.encode() in p.read_bytes())


def run(capsys, argv: list[str]) -> dict:
    """``dpopt ARGV``, as the process's own command line too (what bench's outputs show); its JSON."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["dpopt", *argv])
        assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_run_seeded_by_file_is_the_run_seeded_by_flag_and_writes_the_seed_nowhere(capsys, tmp_path):
    by_flag = run(capsys, [*RUN, "--seed", SEED, "--out", str(tmp_path / "flag")])
    by_file = run(capsys, [*RUN, "--seed-file", str(seed_file(tmp_path)), "--out", str(tmp_path / "file")])
    written = [json.loads((tmp_path / out / "history.json").read_text()) for out in ("flag", "file")]
    assert written[0]["theta"] == written[1]["theta"] and by_flag["final"] == by_file["final"]
    assert by_file["randomness"] == by_flag["randomness"] and "seeded by the user" in by_file["randomness"]
    assert "seed staying secret" in by_file["randomness"]
    # the outputs never hold it; the checkpoint does (the seed a resume must match), and is secret like the seed:
    # it holds the generators' states
    assert leaked(tmp_path / "file") == ["checkpoint.pt"] and SEED not in json.dumps(by_file)
    unseeded = run(capsys, [*RUN, "--out", str(tmp_path / "os")])
    assert "operating system" in unseeded["randomness"]
    assert json.loads((tmp_path / "os" / "history.json").read_text())["theta"] != written[1]["theta"]


def test_a_tuning_and_an_audit_seeded_by_file_are_those_seeded_by_flag(capsys, tmp_path):
    for name, given in [("flag", ["--seed", SEED]), ("file", ["--seed-file", str(seed_file(tmp_path))])]:
        run(capsys, [*TUNE, *given, "--out", str(tmp_path / name)])
    tuned = [json.loads((tmp_path / name / "tuned.json").read_text()) for name in ("flag", "file")]
    assert tuned[0] == tuned[1] and "seed staying secret" in json.dumps(tuned[1])
    assert leaked(tmp_path / "file") == []
    audited = [run(capsys, [*AUDIT, *given]) for given in (["--seed", "5"], ["--seed-file", str(seed_file(tmp_path,
                                                                                                            "5"))])]
    assert {**audited[0], "seconds": 0} == {**audited[1], "seconds": 0}


def test_a_bench_seeded_by_file_is_the_bench_seeded_by_flag_and_its_outputs_show_neither_catches_an_echo(
        capsys, tmp_path):
    """The outputs show the command line (:func:`dpopt.bench.shown_command`, which hides a --seed
    value): with --seed-file they show the path, never the seed. The measurement catches a mutant
    command echo that shows --seed's value."""
    problems = tmp_path / "problems.toml"
    problems.write_text(PROBLEM)
    argv = ["bench", "--file", str(problems), "--json", "--workers", "1"]
    path = seed_file(tmp_path)
    results = [run(capsys, [*argv, *given, "--out", str(tmp_path / name)])
               for name, given in [("flag", ["--seed", SEED]), ("file", ["--seed-file", str(path)])]]
    assert [r["problems"] for r in results[1:]] == [r["problems"] for r in results[:1]]
    assert results[1]["randomness"] == bench.SEEDED and "--seed-file" in bench.SEEDED
    assert leaked(tmp_path / "flag") == leaked(tmp_path / "file") == []
    assert f"--seed-file {path}" in (tmp_path / "file" / "bench.md").read_text()
    with pytest.MonkeyPatch.context() as patch:  # the mutant: the command echoed as it was typed
        patch.setattr(bench, "shown_command", lambda args: " ".join(["dpopt", *args]))
        run(capsys, [*argv, "--seed", SEED, "--out", str(tmp_path / "echoed")])
    assert leaked(tmp_path / "echoed") == ["bench.json", "bench.md"]


@pytest.mark.parametrize("argv", [RUN, TUNE, AUDIT, ["bench", "--quick"]], ids=["run", "tune", "audit", "bench"])
def test_seed_and_seed_file_together_are_refused_in_one_line(capsys, tmp_path, argv):
    out = [] if argv is AUDIT else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--seed", "3", "--seed-file", str(seed_file(tmp_path)), *out])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "dpopt: error: argument --seed-file: not allowed with argument --seed\n"
    assert not (tmp_path / "out").exists()


def test_a_seed_file_open_to_others_is_refused_catches_a_reader_that_does_not_check(capsys, tmp_path, monkeypatch):
    """Whoever can read the file knows the seed, whoever can write it sets one: a file that group or
    others may read or write is refused (exit 2, nothing written), naming the file and the fix; the
    mutant that reads any file runs (exit 0) and the test's measurement sees it."""
    path = seed_file(tmp_path, mode=0o644)

    def refused() -> str:
        code = main([*RUN, "--seed-file", str(path), "--out", str(tmp_path / "out")])
        return capsys.readouterr().err if code == 2 and not (tmp_path / "out").exists() else ""

    error = refused()
    assert error == (f"dpopt: error: seed_file={str(path)!r} is open to other users (mode 0644): anyone who can read "
                     "it knows the seed the guarantee rests on, anyone who can write it can set a seed of their "
                     f"choosing; it was not used. Fix: chmod 600 {str(path)!r}\n")
    assert SEED not in error
    path.chmod(0o620)  # writable by the group: refused too
    assert "(mode 0620)" in refused()
    monkeypatch.setattr(journal, "owner_only", lambda *args, **kwargs: None)  # the mutant: no check
    assert refused() == ""


@pytest.mark.parametrize("text", ["-5\n", "5 6\n", "0x10", "", "seven", "1" * 101], ids=[
    "negative", "two", "hex", "empty", "word", "too-long"])
def test_a_seed_file_must_hold_one_integer_and_its_content_is_never_shown(capsys, tmp_path, text):
    path = seed_file(tmp_path, text)
    assert main([*RUN, "--seed-file", str(path), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error == (f"dpopt: error: seed_file={str(path)!r} must hold one integer >= 0 (at most 100 digits) and "
                     "nothing else; its content is not shown here: it is secret\n")
    assert not (tmp_path / "out").exists()


def test_a_missing_seed_file_is_refused_naming_it(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    assert main([*RUN, "--seed-file", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"dpopt: error: seed_file={str(missing)!r} cannot be read (No such file or "
                                       "directory): give a file that holds the seed, one integer >= 0\n")


def test_white_space_around_the_integer_is_allowed(tmp_path):
    for text, expected in [(" 42 \n", 42), ("\n0\n", 0), (SEED, int(SEED))]:
        args = argparse.Namespace(seed=None, seed_file=str(seed_file(tmp_path, text)))
        assert common.seed_of(args) == expected
    assert common.seed_of(argparse.Namespace(seed=7, seed_file=None)) == 7
    assert common.seed_of(argparse.Namespace(seed=None, seed_file=None)) is None
