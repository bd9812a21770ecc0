"""One convention for every command: ``--json`` prints one JSON document and nothing else on
standard output; without it a short summary for a person (a table, the paths written), never JSON.
Defaults are shown in ``--help``. ``--out`` of ``run`` and ``tune``: a refused run leaves nothing
there, a finished one is not run again, an interrupted one says what it kept.
(``reproduce`` and ``bench``: tests/experiments/test_reproduce.py, tests/test_bench.py.)"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from dpopt.cli import main, parser

RUN = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--seed", "0"]
TUNE = ["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "3", "--grid",
        "lr=0.1,0.5", "--trials-mean", "1.5", "--seed", "0"]
AUDIT = ["audit", "--algorithm", "dp-gd", "--epsilon", "2", "--runs", "20", "--steps", "2"]
COMMANDS = {
    "account": (["account", "--mechanism", "gaussian", "--noise-multiplier", "2", "--steps", "3", "--delta", "1e-5"],
                "epsilon", []),
    "calibrate": (["calibrate", "--mechanism", "tree", "--epsilon", "1", "--steps", "8", "--delta", "1e-6"],
                  "noise_multiplier", []),
    "run": (RUN, "final", ["history.json", "summary.md", "curves.png", "checkpoint.pt"]),
    "tune": (TUNE, "hyperparameters", ["tuned.json"]),
    "audit": (AUDIT, "verdict", []),
    "data list": (["data", "list"], "datasets", []),
    "data info": (["data", "info", "adult"], "n_train", []),
}


def _out(command: str, tmp_path: Path, name: str) -> list[str]:
    return ["--out", str(tmp_path / name)] if command in ("run", "tune") else []


@pytest.mark.parametrize("command", list(COMMANDS))
def test_json_is_one_document_and_the_summary_is_a_table_with_the_paths_written(command, tmp_path, capsys):
    argv, key, files = COMMANDS[command]
    assert main([*argv, *_out(command, tmp_path, "json"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # the whole of stdout: one document
    assert key in document
    assert main([*argv, *_out(command, tmp_path, "text")]) == 0
    shown = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown)
    header, rule = shown.splitlines()[:2]
    assert set(rule) <= {"-", " "} and len(header.split()) >= 3  # a table of the key numbers
    for name in files:
        assert f"  {tmp_path / 'text' / name}\n" in shown
    assert ("written:" in shown) == bool(files)


def test_a_run_on_a_terminal_shows_its_numbers_not_a_json_blob(tmp_path, capsys):
    """Finding: `run` printed a JSON blob on a terminal while tune, calibrate and bench printed text."""
    assert main([*RUN, "--out", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    history = json.loads((tmp_path / "history.json").read_text())
    row = shown.splitlines()[2].split()
    assert row[:2] == ["dp-sgd", "adult"] and float(row[2]) == pytest.approx(history["final"]["epsilon"], rel=1e-3)
    assert "{" not in shown and f"randomness: {history['randomness']}" in shown


def _actions(top: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    commands = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    return [(name, action) for name, sub in commands.choices.items() for action in sub._actions]


def test_run_help_shows_the_default_of_delta_and_batch_size(capsys):
    """Finding: `--help` showed no defaults."""
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert re.search(r"--delta DELTA .*?\(default: 1e-05\)", shown)
    assert re.search(r"--batch-size BATCH_SIZE .*?\(default: 256\)", shown)
    assert "(default: None)" not in shown and "(default: False)" not in shown


def test_every_option_with_a_default_says_it_in_its_help():
    """The help text is where the default is shown: an option without one would hide its default."""
    silent = [f"{name} {action.option_strings}" for name, action in _actions(parser())
              if action.default not in (None, False, [], argparse.SUPPRESS) and action.help != argparse.SUPPRESS
              and not action.help]
    assert silent == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--delta", "0.01"], "delta=0.01 must be < 1/n = 3.07e-05"),
    (["--batch-size", "1000000"], "batch_size=1000000 must be >= 1 and <= n (training records)=32561"),
    (["--model", "ridge"], "dataset='adult' is a binary task; model='ridge' needs a regression data set"),
])
def test_a_refused_run_leaves_nothing_in_out(argv, message, tmp_path, capsys):
    """Finding: a refused run left a stale `checkpoint.pt.lock` (and the folder) behind: the command
    line took the lock of --out before checking anything."""
    out = tmp_path / "fresh"
    assert main([*RUN, "--out", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_finished_run_says_so_and_how_to_start_over(tmp_path, capsys):
    """Finding: rerunning a finished command silently returned the old result. It now exits 2 and
    leaves the finished run's files as they were."""
    assert main([*RUN, "--out", str(tmp_path), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert main([*RUN, "--out", str(tmp_path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"dpopt: error: out={str(tmp_path)!r} holds a finished run (history.json): its results are there. To start "
        "over, use another --out, or remove that folder knowingly: the ε the run spent on these data stays spent, "
        "and history.json is its record\n")
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    assert first["steps_done"] == 5


def test_a_finished_run_hides_no_input_error_and_names_the_settings_that_differ(tmp_path, capsys):
    """Finding: after one run, ``dpopt run --epsilon -1`` into the same --out answered "holds a finished
    run" instead of the ε error, and a run with other settings was refused without saying which."""
    assert main([*RUN, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    negative = [*RUN[:RUN.index("--epsilon")], "--epsilon", "-1", *RUN[RUN.index("--epsilon") + 2:]]
    assert main([*negative, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "dpopt: error: epsilon=-1.0 must be > 0 and finite\n"
    assert main([*RUN, "--epsilon", "2", "--algorithm", "dp-srm", "--out", str(tmp_path)]) == 2
    assert (f"dpopt: error: out={str(tmp_path)!r} holds a finished run with other settings (algorithm 'dp-sgd' "
            "there, 'dp-srm' here; epsilon_target 1.0 there, 2.0 here) (history.json)") in capsys.readouterr().err
    # a newcomer's next try: the same command with another step size and more steps
    assert main([*RUN, "--lr", "0.3", "--steps", "7", "--out", str(tmp_path)]) == 2
    assert (f"dpopt: error: out={str(tmp_path)!r} holds a finished run with other settings (lr 0.5 there, 0.3 here; "
            "steps 5 there, 7 here) (history.json)") in capsys.readouterr().err


def test_a_finished_tuning_says_so_before_any_work(tmp_path, capsys):
    """A second tuning into the same --out would spend ε again and overwrite the record of the first."""
    assert main([*TUNE, "--out", str(tmp_path)]) == 0
    written = (tmp_path / "tuned.json").read_bytes()
    capsys.readouterr()
    assert main([*TUNE, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"dpopt: error: out={str(tmp_path)!r} holds a finished tuning "
                                              "(tuned.json): its results are there. To start over, use another --out")
    assert (tmp_path / "tuned.json").read_bytes() == written


def test_an_interrupted_run_says_what_it_kept(tmp_path, capsys, monkeypatch):
    import dpopt.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dpopt.train, "train", interrupted)
    assert main([*RUN, "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "dpopt: interrupted; no checkpoint was written yet\n"


def test_dp_srms_noise_ratio_reaches_its_builder(tmp_path, capsys):
    """--noise-ratio is DP-SRM's knob: σ0/σ of the calibrated run is the ratio given."""
    argv = ["run", "--algorithm", "dp-srm", "--epsilon", "1", "--steps", "3", "--noise-ratio", "2.5",
            "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    shown = json.loads((tmp_path / "history.json").read_text())["hyperparameters"]
    z0, z = (float(re.search(rf"{name} = ([0-9.e+-]+)", shown)[1])
             for name in ("noise_multiplier0", "noise_multiplier"))
    assert z0 / z == pytest.approx(2.5, rel=1e-12)


def test_version_and_a_missing_data_directory(tmp_path, capsys):
    """Finding: no ``--version``; ``--data-dir /nonexistent`` was accepted, to fail only when a data set
    was read."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"dpopt {importlib.metadata.version('dpopt')}\n"
    missing = str(tmp_path / "nonexistent")
    for argv in ([*RUN, "--out", str(tmp_path / "out")], ["reproduce", "aclip-synthetic"], ["bench"]):
        with pytest.raises(SystemExit) as done:
            main([*argv, "--data-dir", missing])
        assert done.value.code == 2
        assert capsys.readouterr().err == (f"dpopt: error: argument --data-dir: data_dir={missing!r} must be an "
                                           "existing directory\n")
    assert not (tmp_path / "out").exists()
