"""A file of one's own read against a public schema (``dpopt.data.own``): the schema alone fixes the
shape, rows outside it are refused with their line, and the split does not move a row when
another is added."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpopt.data import DataError
from dpopt.data.own import HELD_OUT, SPLIT_SEED, Schema, held_out, read

HEADER = "a,b,label\n"


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


def _rows(n: int, classes: int = 3, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{a:.4f},{b:.4f},{label}" for a, b, label in zip(rng.uniform(0, 1, n), rng.uniform(0, 1, n),
                                                               rng.integers(0, classes, n))]


def _multiset(X: np.ndarray, y: np.ndarray) -> list[tuple[float, ...]]:
    return sorted(map(tuple, np.column_stack([X, y]).tolist()))


def test_one_added_row_moves_no_other_row_between_train_and_test(tmp_path):
    """Finding: the 80/20 split permuted all n rows, so one added row reshuffled it. Now the
    training rows of the file with the row added are those of the file without it, plus at most
    that row (and the held-out rows likewise)."""
    schema = Schema("multiclass", target="label", classes=3)
    rows = _rows(200)
    before = read(_csv(tmp_path / "before.csv", rows), schema).dataset
    for added in ("0.5000,0.2500,1", "0.1234,0.9876,2"):
        after = read(_csv(tmp_path / "after.csv", rows[:77] + [added] + rows[77:]), schema).dataset
        train = _multiset(after.X_train, after.y_train)
        test = _multiset(after.X_test, after.y_test)
        assert len(train) + len(test) == 201
        assert set(_multiset(before.X_train, before.y_train)) <= set(train)
        assert set(_multiset(before.X_test, before.y_test)) <= set(test)


def test_the_split_is_a_public_function_of_each_row_alone():
    """held_out(row) is the same whether the row is alone or among others, depends on the seed, and
    holds out about HELD_OUT of the rows (2,000 rows: 400 expected, sd 17.9; ±5 sd)."""
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(2000, 4)), rng.integers(0, 2, 2000).astype(float)
    held = held_out(X, y, HELD_OUT, SPLIT_SEED)
    alone = np.array([held_out(X[i:i + 1], y[i:i + 1], HELD_OUT, SPLIT_SEED)[0] for i in range(50)])
    assert (alone == held[:50]).all()
    assert abs(int(held.sum()) - 400) <= 5 * 17.9
    assert (held != held_out(X, y, HELD_OUT, SPLIT_SEED + 1)).any()
    assert (held_out(-0.0 * X[:5], y[:5], HELD_OUT, 0) == held_out(0.0 * X[:5], y[:5], HELD_OUT, 0)).all()


@pytest.mark.parametrize(("rows", "schema", "message"), [
    (["0.1,0.2,1", "", "0.3,0.4,7"], Schema("multiclass", "label", classes=3),
     "line 4: label 7 must be an integer class in [0, 2] (classes=3)"),
    (["0.1,0.2,1", "0.3,0.4,1.5"], Schema("multiclass", "label", classes=3),
     "line 3: label 1.5 must be an integer class in [0, 2] (classes=3)"),
    (["0.1,0.2,1", "0.3,0.4,2"], Schema("binary", "label"),
     "line 3: label 2 must be 1 (positive), 0 or -1 (negative) for task='binary'"),
    (["0.1,0.2,1", "0.3,0.4"], Schema("binary", "label"), "line 3 has 2 columns; the header has 3"),
    (["0.1,0.2,1", "0.3,x,1"], Schema("binary", "label"), "line 3, column 'b': 'x' is not a number"),
    (["0.1,0.2,1", "0.3,nan,1"], Schema("binary", "label"), "line 3: a value is not a finite number"),
    (["0.1,0.2,1"], Schema("binary", "label", features=("a", "c")),
     "line 1: the feature columns a, b must be the schema's features=['a', 'c']"),
])
def test_a_row_outside_the_schema_is_refused_with_its_line(tmp_path, rows, schema, message):
    with pytest.raises(DataError) as error:
        read(_csv(tmp_path / "mine.csv", rows), schema)
    assert str(error.value) == f"file {tmp_path / 'mine.csv'} {message}"


def test_libsvm_needs_its_number_of_features_and_refuses_a_larger_index(tmp_path):
    """Finding: LIBSVM input took d from the largest feature index in the file."""
    path = tmp_path / "mine.libsvm"
    path.write_text("1 1:0.5 3:0.25\n0 2:1\n\n1 5:0.5\n")
    with pytest.raises(DataError, match="give its number of features .--features D"):
        read(path, Schema("binary"))
    with pytest.raises(DataError, match=r"line 4: feature index 5 must be an integer in \[1, n_features=3\]"):
        read(path, Schema("binary", features=3))
    path.write_text("1 1:0.5 3:0.25\n0 2:1\n\n7 1:0.5\n")
    with pytest.raises(DataError, match="line 4: label 7 must be 1"):
        read(path, Schema("binary", features=3))


def test_npz_rows_are_named_by_their_index(tmp_path):
    np.savez(tmp_path / "mine.npz", X=np.zeros((4, 2)), y=np.array([0.0, 1.0, 3.0, 1.0]))
    with pytest.raises(DataError, match=r"mine\.npz row 3: label 3 must be an integer class in \[0, 2\]"):
        read(tmp_path / "mine.npz", Schema("multiclass", classes=3))
    with pytest.raises(DataError, match="X has 2 columns; the schema says features=3"):
        read(tmp_path / "mine.npz", Schema("multiclass", classes=3, features=3))


def test_a_separate_test_file_leaves_every_row_for_training(tmp_path):
    rows = _rows(50)
    described = read(_csv(tmp_path / "mine.csv", rows), Schema("multiclass", "label", classes=3),
                     test=_csv(tmp_path / "test.csv", _rows(20, seed=1)))
    assert described.dataset.n == 50 and len(described.dataset.y_test) == 20 and not described.test_unprotected
    assert described.protected == "all 50 rows of mine.csv"
    (tmp_path / "other.csv").write_text("a,c,label\n0.1,0.2,1\n")
    with pytest.raises(DataError, match="line 1: the feature columns a, c must be the schema's features=.'a', 'b'."):
        read(tmp_path / "mine.csv", Schema("multiclass", "label", classes=3), test=tmp_path / "other.csv")


def test_held_out_rows_of_ones_own_file_are_labelled_not_private(tmp_path):
    described = read(_csv(tmp_path / "mine.csv", _rows(100)), Schema("multiclass", "label", classes=3))
    held = len(described.dataset.y_test)
    assert described.test_unprotected and described.test_data.startswith(f"NOT PRIVATE: the {held} rows of mine.csv")
    assert described.protected.startswith(f"the {100 - held} rows of mine.csv that the public split keeps")


@pytest.mark.parametrize(("content", "given", "message"), [
    ({"task": "multiclass", "target": "label"}, {}, "task='multiclass' needs its number of classes K (--classes K"),
    ({"task": "binary", "classes": 2}, {}, "classes=2 is for task='multiclass'"),
    ({"task": "binary", "colour": "red"}, {}, "must be a JSON object with keys among task, target, features, classes"),
    ({"task": "multiclass", "classes": "3"}, {}, "classes='3' has the wrong type"),
    ({"task": "multiclass", "classes": 3}, {"classes": 4}, "classes=4 differs from classes=3 in schema="),
    ({"target": "label"}, {}, "--data needs --task: one of binary, regression, multiclass"),
])
def test_schema_file_errors(tmp_path, content, given, message):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(content))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Schema.of(path, **given)


def test_schema_file_and_flags_complete_each_other(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"task": "multiclass", "classes": 10, "features": ["a", "b"]}))
    assert Schema.of(path, target="label", task=None) == Schema("multiclass", "label", ("a", "b"), 10)
