"""``dpopt run`` on the user's own file (``--data``) and on registered data prepared from public
bounds, for every model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpopt.cli import main

RUN = ["run", "--algorithm", "dp-sgd", "--epsilon", "1", "--steps", "5", "--batch-size", "20", "--seed", "0", "--json"]


def _rows(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, size=(n, 3))
    return X, X @ np.array([3.0, -2.0, 1.0]) + 50


def _run(capsys: pytest.CaptureFixture[str], out: Path, *argv: str) -> tuple[int, dict | str]:
    code = main([*RUN, "--out", str(out), *argv])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else captured.err)


def test_a_csv_file_with_its_target_named_and_public_bounds(tmp_path, capsys):
    X, y = _rows()
    path = tmp_path / "mine.csv"
    np.savetxt(path, np.column_stack([X[:, 0], y, X[:, 1:]]), delimiter=",", header="a,price,b,c", comments="")
    code, result = _run(capsys, tmp_path / "out", "--data", str(path), "--task", "regression", "--target", "price",
                        "--model", "ridge", "--feature-bounds", "0:10", "--target-bounds", "0:100")
    assert code == 0 and result["dataset"] == "mine.csv" and result["final"]["epsilon"] <= 1
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert history["data_source"].endswith("prepared from public bounds (given by the user)")
    assert 0 < history["final"]["test_error"] < 1  # targets in [−1, 1]: the raw ones are ~50


def test_an_npz_file_with_binary_labels_0_1_and_a_libsvm_file(tmp_path, capsys):
    X, y = _rows()
    labels = (y > 55).astype(float)
    np.savez(tmp_path / "mine.npz", X=X, label=labels)
    code, result = _run(capsys, tmp_path / "npz", "--data", str(tmp_path / "mine.npz"), "--task", "binary",
                        "--target", "label", "--feature-bounds", "0:10", "--row-norm", "1")
    assert code == 0 and result["dataset"] == "mine.npz"
    lines = [f"{int(label)} " + " ".join(f"{j + 1}:{value:.3f}" for j, value in enumerate(row))
             for row, label in zip(X, labels)]
    (tmp_path / "mine.libsvm").write_text("\n".join(lines) + "\n")
    code, result = _run(capsys, tmp_path / "svm", "--data", str(tmp_path / "mine.libsvm"), "--task", "binary",
                        "--feature-bounds", "0:10")
    assert code == 0 and result["dataset"] == "mine.libsvm"


def test_feature_bounds_by_csv_column_name(tmp_path, capsys):
    X, y = _rows()
    path = tmp_path / "mine.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,price", comments="")
    bounds = tmp_path / "bounds.json"
    bounds.write_text(json.dumps({"c": [0, 10], "a": [0, 10], "b": [-5, 15]}))
    code, result = _run(capsys, tmp_path / "out", "--data", str(path), "--task", "regression", "--target", "price",
                        "--model", "ridge", "--feature-bounds", str(bounds), "--target-bounds", "0:100")
    assert code == 0, result


@pytest.mark.parametrize(("argv", "message"), [
    ([], "dpopt: error: --data needs --task: one of binary, regression, multiclass\n"),
    (["--task", "regression", "--target", "price", "--model", "ridge"],
     "dpopt: error: data set 'mine.csv' declares no public bounds of its features: give --feature-bounds"),
    (["--task", "regression", "--target", "cost", "--model", "ridge", "--feature-bounds", "0:10"],
     "dpopt: error: target='cost' must be a column of the header line of"),
    (["--task", "regression", "--target", "price", "--model", "ridge", "--feature-bounds", "0:10"],
     "dpopt: error: target_bounds must be given for the regression data set 'mine.csv'"),
    (["--task", "regression", "--target", "price", "--model", "ridge", "--feature-bounds", "10"],
     "dpopt: error: feature_bounds='10' must be LOW:HIGH"),
    (["--dataset", "adult"], "dpopt: error: give --dataset (a registered data set) or --data (a file), not both\n"),
])
def test_own_data_errors_are_one_line_naming_the_argument(tmp_path, capsys, argv, message):
    X, y = _rows(20)
    path = tmp_path / "mine.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,price", comments="")
    code = main([*RUN, "--out", str(tmp_path / "out"), "--data", str(path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message.removesuffix("\n")) and err.count("\n") == 1


def test_registered_sets_without_declared_bounds_need_them_and_task_is_for_own_data(tmp_path, capsys):
    code = main([*RUN, "--out", str(tmp_path), "--dataset", "gas_turbine", "--model", "ridge"])
    assert code == 2 and "data set 'gas_turbine' declares no public bounds" in capsys.readouterr().err
    code = main([*RUN, "--out", str(tmp_path), "--dataset", "adult", "--task", "binary"])
    assert code == 2 and capsys.readouterr().err == ("dpopt: error: --task is for --data (a file of your own); "
                                                     "a registered data set has its own\n")


def test_the_findings_california_ridge_objective_is_of_order_one(tmp_path, capsys, shared_data_dir):
    """Finding: `dpopt run --dataset california_housing --model ridge` gave an objective of 2.65e10
    (raw features and dollar targets). Prepared from its public bounds, the training objective
    (a NOT PRIVATE diagnostic) starts below 1 and decreases."""
    code, result = _run(capsys, tmp_path, "--dataset", "california_housing", "--model", "ridge",
                        "--data-dir", str(shared_data_dir), "--diagnostics", "--steps", "40", "--batch-size", "256")
    assert code == 0, result
    objectives = [r["objective"] for r in
                  json.loads((tmp_path / "history.json").read_text())["diagnostics"]["records"]]
    assert objectives[0] < 1 and objectives[-1] < objectives[0]
