"""dpopt bench: problems as data, every method tuned privately at the same total ε, the winner."""

from __future__ import annotations

import json

import pytest

from dpopt._validate import DpoptError
from dpopt.bench import problems
from dpopt.bench.tables import markdown
from dpopt.cli import main
from dpopt.tuning import TruncatedNegativeBinomial

TINY = """
[tiny]
dataset = "adult"
model = "logistic"
reg = 1e-3
delta = 1e-5
validation_fraction = 0.2
epsilons = [0.5, 2.0]
seeds = 2
trials = { mean = 1.5, shape = 1.0 }

[tiny.methods.dp-sgd]
steps = 6
fixed = { batch_size = 256 }
grid = { lr = [0.1, 1.0] }

[tiny.methods.dp-gd]
steps = 3
grid = { lr = [0.1, 1.0] }
"""


def test_the_bundled_problems_and_their_quick_settings():
    full, quick = problems()["adult-logistic"], problems("quick")["adult-logistic"]
    assert [m.algorithm for m in full.methods] == ["dp-sgd", "dp-srm", "aclip", "dp-gd"]
    assert full.epsilons == (0.5, 1.0, 3.0, 8.0) and full.seeds >= 5 and quick.epsilons == (1.0,)
    assert full.trials == TruncatedNegativeBinomial(4.0, 1.0)
    assert [m.steps for m in quick.methods] == [round(0.25 * m.steps) for m in full.methods]
    # ./dev run's compact comparison: the four methods at ε = 1, the full steps, 2 seeds, K ≥ 1 always
    main = problems("main")["adult-logistic"]
    assert main.methods == full.methods and main.epsilons == (1.0,) and main.seeds == 2
    assert main.trials == TruncatedNegativeBinomial(3.0, 3.0) and main.trials.pmf(0) == 0.0
    with pytest.raises(DpoptError, match="variant='nightly': problem 'adult-logistic' declares no such block"):
        problems("nightly")


def test_bench_json_gives_each_cell_its_methods_errors_epsilons_and_winner(capsys, tmp_path):
    file = tmp_path / "problems.toml"
    file.write_text(TINY)
    assert main(["bench", "--file", str(file), "--json", "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out)
    (problem,) = result["problems"]
    assert [cell["epsilon"] for cell in problem["cells"]] == [0.5, 2.0]
    for cell in problem["cells"]:
        means = {name: entry["test_error"]["mean"] for name, entry in cell["methods"].items()}
        assert set(means) == {"dp-sgd", "dp-gd"} and cell["winner"] == min(means, key=means.get)
        assert all(0.99 * cell["epsilon"] <= entry["epsilon_tuning_and_training"] <= cell["epsilon"]
                   for entry in cell["methods"].values())
        assert all(entry["test_error"]["std"] >= 0 for entry in cell["methods"].values())
        assert 0 <= cell["p_value"] <= 1 and cell["significant"] == (cell["p_value"] < 0.05)
    assert result["diagnostics"]["label"].startswith("NOT PRIVATE")
    assert len(result["diagnostics"]["runs"]) == 4 and all(len(r["trials_run"]) == 2 for r in result["diagnostics"]["runs"])
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {"bench.json", "bench.md", "tiny.png", "summary.png"}
    text = (tmp_path / "out" / "bench.md").read_text()
    assert "| dp-sgd |" in text and "| wall time (NOT PRIVATE) | ε = 0.5 | ε = 2 |" in text


@pytest.mark.parametrize("argv,message", [
    (["--problem", "nope"], "problem='nope' must be one of: adult-logistic"),
    (["--file", "/nonexistent.toml"], "file='/nonexistent.toml' is not a readable problems file"),
    (["--epsilon", "-1"], "epsilon=-1.0 must be > 0"),
])
def test_bench_refuses_bad_input_with_exit_2(capsys, argv, message, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_the_tables_name_the_metric_and_give_each_methods_cost_the_wall_time_labelled_not_private():
    """From bench.json alone: a problem's own metric, the planned expected passes (public) when the
    result has them, and the wall time per seed with the trials run, labelled NOT PRIVATE."""
    def entry(mean: float, passes: float) -> dict:
        return {"test_mse": {"mean": mean, "std": 0.1}, "epsilon_tuning_and_training": 0.99, "expected_passes": passes}

    cell = {"epsilon": 1.0, "winner": "a", "p_value": 0.01, "significant": True,
            "methods": {"a": entry(2.5, 12.0), "b": entry(3.0, 40.0)}}
    result = {"problems": [{"problem": "p", "dataset": "housing", "model": "ridge", "delta": 1e-5, "seeds": 2,
                            "trials": "T", "steps": {}, "grids": {}, "metric": "test_mse", "cells": [cell]}],
              "diagnostics": {"wall_time_s": 9.0, "runs": [{"problem": "p", "epsilon": 1.0, "algorithm": "a",
                                                             "wall_time_s": 6.0, "trials_run": [1, 3]}]}}
    text = markdown(result, "cmd")
    assert "test_mse of the privately selected θ" in text and "| a | **2.5000 (0.1000)** |" in text
    cell["methods"]["b"]["test_mse"] = {"mean": 7.9e26, "std": 1.8e27}  # a diverged method: not 27 digits
    assert "| b | 7.9e+26 (1.8e+27) |" in markdown(result, "cmd")
    assert "| expected passes (planned) | ε = 1 |\n|---|---|\n| a | 12 |\n| b | 40 |" in text
    assert "| wall time (NOT PRIVATE) | ε = 1 |\n|---|---|\n| a | 3.0 s (4 trials) |\n| b | – |" in text
    for method in cell["methods"].values():  # a result without planned passes: no table of them
        del method["expected_passes"]
    assert "expected passes" not in markdown(result, "cmd")
