"""Tests of the Pima Indians Diabetes data set (LIBSVM ``diabetes``): split, labels, checksum."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpopt.data import DataError, Dataset, fetch, info, load, names
from dpopt.data.parsers import pima

CSV = "pima_indians_diabetes.csv"
SHA256 = "fb921ad6e7a338044c272cede111fa19a433b9cc86e41a0347e83753869a19b5"


def labels(y: np.ndarray) -> tuple[int, int]:
    """(count of -1, count of +1)."""
    return int(np.count_nonzero(y == -1.0)), int(np.count_nonzero(y == 1.0))


@pytest.fixture(scope="module")
def diabetes(shared_data_dir) -> Dataset:
    return load("diabetes", shared_data_dir)


def test_split_sizes_and_raw_features(diabetes):
    assert diabetes.name == "diabetes" and diabetes.task == "binary"
    assert diabetes.X_train.shape == (500, 8) and diabetes.X_test.shape == (268, 8)
    assert diabetes.y_train.shape == (500,) and diabetes.y_test.shape == (268,)
    assert diabetes.X_train.dtype == diabetes.y_test.dtype == np.float64
    # First data line of the CSV: `6,148,72,35,0,33.6,0.627,50,1` (1 = tested positive).
    assert diabetes.X_train[0].tolist() == [6, 148, 72, 35, 0, 33.6, 0.627, 50]
    assert diabetes.y_train[0] == -1.0
    # Second line `1,85,66,29,0,26.6,0.351,31,0` (0 = tested negative).
    assert diabetes.X_train[1].tolist() == [1, 85, 66, 29, 0, 26.6, 0.351, 31]
    assert diabetes.y_train[1] == 1.0
    # Row 500 ends the training set, row 501 starts the test set; the last row is row 768.
    assert diabetes.X_train[-1].tolist() == [6, 154, 74, 32, 193, 29.3, 0.839, 39]
    assert diabetes.X_test[0].tolist() == [2, 117, 90, 19, 71, 25.2, 0.313, 21]
    assert diabetes.X_test[-1].tolist() == [1, 93, 70, 31, 0, 30.4, 0.315, 23]
    assert (diabetes.y_train[-1], diabetes.y_test[0], diabetes.y_test[-2], diabetes.y_test[-1]) == (
        1.0, 1.0, -1.0, 1.0)
    # Raw, not standardised: glucose up to 199, insulin up to 846, age from 21 to 81.
    X = np.vstack([diabetes.X_train, diabetes.X_test])
    assert X[:, 1].max() == 199 and X[:, 4].max() == 846 and (X[:, 7].min(), X[:, 7].max()) == (21, 81)


def test_labels_follow_libsvm_and_the_readme_counts(diabetes, shared_data_dir):
    train, test = labels(diabetes.y_train), labels(diabetes.y_test)
    assert train == (182, 318) and test == (86, 182)
    # README: 500 negative (label 0 -> +1) and 268 positive (label 1 -> -1) in all 768 rows.
    assert (train[0] + test[0], train[1] + test[1]) == (268, 500)
    # Same as the README's recipe, read independently: y_libsvm = 1 - 2*y, train = first 500 rows.
    raw = np.loadtxt(shared_data_dir / "diabetes" / CSV, delimiter=",", skiprows=1)
    assert np.array_equal(diabetes.X_train, raw[:500, :8]) and np.array_equal(diabetes.X_test, raw[500:, :8])
    assert np.array_equal(diabetes.y_train, 1 - 2 * raw[:500, 8])
    assert np.array_equal(diabetes.y_test, 1 - 2 * raw[500:, 8])
    # The training majority is +1 (318 of 500), so its test error is the share of -1 in the test set.
    assert diabetes.majority_error() == pytest.approx(86 / 268)


def test_info_and_names():
    assert "diabetes" in names()
    meta = info("diabetes")
    assert (meta["task"], meta["n_train"], meta["n_test"], meta["dim"]) == ("binary", 500, 268, 8)
    assert meta["bundled"] is False
    assert meta["files"] == [{"name": CSV, "size": 23_078, "sha256": SHA256, "content_sha256": None, "url": None}]
    assert "GPL-2" in meta["licence"] and "mlbench" in meta["source"]


def test_corrupt_copy_is_refused(tmp_path, shared_data_dir):
    folder = tmp_path / "diabetes"
    shutil.copytree(shared_data_dir / "diabetes", folder)
    (folder / CSV).chmod(0o644)
    data = bytearray((folder / CSV).read_bytes())
    data[1000] ^= 0x01  # one digit becomes another: still a well-formed CSV
    (folder / CSV).write_bytes(bytes(data))
    with pytest.raises(DataError) as error:
        load("diabetes", tmp_path)
    message = str(error.value)
    assert f"data file {folder / CSV} is corrupt: sha256 " in message
    assert f"!= expected {SHA256}" in message
    assert "\n" not in message


def test_missing_file_and_fetch_without_url(tmp_path):
    with pytest.raises(DataError, match=r"diabetes/pima_indians_diabetes\.csv is missing: run "
                                        r"`dpopt data fetch diabetes`"):
        load("diabetes", tmp_path)
    with pytest.raises(DataError, match=r"^data file pima_indians_diabetes\.csv has no download URL: copy it by "
                                        r"hand to .*/diabetes/pima_indians_diabetes\.csv \(23,078 bytes, sha256 "
                                        + SHA256 + r"\); the folder is <data dir>/diabetes, the data dir --data-dir"):
        fetch("diabetes", tmp_path)


def test_fetch_from_a_base_url(server, tmp_path, shared_data_dir, diabetes):
    shutil.copyfile(shared_data_dir / "diabetes" / CSV, server.root / CSV)
    paths = fetch("diabetes", tmp_path, base_url=server.url)
    assert paths == [tmp_path.resolve() / "diabetes" / CSV] and server.requests == [f"/{CSV}"]
    fetched = load("diabetes", tmp_path)
    assert np.array_equal(fetched.X_train, diabetes.X_train)
    assert np.array_equal(fetched.y_test, diabetes.y_test)


@pytest.mark.parametrize(("text", "expected"), [
    ("a,b\n1,2\n", r"must start with the header line 'pregnant,glucose,.*', not 'a,b'"),
    ("pregnant,glucose,pressure,triceps,insulin,mass,pedigree,age,diabetes\n"
     + "1,2,3,4,5,6,7,8,0\n" * 600 + "1,2,3,4,5,6,7,8,2\n", r"must have labels 0 \(neg\) and 1 \(pos\)"),
    ("pregnant,glucose,pressure,triceps,insulin,mass,pedigree,age,diabetes\n"
     + "1,2,3,4,5,6,7,8,0\n" * 10, r"must hold more than 500 rows of 8 features \+ label, not shape \(10, 9\)"),
])
def test_parser_names_the_file_of_a_malformed_csv(tmp_path: Path, text: str, expected: str):
    path = tmp_path / CSV
    path.write_text(text)
    with pytest.raises(DataError, match=f"^file {re.escape(str(path))} {expected}"):
        pima([path])
