"""The command line: machine-readable outputs and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpopt.cli import main

ACCOUNT = ["account", "--mechanism", "poisson-gaussian", "--noise-multiplier", "1.3", "--sampling-rate", "0.02",
           "--steps", "1500", "--delta", "1e-5", "--json"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_account_matches_dp_accounting_pld(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, ACCOUNT)
    reference = pld_privacy_accountant.PLDAccountant()
    reference.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(1.3)), 1500))
    assert result["epsilon"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-3)
    assert result["accountant"] == "pld"
    assert result["neighboring_relation"] == "add/remove-one"


def test_calibrate_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    target = 3.0
    calibrated = _json(capsys, ["calibrate", "--mechanism", "poisson-gaussian", "--epsilon", str(target),
                                "--sampling-rate", "0.02", "--steps", "1500", "--delta", "1e-5", "--json"])
    argv = ACCOUNT.copy()
    argv[argv.index("1.3")] = repr(calibrated["noise_multiplier"])
    achieved = _json(capsys, argv)["epsilon"]
    assert 0.99 * target <= achieved <= target
    assert calibrated["epsilon"] == pytest.approx(achieved, rel=1e-12)


def test_wor_gaussian_uses_rdp_under_replace_one(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json(capsys, ["account", "--mechanism", "wor-gaussian", "--noise-multiplier", "1.3", "--dataset-size",
                            "10000", "--batch-size", "200", "--steps", "500", "--delta", "1e-5", "--json"])
    reference = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    reference.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(10000, 200,
                                                                                  dpa.GaussianDpEvent(1.3)), 500))
    assert result["accountant"] == "rdp"
    assert result["neighboring_relation"] == "replace-one"
    assert result["epsilon"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console entry point, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "dpopt.cli", *args], capture_output=True, text=True, timeout=300)


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``main(args)`` in this process: (exit code, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = int(exit_.code)
    return code, capsys.readouterr().err


RUN = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "-1"], "epsilon=-1.0 must be > 0"),
    (ACCOUNT[:-3] + ["--delta", "1"], "delta=1.0 must be in (0, 1)"),
    (ACCOUNT[:-3] + ["--delta", "0"], "delta=0.0 must be in (0, 1)"),
    (RUN + ["--batch-size", "1000000"], "batch_size=1000000 must be >= 1 and <= n (training records)=32561"),
    (["run", "--algorithm", "dp-sdg", "--dataset", "adult", "--epsilon", "1"],
     "algorithm='dp-sdg' must be one of: dp-sgd, dp-bandmf, dp-gd, dp-srm, rrpsgd, dp-agd, aclip, storm, "),
    (["run", "--algorithm", "dp-sgd", "--dataset", "mnist-but-wrong", "--epsilon", "1"],
     "dataset='mnist-but-wrong' must be one of:"),
    (["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--model", "ridge", "--epsilon", "1"],
     "dataset='adult' is a binary task; model='ridge' needs a regression data set"),
    (["account", "--mechanism", "laplace", "--noise-multiplier", "1", "--steps", "1", "--delta", "1e-5"],
     "argument --mechanism: invalid choice: 'laplace'"),
])
def test_bad_input_is_one_line_exit_2(argv: list[str], expected: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = _main(capsys, *argv, "--out", str(tmp_path)) if argv[0] == "run" else _main(capsys, *argv)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert expected in lines[0]


def test_console_error_has_no_traceback() -> None:
    result = _cli("account", "--mechanism", "gaussian", "--noise-multiplier", "0", "--steps", "3", "--delta", "1e-5")
    assert result.returncode == 2
    assert result.stderr == "dpopt: error: noise_multiplier=0.0 must be > 0 and finite\n"


def test_missing_and_corrupt_data_files(tmp_path: Path, shared_data_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, stderr = _main(capsys, "run", "--algorithm", "dp-sgd", "--dataset", "ijcnn1", "--epsilon", "1",
                         "--data-dir", str(empty), "--out", str(tmp_path / "out"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "dpopt data fetch ijcnn1" in stderr
    corrupt = tmp_path / "corrupt" / "ijcnn1"
    corrupt.mkdir(parents=True)
    for name in ("ijcnn1.trn.bz2", "ijcnn1.tst.bz2"):
        blob = bytearray((shared_data_dir / "ijcnn1" / name).read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        (corrupt / name).write_bytes(bytes(blob))
    code, stderr = _main(capsys, "run", "--algorithm", "dp-sgd", "--dataset", "ijcnn1", "--epsilon", "1",
                         "--data-dir", str(corrupt.parent), "--out", str(tmp_path / "out"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "sha256" in stderr


def test_run_writes_results_and_respects_max_epsilon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json(capsys, [*RUN[:-2], "--steps", "200", "--max-epsilon", "0.5", "--json", "--out", str(tmp_path)])
    assert summary["final"]["epsilon"] <= 0.5
    assert 0 < summary["steps_done"] < 200
    assert summary["stopped"] == "max_epsilon=0.5 reached"
    assert {p.name for p in tmp_path.iterdir()} >= {"history.json", "summary.md", "curves.png", "checkpoint.pt"}


@pytest.mark.parametrize(("flag", "value", "dest"), [
    ("--feature-bounds", "-5:5", "feature_bounds"), ("--target-bounds", "-1:1", "target_bounds"),
    ("--feature-bounds", "-.5:.5", "feature_bounds"), ("--lr", "-1e-3", "lr"),
])
def test_a_value_starting_with_a_minus_sign_is_a_value_not_an_option(flag: str, value: str, dest: str) -> None:
    """Finding: `--feature-bounds -5:5` was read as an option (argparse takes only plain negative
    numbers as values); only `--feature-bounds=-5:5` worked."""
    from dpopt.cli import parser

    for command in ("run", "tune"):
        args = parser().parse_args([command, "--algorithm", "dp-sgd", "--epsilon", "1", flag, value])
        assert str(getattr(args, dest)) == str(float(value) if dest == "lr" else value)


def test_an_implausible_epsilon_is_warned_about_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--mechanism", "gaussian", "--epsilon", "1e6", "--steps", "1", "--delta", "1e-5"]) == 0
    assert capsys.readouterr().err == ("dpopt: warning: epsilon=1e+06 is above 100: e^ε bounds how much more likely "
                                       "an output may become with one record added, and this bound says nothing "
                                       "useful; the run goes ahead\n")


def test_each_dpopt_warning_is_shown_once_per_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding: ``dpopt reproduce dp-srm-ijcnn1`` printed the same line ``dpopt: warning:
    accountant='pld' was asked for and 'rdp' is used: …`` once per run, 20 times. Each distinct
    message is shown once per command (the next command shows it again), a different one as well."""
    from dpopt._validate import DpoptWarning, warnings_in_one_line

    for _command in range(2):
        with warnings.catch_warnings():
            warnings_in_one_line()
            for text in ("the same setting", "the same setting", "another setting", "the same setting"):
                warnings.warn(text, DpoptWarning, stacklevel=1)
        assert capsys.readouterr().err == "dpopt: warning: the same setting\ndpopt: warning: another setting\n"


def test_the_accountants_log_messages_are_dpopt_warnings_shown_once_per_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding: the RDP accountant's notes came as raw ``WARNING:absl:…`` lines, one per Rényi order
    left out (dozens in a bench), unlike every other warning of a command. Each command shows each
    kind once, the next command again (its own kind of message, not hidden by an earlier command's)."""
    for rate in ("0.0197", "0.019655"):
        assert main(["account", "--mechanism", "poisson-gaussian", "--noise-multiplier", "0.496585", "--sampling-rate",
                     rate, "--steps", "100", "--delta", "1e-5", "--accountant", "rdp", "--json"]) == 0
        err = capsys.readouterr().err
        assert "absl" not in err
        assert err == (f"dpopt: warning: dp_accounting: _compute_log_a_frac failed to converge after 1000 iterations "
                       f"with q={float(rate):f}, sigma=0.496585, alpha=1.100000. Excluding this order from the epsilon "
                       "computation. (further messages of this kind not shown)\n")
