"""``dpopt run`` on the user's own file (``--data``) and on registered data prepared from public
bounds, for every model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpopt import outputs
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
                        "--features", "3", "--feature-bounds", "0:10")
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


def _classes_csv(path: Path, n: int = 200, extra: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    lines = [f"{a:.4f},{b:.4f},{label}" for a, b, label in zip(rng.uniform(0, 10, n), rng.uniform(0, 10, n),
                                                                 rng.integers(0, 3, n))]
    path.write_text("a,b,label\n" + "\n".join(lines + ([extra] if extra else [])) + "\n")
    return path


MLP = ["--task", "multiclass", "--target", "label", "--classes", "3", "--model", "mlp", "--feature-bounds", "0:10"]


def test_one_added_row_never_changes_the_models_size(tmp_path, capsys):
    """Finding: with --model mlp --task multiclass the number of classes was the largest label + 1, so
    one added row labelled 7 grew θ from 83 to 138 entries (ε = ∞ for that row). Now K is public
    (--classes): a row inside the schema leaves len(θ) at 2·10 + 10 + 10·3 + 3 = 63, a row outside
    it is refused with its line number and nothing is trained or written."""
    sizes = []
    for name, extra in (("base", None), ("added", "5.0,5.0,1")):
        code, result = _run(capsys, tmp_path / name, "--data", str(_classes_csv(tmp_path / f"{name}.csv", extra=extra)),
                            *MLP)
        assert code == 0, result
        sizes.append(len(json.loads((tmp_path / name / "history.json").read_text())["theta"]))
    assert sizes == [63, 63]
    path = _classes_csv(tmp_path / "seven.csv", extra="5.0,5.0,7")
    code, err = _run(capsys, tmp_path / "seven", "--data", str(path), *MLP)
    assert code == 2 and err == (f"dpopt: error: file {path} line 202: label 7 must be an integer class in [0, 2] "
                                 "(classes=3)\n")
    assert not (tmp_path / "seven" / "history.json").exists()


def test_one_added_libsvm_row_never_changes_the_models_size(tmp_path, capsys):
    """Finding: LIBSVM input took d from its largest feature index. Now d is --features: an added row
    within it leaves len(θ) at d = 3; an index beyond it is refused with its line number."""
    X, y = _rows()
    lines = [f"{int(label > 55)} " + " ".join(f"{j + 1}:{value:.3f}" for j, value in enumerate(row))
             for row, label in zip(X, y)]
    sizes = []
    for name, extra in (("base", []), ("added", ["1 1:5 3:5"]), ("beyond", ["1 1:5 5:5"])):
        path = tmp_path / f"{name}.libsvm"
        path.write_text("\n".join(lines + extra) + "\n")
        code, result = _run(capsys, tmp_path / name, "--data", str(path), "--task", "binary", "--features", "3",
                            "--feature-bounds", "0:10")
        if name == "beyond":
            assert code == 2 and result == (f"dpopt: error: file {path} line 201: feature index 5 must be an integer "
                                            "in [1, n_features=3]\n")
        else:
            assert code == 0, result
            sizes.append(len(json.loads((tmp_path / name / "history.json").read_text())["theta"]))
    assert sizes == [3, 3]


def test_held_out_rows_of_ones_own_file_are_labelled_not_private_unless_a_test_file_is_given(tmp_path, capsys):
    """Finding: test_error on the 20 % of the user's own file was written without a label. Now
    history.json, the printed result and summary.md say which rows are protected and that the
    test error on held-out rows of the file is NOT PRIVATE; with --test-data every row trains and
    the test error is measured on that file."""
    path = _classes_csv(tmp_path / "mine.csv")
    code, result = _run(capsys, tmp_path / "held", "--data", str(path), *MLP)
    assert code == 0, result
    assert result["test_data"].startswith("NOT PRIVATE: the ") and "held out by the split" in result["test_data"]
    assert result["protected_records"].startswith("the ") and "that the public split keeps for training" in \
        result["protected_records"]
    assert "Test error: NOT PRIVATE: the " in (tmp_path / "held" / "summary.md").read_text()
    assert outputs.unclassified(json.loads((tmp_path / "held" / "history.json").read_text())) == []
    code, result = _run(capsys, tmp_path / "tested", "--data", str(path), *MLP, "--test-data",
                        str(_classes_csv(tmp_path / "test.csv", n=40)))
    assert code == 0, result
    assert result["protected_records"] == "all 200 rows of mine.csv"
    assert result["test_data"] == "test.csv, a separate test file of 40 rows"


def test_a_schema_file_gives_task_target_and_classes(tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"task": "multiclass", "target": "label", "classes": 4, "features": ["a", "b"]}))
    code, result = _run(capsys, tmp_path / "out", "--data", str(_classes_csv(tmp_path / "mine.csv")), "--schema",
                        str(schema), "--model", "mlp", "--feature-bounds", "0:10")
    assert code == 0, result
    assert len(json.loads((tmp_path / "out" / "history.json").read_text())["theta"]) == 2 * 10 + 10 + 10 * 4 + 4
    code, err = _run(capsys, tmp_path / "out2", "--data", str(tmp_path / "mine.csv"), "--schema", str(schema),
                     "--classes", "3", "--model", "mlp", "--feature-bounds", "0:10")
    assert code == 2 and err == f"dpopt: error: classes=3 differs from classes=4 in schema={str(schema)!r}\n"


def test_negative_bounds_are_values_not_options_and_mlp_takes_a_binary_target(tmp_path, capsys):
    """Findings: `--feature-bounds -5:5` was read as an option (only `--feature-bounds=-5:5` worked),
    and `--model mlp` refused a binary target. The binary network has one logit (logistic loss):
    2·10 + 10 + 10 + 1 = 41 parameters."""
    X, y = _rows()
    path = tmp_path / "mine.csv"
    np.savetxt(path, np.column_stack([X[:, :2] - 5, (y > 55).astype(int)]), delimiter=",", header="a,b,label",
               comments="")
    code, result = _run(capsys, tmp_path / "mlp", "--data", str(path), "--task", "binary", "--target", "label",
                        "--model", "mlp", "--feature-bounds", "-5:5")
    assert code == 0, result
    assert len(json.loads((tmp_path / "mlp" / "history.json").read_text())["theta"]) == 41
    assert 0 <= result["final"]["test_error"] <= 1
    np.savetxt(path, np.column_stack([X - 5, y]), delimiter=",", header="a,b,c,price", comments="")
    code, result = _run(capsys, tmp_path / "ridge", "--data", str(path), "--task", "regression", "--target", "price",
                        "--model", "ridge", "--feature-bounds", "-5:5", "--target-bounds", "-1:1")
    assert code == 0, result


def test_tune_reads_ones_own_csv_with_a_public_schema(tmp_path, capsys):
    """Finding: `tune` had no --data ("ambiguous option"). It now reads a file as `run` does."""
    X, y = _rows()
    path = tmp_path / "mine.csv"
    np.savetxt(path, np.column_stack([X, (y > 55).astype(int)]), delimiter=",", header="a,b,c,label", comments="")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"task": "binary", "target": "label"}))
    code = main(["tune", "--algorithm", "dp-sgd", "--data", str(path), "--schema", str(schema), "--feature-bounds",
                 "0:10", "--grid", "lr=0.1,0.5", "--epsilon", "1", "--steps", "5", "--batch-size", "20",
                 "--trials-mean", "2", "--seed", "0", "--out", str(tmp_path / "tuned"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    tuned = json.loads((tmp_path / "tuned" / "tuned.json").read_text())
    assert tuned["dataset"] == "mine.csv" and tuned["final"]["epsilon"] <= 1
    assert tuned["test_data"].startswith("NOT PRIVATE: the ")
    assert tuned["protected_records"].endswith("less the validation rows held out of them: "
                                               f"{tuned['protected_records'].rsplit(': ', 1)[1]}")
    code = main(["tune", "--algorithm", "dp-sgd", "--dataset", "adult", "--task", "binary", "--grid", "lr=0.1",
                 "--epsilon", "1"])
    assert code == 2 and capsys.readouterr().err == ("dpopt: error: --task is for --data (a file of your own); a "
                                                     "registered data set has its own\n")


def test_delta_of_at_least_one_over_n_is_refused_unless_allowed(tmp_path, capsys):
    """Finding: `--delta 0.01` with n ≈ 36,000 ran and reported ε. δ ≥ 1/n is refused, saying why and
    how to accept it knowingly; --allow-large-delta runs it."""
    path = _classes_csv(tmp_path / "mine.csv")
    code, err = _run(capsys, tmp_path / "refused", "--data", str(path), *MLP, "--delta", "0.01")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("dpopt: error: delta=0.01 must be < 1/n = ")
    assert "publishing each record whole with probability δ" in err and "(--allow-large-delta)" in err
    code, result = _run(capsys, tmp_path / "allowed", "--data", str(path), *MLP, "--delta", "0.01",
                        "--allow-large-delta")
    assert code == 0 and result["delta"] == 0.01
    assert main(["tune", "--algorithm", "dp-sgd", "--data", str(path), "--task", "regression", "--target", "label",
                 "--model", "ridge", "--feature-bounds", "0:10", "--target-bounds", "0:2", "--grid", "lr=0.1",
                 "--epsilon", "1", "--steps", "2", "--batch-size", "20", "--delta", "0.01",
                 "--out", str(tmp_path / "tuned")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpopt: error: delta=0.01 must be < 1/n = ") and "(--allow-large-delta)" in err


def test_delta_on_adult_exits_2_with_one_line(tmp_path, capsys, shared_data_dir):
    """The acceptance: `dpopt run --dataset adult --delta 0.01 ...` exits 2 with one line."""
    code, err = _run(capsys, tmp_path, "--dataset", "adult", "--data-dir", str(shared_data_dir), "--delta", "0.01")
    assert code == 2 and err == ("dpopt: error: delta=0.01 must be < 1/n = 3.07e-05 for n=32561 records: with δ ≥ "
                                 "1/n, publishing each record whole with probability δ (about nδ = 326 records) meets "
                                 "the guarantee; give a smaller delta, or allow_large_delta=True "
                                 "(--allow-large-delta) to accept this knowingly\n")


def test_an_implausible_epsilon_and_an_accountant_switch_are_announced(tmp_path, capsys):
    """Finding: `--epsilon 1e6` ran and switched the accountant from PLD to RDP without a word. Both
    are now one stderr line each, the run goes ahead, and the switch is in the outputs."""
    code, result = _run(capsys, tmp_path, "--data", str(_classes_csv(tmp_path / "mine.csv")), *MLP,
                        "--epsilon", "1e6")
    assert code == 0 and result["accountant"] == "rdp"
    assert result["accountant_note"].startswith("accountant='pld' was asked for and 'rdp' is used: its privacy loss "
                                                "distribution would exceed the grid's memory")
    assert json.loads((tmp_path / "history.json").read_text())["accountant_note"] == result["accountant_note"]
    code = main([*RUN, "--out", str(tmp_path / "again"), "--data", str(tmp_path / "mine.csv"), *MLP,
                 "--epsilon", "1e6"])
    err = capsys.readouterr().err
    assert code == 0 and err.splitlines() == [
        "dpopt: warning: epsilon=1e+06 is above 100: e^ε bounds how much more likely an output may become with one "
        "record added, and this bound says nothing useful; the run goes ahead",
        f"dpopt: warning: {result['accountant_note']}"]


def test_fetching_a_data_set_without_url_says_where_to_copy_it(tmp_path, capsys):
    """Finding: `dpopt data fetch diabetes` said "pass base_url", a flag the CLI does not have."""
    code = main(["data", "fetch", "diabetes", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "base_url" not in err.split("(in Python")[0]
    assert err.startswith(f"dpopt: error: data file pima_indians_diabetes.csv has no download URL: copy it by hand "
                          f"to {tmp_path.resolve() / 'diabetes' / 'pima_indians_diabetes.csv'} (23,078 bytes, sha256 "
                          "fb921ad6e7a338044c272cede111fa19a433b9cc86e41a0347e83753869a19b5)")
    assert "--data-dir" in err
