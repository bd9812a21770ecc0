"""A newcomer's ``dpopt reproduce``: warnings of the worker processes, a refused command's --out, and
what the toy preset's outputs show a person (no Python repr, ε = ∞ alone)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from dpopt import _validate, report
from dpopt.cli import main
from dpopt.jobs import Pool, running
from dpopt.experiments.reproduce import reproduce
import warning_job
from test_reproduce import _with

#: A Python repr where a person reads: a class object, a dict (Python's quotes or JSON's), a NaN spread.
REPRS = ("<class", "{'", "'}", '{"', "± nan", "∞ (")


def test_the_workers_warn_in_one_line_as_the_command_line(capfd: pytest.CaptureFixture[str]) -> None:
    """Finding: the worker processes of ``reproduce`` printed raw Python warnings (``…/train.py:306:
    DpoptWarning: …``) where the command line prints ``dpopt: warning: …``."""
    pool = Pool(2, warning_job.problem)
    try:
        assert pool.start(warning_job.Warning_(), "unused", key="k").result() == 1
    finally:
        pool.close()
    err = capfd.readouterr().err
    assert "dpopt: warning: a setting of the problem means little\n" in err
    assert "DpoptWarning" not in err and "warnings.warn" not in err


def test_the_driver_computes_on_one_thread_while_its_workers_run() -> None:
    """Finding: mnist-sota's driver computed its scattering features on two torch threads beside two
    one-thread workers, and each set of features took 186-229 s instead of 30-34 s alone: its threads
    waited on each other while one of them was off the CPU. While a pool's workers run, the driver
    uses one thread, and its own count again afterwards (also after an error); a pool without
    workers (its jobs run in the driver) keeps the count."""
    torch.set_num_threads(2)
    try:
        with running(Pool(2, warning_job.problem)):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="stopped"), running(Pool(2, warning_job.problem)):
            raise RuntimeError("stopped")
        assert torch.get_num_threads() == 2
        with running(Pool(1)):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_a_refused_reproduction_leaves_nothing_in_a_fresh_out(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """Findings: a reproduction refused after its --out was checked (here: a problem whose data are
    missing) left ``--out/runs/`` behind; and then ``--out`` itself (``dpopt reproduce aclip-cifar10``
    without CIFAR-10 left an empty ``results/aclip-cifar10/``). The saved runs' folder is made by the
    first run saved, and the folders the check made are removed again when the command fails; a
    folder that was there before stays."""
    def missing(key: object, data_dir: str | None) -> None:
        raise _validate.DpoptError("data_dir='nowhere' must hold the toy data (missing)")

    _with(monkeypatch, make_problem=missing)
    for out in (tmp_path / "fresh", tmp_path / "results" / "toy"):
        with pytest.raises(_validate.DpoptError, match="must hold the toy data"):
            reproduce("toy", quick=True, out=out, workers=1)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "there").mkdir()
    with pytest.raises(_validate.DpoptError, match="must hold the toy data"):
        reproduce("toy", quick=True, out=tmp_path / "there", workers=1)
    assert [path.name for path in tmp_path.rglob("*")] == ["there"]


def test_the_toy_reproductions_outputs_show_no_python_reprs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding: results.md showed grids as ``{"lr": [0.5]}`` and the summary ``∞ ± nan`` for the ε of
    the non-private row (over seeds its spread is undefined). Now ``lr = {0.5}`` and ``∞``."""
    _with(monkeypatch)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(io.StringIO()):
        assert main(["reproduce", "toy", "--quick", "--workers", "1", "--out", str(tmp_path)]) == 0
    results = (tmp_path / "results.md").read_text()
    for text in (shown.getvalue(), results):
        assert [pattern for pattern in REPRS if pattern in text] == [], text
    sgd = next(line for line in shown.getvalue().splitlines() if line.startswith("SGD "))
    assert sgd.split()[-1] == "∞"  # its ε
    assert "* DP-GD: lr = {0.01, 1}" in results and "| SGD non-private | none |" in results


def test_a_summary_with_an_undefined_spread_shows_its_mean_alone() -> None:
    """ε = ∞ over seeds: ``∞``, neither ``∞ (nan)`` nor ``∞ ± nan``; a defined spread is shown."""
    infinite = report.summarise([float("inf")] * 3)
    assert report.mean_std(infinite) == report.mean_std(infinite, "{} ± {}") == "∞"
    assert report.mean_std({"mean": float("inf"), "std": None}) == "∞"  # as results.json holds it
    assert report.mean_std(report.summarise([1.0, 3.0]), "{} ± {}") == "2 ± 1.414"
