"""The command line's banded matrix factorisation, adaptive clipping and DP-AdamBC: the flags of
``dpopt run`` (ranges checked when the command line is read, the library's refusals as one-line
errors), and ``calibrate``/``account`` of the ``banded-mf`` mechanism (the recipe's multipliers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpopt.cli import main

RUN = ["run", "--dataset", "adult", "--epsilon", "1", "--steps", "8", "--seed", "4", "--json"]


@pytest.mark.parametrize("extra,message", [
    (["--algorithm", "dp-sgd", "--bands", "0"], "--bands=0 must be >= 1"),
    (["--algorithm", "dp-sgd", "--clip-quantile", "1.5"], "--clip-quantile=1.5 must be in (0, 1)"),
    (["--algorithm", "dp-sgd", "--clip-quantile", "0.5", "--clip-lr", "0"], "--clip-lr=0.0 must be > 0 and finite"),
    (["--algorithm", "dp-sgd", "--clip-quantile", "0.5", "--count-noise", "-1"],
     "--count-noise=-1.0 must be > 0 and finite"),
    (["--algorithm", "dp-sgd", "--optimizer", "adambc", "--adam-gamma", "0"],
     "--adam-gamma=0.0 must be > 0 and finite"),
    (["--algorithm", "dp-sgd", "--bands", "4", "--clip-quantile", "0.5"],
     "bands=4 (banded matrix factorisation) is refused with clip_quantile=0.5: correlated noise needs the same "
     "sensitivity at every step, and adaptive clipping changes it"),
    (["--algorithm", "dp-srm", "--bands", "4"],
     "bands=4 (correlated noise) is refused for algorithm='dp-srm': its first step releases at (σ0, C1)"),
    (["--algorithm", "dp-gd", "--clip-quantile", "0.5"],
     "clip_quantile=0.5 (adaptive clipping) is refused for algorithm='dp-gd'"),
])
def test_run_refuses_bad_values_of_the_new_flags_naming_them(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             extra: list[str], message: str) -> None:
    assert main([*RUN, *extra, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpopt: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _theta(capsys: pytest.CaptureFixture[str], folder: Path, *extra: str) -> list[float]:
    assert main([*RUN, *extra, "--out", str(folder)]) == 0
    capsys.readouterr()
    return json.loads((folder / "history.json").read_text())["theta"]


def test_run_passes_the_new_flags_to_the_algorithm(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--bands`` reaches the algorithm: dp-bandmf at one band is dp-sgd bit for bit, dp-sgd at
    four bands is dp-bandmf (its default) bit for bit, and neither is plain dp-sgd; DP-AdamBC and
    adaptive clipping train to another θ than plain DP-SGD."""
    plain = _theta(capsys, tmp_path / "sgd", "--algorithm", "dp-sgd")
    assert _theta(capsys, tmp_path / "b1", "--algorithm", "dp-bandmf", "--bands", "1") == plain
    banded = _theta(capsys, tmp_path / "b4", "--algorithm", "dp-sgd", "--bands", "4")
    assert _theta(capsys, tmp_path / "bandmf", "--algorithm", "dp-bandmf") == banded != plain
    assert _theta(capsys, tmp_path / "adam", "--algorithm", "dp-sgd", "--optimizer", "adambc", "--lr", "0.01") != plain
    assert _theta(capsys, tmp_path / "quantile", "--algorithm", "dp-sgd", "--clip-quantile", "0.5") != plain


AUDIT = ["audit", "--epsilon", "2", "--steps", "4", "--runs", "100", "--json"]


def test_audit_takes_the_new_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """``dpopt audit`` audits the banded algorithm it is given (its groups of 20 records: 2 bands of a
    batch of 20 on 100 records), and refuses what the library refuses, naming it."""
    assert main([*AUDIT, "--algorithm", "dp-bandmf", "--bands", "2", "--batch-size", "20"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.99 * 2 <= result["claimed_epsilon"] <= 2 and result["epsilon_lower_bound"] <= 2
    assert main([*AUDIT, "--algorithm", "dp-bandmf", "--bands", "4", "--batch-size", "20", "--clip-quantile",
                 "0.5"]) == 2
    assert capsys.readouterr().err.startswith("dpopt: error: bands=4 (banded matrix factorisation) is refused with "
                                              "clip_quantile=0.5")


# ------------------------------------------------------------------ calibrate and account: banded-mf
RECIPE = ["--mechanism", "banded-mf", "--dataset-size", "50000", "--batch-size", "500", "--steps", "2000",
          "--delta", "1e-5", "--json"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("bands,multiplier", [(1, 1.149), (4, 1.981), (16, 3.751)])
def test_calibrate_banded_mf_gives_the_recipes_multipliers_and_account_inverts_it(
        capsys: pytest.CaptureFixture[str], bands: int, multiplier: float) -> None:
    """n = 50,000, T = 2,000, B = 500, δ = 1e-5, ε = 2: the amplified banded recipe (⌈T/b⌉ rounds
    of the Poisson-sampled Gaussian at b·B/n) gives 1.149, 1.981, 3.751 for b = 1, 4, 16; account
    of that multiplier gives back ε (within the calibration's tolerance, below)."""
    calibrated = _json(capsys, ["calibrate", "--bands", str(bands), "--epsilon", "2", *RECIPE])
    assert round(calibrated["noise_multiplier"], 3) == multiplier
    assert calibrated["bands"] == bands and calibrated["neighboring_relation"] == "add/remove-one"
    accounted = _json(capsys, ["account", "--bands", str(bands), "--noise-multiplier",
                               repr(calibrated["noise_multiplier"]), *RECIPE])
    assert accounted["epsilon"] == pytest.approx(calibrated["epsilon"], rel=1e-12)
    assert 2 * (1 - 2e-4) <= accounted["epsilon"] <= 2


@pytest.mark.parametrize("extra,message", [
    (["--mechanism", "banded-mf", "--bands", "0", "--dataset-size", "100", "--batch-size", "10"],
     "--bands=0 must be >= 1"),
    (["--mechanism", "banded-mf", "--bands", "20", "--dataset-size", "100", "--batch-size", "10"],
     "--bands=20 times --batch-size=10 must be <= --dataset-size=100"),
    (["--mechanism", "banded-mf", "--bands", "2"], "mechanism=banded-mf needs --dataset-size and --batch-size"),
    (["--mechanism", "poisson-gaussian", "--bands", "2", "--sampling-rate", "0.1"],
     "--bands is for mechanism=banded-mf, not mechanism=poisson-gaussian"),
])
def test_banded_mf_refuses_bad_input(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert main(["account", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", *extra]) == 2
    assert capsys.readouterr().err.startswith(f"dpopt: error: {message}")
