"""Preset files: the loader's checks, the tuned records' meaning, and the generic verdict rule."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpopt._validate import DpoptError
from dpopt.experiments import EXPERIMENTS, declared
from dpopt.experiments.verdicts import comparison_lines


def _copy(tmp_path: Path, name: str = "dp-srm-ijcnn1") -> Path:
    shutil.copy(declared.FOLDER / f"{name}.toml", tmp_path / f"{name}.toml")
    return tmp_path / f"{name}.toml"


def test_every_preset_file_loads_and_names_a_registered_preset() -> None:
    files = sorted(declared.FOLDER.glob("*.toml"))
    assert files
    for path in files:
        assert declared.load(path.stem)["name"] in EXPERIMENTS


def test_an_unknown_key_is_an_error_naming_the_file_and_the_key(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text("epsilon_list = [1.0]\n" + path.read_text())
    with pytest.raises(DpoptError, match=rf"{path}: epsilon_list is not a known key"):
        declared.load("dp-srm-ijcnn1", tmp_path)
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("[methods.DP-GD]\n", "[methods.DP-GD]\nlearning_rate = 1.0\n"))
    with pytest.raises(DpoptError, match=rf"{path}: methods.DP-GD.learning_rate is not a known key"):
        declared.load("dp-srm-ijcnn1", tmp_path)


def test_a_missing_key_is_an_error_naming_the_file_and_the_key(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace('command = "dpopt reproduce dp-srm-ijcnn1 --retune"\n', ""))
    with pytest.raises(DpoptError, match=rf"{path}: tuning.command is missing"):
        declared.load("dp-srm-ijcnn1", tmp_path)
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("seeds = 10\n", ""))
    with pytest.raises(DpoptError, match=rf"{path}: seeds is missing"):
        declared.load("dp-srm-ijcnn1", tmp_path)


def test_a_tuned_record_of_an_unknown_method_or_a_wrong_type_is_an_error(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace('{ method = "STORM",', '{ method = "SGD",'))
    with pytest.raises(DpoptError, match=r"tuned\[8\].method='SGD' is not one of the methods"):
        declared.load("dp-srm-ijcnn1", tmp_path)
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("seeds = 10\n", 'seeds = "ten"\n'))
    with pytest.raises(DpoptError, match=r"seeds='ten' has the wrong type"):
        declared.load("dp-srm-ijcnn1", tmp_path)


def test_tuned_records_per_epsilon_and_for_a_non_private_method() -> None:
    tuned = declared.load("dp-srm-ijcnn1").tuned()[None]
    assert tuned["DP-AGD"] == {0.2: {"max_step": 2.0}, 0.5: {"max_step": 10.0}}
    assert tuned["STORM"] == {None: {"lr": 32.0, "batch_size": 250}}  # non-private: one setting


def _payload() -> dict:
    def row(name: str, objective: float) -> dict:
        return {"algorithm": name, "epsilon": 0.2, "metrics": {"objective": {"mean": objective, "std": 0.01}}}

    return {"rows": [row("A", 0.5), row("B", 0.6), row("C", 0.51)],
            "t_tests": [{"epsilon": 0.2, "ours": "A", "baseline": "B", "p_objective": 0.001, "p_grad_norm": 0.01},
                        {"epsilon": 0.2, "ours": "A", "baseline": "C", "p_objective": 0.2, "p_grad_norm": 0.01}]}


def test_the_verdict_rule_counts_wins_and_explains_each_miss() -> None:
    lines = comparison_lines(_payload(), ("objective", "grad_norm"), {"C": "C is noisy."})
    assert lines == [
        "* A is below its baseline on every test metric (objective, grad_norm) with p < 0.05 in 1 of 2 comparisons.",
        "* **Miss:** ε = 0.2, A vs C: p = 0.2 (objective), 0.01 (grad_norm) — not significant at 0.05 on every "
        "metric (objective: 0.5 ± 0.01 vs 0.51 ± 0.01). C is noisy."]
