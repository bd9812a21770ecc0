"""A newcomer's first commands: what ``run``, ``tune`` and ``reproduce --help`` show a person, progress
where standard error is not a terminal, and what ``./dev run`` says it runs."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import tomllib
from pathlib import Path

import pytest

from dpopt import progress
from dpopt.cli import main, parser

REPO = Path(__file__).resolve().parents[1]
#: A Python repr where a person reads: a class object, a dict or a set (Python's quotes or JSON's).
REPRS = ("<class", "{'", "'}", '{"', "object at 0x")


def python_reprs(text: str) -> list[str]:
    """The repr patterns :data:`REPRS` found in ``text``, and dataclass reprs (``Name(field=``)."""
    return [pattern for pattern in REPRS if pattern in text] + re.findall(r"\b[A-Z]\w*\(\w+=", text)


def test_the_repr_scan_catches_the_old_outputs() -> None:
    """The scan finds what the commands used to show (the measurement the tests below rely on)."""
    assert python_reprs("hyperparameters: DPSGD(lr=0.5, sampling=<class 'dpopt.sampling.Poisson'>)") == [
        "<class", "DPSGD(lr="]
    assert python_reprs("trials per tuning: TruncatedNegativeBinomial(mean=3.0, shape=3.0)") == [
        "TruncatedNegativeBinomial(mean="]
    assert python_reprs("hyperparameters: DPSGD(lr = 0.5, clip = 1.0)") == []  # name = value, for a person
    assert python_reprs("selected {'lr': 3.0}: validation error 0.2") == ["{'"]
    assert python_reprs("{'rule': 'last'}") == ["{'", "'}"]
    assert python_reprs('* DP-SGD: {"lr": [0.5]}') == ['{"']
    assert python_reprs("selected lr = 3.0: validation error 0.2") == []


def _command(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def diagnosed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """``dpopt run --diagnostics`` of 5 steps on the bundled Adult data, standard error not a terminal
    with a progress line due at every step: (stdout, stderr, --out)."""
    out = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress, "EVERY_S", 0.0)
        code, shown, err = _command(["run", "--algorithm", "dp-sgd", "--epsilon", "1", "--steps", "5", "--seed", "0",
                                     "--diagnostics", "--out", str(out)])
    assert code == 0, err
    return shown, err, out


def test_run_shows_its_diagnostics_labelled_not_private(diagnosed_run: tuple[str, str, Path]) -> None:
    """Finding: ``run --diagnostics`` changed nothing on screen. The summary shows the diagnostics it
    computed at the output (the training objective …), labelled NOT PRIVATE."""
    shown, _, out = diagnosed_run
    line = next(line for line in shown.splitlines() if line.startswith("diagnostics at the output"))
    objective = json.loads((out / "history.json").read_text())["diagnostics"]["final"]["objective"]
    assert line.startswith("diagnostics at the output (NOT PRIVATE): objective = ")
    assert f"objective = {objective:.4g}," in line
    assert "NOT PRIVATE: computed from the training data without noise" in shown


def test_run_without_diagnostics_shows_none(tmp_path: Path) -> None:
    """No diagnostics asked for: no NOT PRIVATE number on screen."""
    code, shown, err = _command(["run", "--algorithm", "dp-gd", "--epsilon", "1", "--steps", "2", "--seed", "0",
                                 "--out", str(tmp_path)])
    assert code == 0, err
    assert "NOT PRIVATE" not in shown
    assert "diagnostics at the output" not in shown


def test_run_prints_progress_lines_when_stderr_is_not_a_terminal(diagnosed_run: tuple[str, str, Path]) -> None:
    """Finding: off a terminal (a log, a pipe) a long run printed nothing until it ended. Now a plain
    line per due interval (every step here, the interval set to 0), and no bar's carriage returns."""
    _, err, _ = diagnosed_run
    lines = [line for line in err.splitlines() if line.startswith("DPSGD: ")]
    assert [re.fullmatch(r"DPSGD: (\d)/5 steps done, \d+ s", line)[1] for line in lines] == list("123455")
    assert "\r" not in err


def test_progress_lines_every_interval_by_the_clock(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One line per :data:`dpopt.progress.EVERY_S` seconds of an injected clock, a last one at the end,
    none for a task shorter than the interval; a bar where standard error is a terminal."""
    monkeypatch.setattr(progress, "EVERY_S", 10.0)  # the default (tests turn the lines off)
    ticks = iter(range(0, 100))  # one second per reading of the clock
    with progress.Lines(25, desc="runs", unit="run", clock=lambda: float(next(ticks))) as lines:
        for _ in range(25):
            lines.update()
    assert capsys.readouterr().err.splitlines() == ["runs: 10/25 runs done, 10 s", "runs: 20/25 runs done, 20 s",
                                                    "runs: 25/25 runs done, 26 s"]
    with progress.Lines(3, desc="short", clock=lambda: 0.0) as short:
        short.update(3)
    assert capsys.readouterr().err == ""
    assert isinstance(progress.bar(3, desc="x"), progress.Lines)  # pytest's stderr is not a terminal


def test_a_pool_prints_lines_while_no_run_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: ``dpopt reproduce dp-srm-mnist`` off a terminal printed nothing for its first 452 s,
    until its first run ended. The pool's lines come every interval while its runs go on: here a run
    that ends only once a line saying that none is done yet has been printed."""
    from dpopt.jobs.pool import Pool

    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    written, printed = [], threading.Event()

    def line(self: progress.Lines, now: float) -> None:
        written.append(f"{self.desc}: {self.n}/{self.total}")
        printed.set()
    monkeypatch.setattr(progress.Lines, "_line", line)

    class Waits:
        def run(self, problem: object) -> bool:
            return printed.wait(60)

        def described(self, problem: object) -> dict[str, str]:
            return {}
    pool = Pool(1, progress=True)
    pool.expect(1)
    assert pool.start(Waits(), "unused").result()  # a line came while the run went on
    pool.close()
    assert written[0] == "runs: 0/1" and written[-1] == "runs: 1/1"


def test_run_and_tune_show_no_python_reprs(diagnosed_run: tuple[str, str, Path], tmp_path: Path) -> None:
    """Finding: ``history.json``'s hyperparameters showed ``sampling=<class 'dpopt.sampling.Poisson'>``
    and tune's summary ``selected {'lr': 1.0}``. Every text for a person, and those JSON fields, now
    read ``name = value``."""
    shown, _, out = diagnosed_run
    hyperparameters = json.loads((out / "history.json").read_text())["hyperparameters"]
    assert hyperparameters.startswith("DPSGD(lr = 0.5, clip = 1.0, noise_multiplier = ")
    assert "sampling = Poisson" in hyperparameters
    for text in (shown, (out / "summary.md").read_text(), hyperparameters):
        assert python_reprs(text) == [], text
    code, tuned, err = _command(["tune", "--algorithm", "dp-sgd", "--epsilon", "1", "--steps", "3", "--grid",
                                 "lr=0.1,1", "--trials-mean", "2", "--seed", "0", "--out", str(tmp_path)])
    assert code == 0, err
    algorithm = json.loads((tmp_path / "tuned.json").read_text())["algorithm"]
    assert re.search(r"^selected lr = (0\.1|1\.0): validation error ", tuned, re.M), tuned
    for text in (tuned, algorithm):
        assert python_reprs(text) == [], text


def test_reproduce_help_lists_every_experiment_with_its_measured_cost(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: ``reproduce --help`` named one experiment and no cost. It lists each, one a line, with
    the wall time of the whole command and of ``--quick`` ("not measured" where no run was timed)."""
    from dpopt.experiments import EXPERIMENTS

    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal: still one line each

    with pytest.raises(SystemExit):
        parser().parse_args(["reproduce", "--help"])
    shown = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert re.search(rf"^{re.escape(name)}: ((\d+ h )?\d+ min \d+ s|not measured).*; --quick: (not measured|\d)",
                         shown, re.M), name
    assert "dp-srm-ijcnn1: 3 min 36 s; --quick: 39 s" in shown  # docs/reproductions/runs.toml: 215.78 s and 38.78 s


def test_the_dev_scripts_header_names_what_dev_run_runs() -> None:
    """Finding: ``./dev``'s header listed four methods for ``./dev run``; it runs the bench's
    adult-logistic problem, main variant, whose methods are seven."""
    dev = (REPO / "dev").read_text()
    header = " ".join(line.lstrip("# ").strip() for line in dev.split("set -euo")[0].splitlines()
                      if line.startswith("#"))
    run = header.split("./dev run")[1].split("./dev test")[0]
    problems = tomllib.loads((REPO / "src" / "dpopt" / "bench" / "problems.toml").read_text())
    methods = problems["adult-logistic"]["methods"]
    listed = run.split("(")[1].split(":")[0].split(", ")
    assert len(listed) == len(methods) == 7 and "seven private optimisers" in run
    assert "--problem adult-logistic --variant main" in dev
    assert f"ε = {problems['adult-logistic']['main']['epsilons'][0]:g}" in run
