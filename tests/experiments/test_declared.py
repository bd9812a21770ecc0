"""Preset files: the loader's checks, the tuned records' meaning, and the generic verdict rule."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpopt._validate import DpoptError
from dpopt.experiments import EXPERIMENTS, declared
from dpopt.experiments.verdicts import comparison_lines


def test_every_preset_file_loads_and_names_a_registered_preset() -> None:
    files = sorted(declared.FOLDER.glob("*.toml"))
    assert files
    for path in files:
        assert declared.load(path.stem)["name"] in EXPERIMENTS


#: (text replaced in dp-srm-ijcnn1.toml, by what, the error's message after the file's path)
BROKEN = [
    ("seeds = 10\n", "seeds = 10\nepsilon_list = [1.0]\n", "epsilon_list is not a known key"),
    ("[methods.DP-GD]\n", "[methods.DP-GD]\nlearning_rate = 1.0\n", "methods.DP-GD.learning_rate is not a known key"),
    ('command = "dpopt reproduce dp-srm-ijcnn1 --retune"\n', "", "tuning.command is missing"),
    ("seeds = 10\n", "", "seeds is missing"),
    ('{ method = "STORM",', '{ method = "SGD",', r"tuned\[8\].method='SGD' is not one of the methods"),
    ("seeds = 10\n", 'seeds = "ten"\n', "seeds='ten' has the wrong type"),
    ("[methods.DP-GD]\n", '[methods.DP-GD]\ntuner = "random"\n', "methods.DP-GD.tuner='random' must be one of: grid"),
    ("[explanations]\n", '[explanations]\nSGD = "why"\n', "explanations.SGD names no method"),
    ("[methods.DP-GD]\n", "[methods.DP-GD]\nnoise_scale = 0.5\n",
     "methods.DP-GD.noise_scale=0.5: a noise scale other than 1 is allowed only for a method whose name says "
     "NOT PRIVATE"),
    ('verdict_metrics = ["objective", "grad_norm"]', 'verdict_metrics = ["test_error"]',
     r"verdict_metrics=\['test_error'\] must be among test_metrics"),
]


@pytest.mark.parametrize(("old", "new", "message"), BROKEN)
def test_a_wrong_file_is_an_error_naming_the_file_and_the_key(tmp_path: Path, old: str, new: str,
                                                              message: str) -> None:
    path = tmp_path / "dp-srm-ijcnn1.toml"
    text = (declared.FOLDER / "dp-srm-ijcnn1.toml").read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(DpoptError, match=rf"^{path}: {message}"):
        declared.load("dp-srm-ijcnn1", tmp_path)


def test_a_variant_replaces_its_base_files_keys(tmp_path: Path) -> None:
    shutil.copy(declared.FOLDER / "dp-srm-ijcnn1.toml", tmp_path / "dp-srm-ijcnn1.toml")
    (tmp_path / "variant.toml").write_text('extends = "dp-srm-ijcnn1"\nname = "variant"\nseeds = 3\n')
    variant, base = declared.load("variant", tmp_path), declared.load("dp-srm-ijcnn1", tmp_path)
    assert variant["seeds"] == 3 and variant["methods"] == base["methods"] and "extends" not in variant.values


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
        "* A is below its baseline on objective and grad_norm with p < 0.05 in 1 of 2 comparisons.",
        "* **Miss:** ε = 0.2, A vs C: p = 0.2 (objective), 0.01 (grad_norm) — not significant at 0.05 on every "
        "metric (objective: 0.5 ± 0.01 vs 0.51 ± 0.01).", "* Against C: C is noisy."]


def test_the_tuning_is_named_as_code_only_where_it_is_a_command() -> None:
    """Finding: mnist-sota's report said the values were "chosen by `the paper's values for
    DP-SGD; …`": a sentence set as code."""
    assert EXPERIMENTS["dp-srm-ijcnn1"].TUNED_BY == "`dpopt reproduce dp-srm-ijcnn1 --retune` on 2026-11-21"
    assert EXPERIMENTS["mnist-sota"].TUNED_BY.startswith("the paper's values for DP-SGD; for the others an ")
