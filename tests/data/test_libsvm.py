"""Tests of the LIBSVM reader: exact values, compression, strict errors with line numbers."""

import bz2
import gzip
import io
import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt._validate import DpoptError
from dpopt.data import DataError
from dpopt.data.libsvm import read_libsvm

GOOD_LINES = "1 1:1\n\n-1 2:0.5 3:-2\n"  # the blank line counts: the next line is line 4


def reference(text: str, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Slow, obviously correct parse with Python's float."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    X = np.zeros((len(rows), n_features))
    for i, tokens in enumerate(rows):
        for token in tokens[1:]:
            index, value = token.split(":")
            X[i, int(index) - 1] = float(value)
    return X, np.array([float(tokens[0]) for tokens in rows])


def write(tmp_path: Path, text: str, name: str = "data.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ijcnn1_train_matches_reference_bit_for_bit(shared_data_dir):
    path = shared_data_dir / "ijcnn1" / "ijcnn1.trn.bz2"
    X, y = read_libsvm(path, 22)
    X_ref, y_ref = reference(bz2.open(path, "rt").read(), 22)
    assert X.shape == (49_990, 22) and X.dtype == np.float64
    assert np.array_equal(X, X_ref) and np.array_equal(y, y_ref)
    assert np.array_equal(np.signbit(X), np.signbit(X_ref))  # '-0.0' stays negative zero


def test_bundled_adult_test_file():
    path = Path(__file__).resolve().parents[2] / "src" / "dpopt" / "data" / "bundled" / "a9a.t.bz2"
    X, y = read_libsvm(path, 123)
    assert X.shape == (16_281, 123)
    assert set(np.unique(X)) == {0.0, 1.0}
    assert np.count_nonzero(X[:, 122]) == 0  # feature 123 never occurs in the test file
    assert (np.count_nonzero(y == -1), np.count_nonzero(y == 1)) == (12_435, 3_846)
    assert X.sum() == 225_731  # number of ':' in the file
    first_line = [1, 6, 17, 21, 35, 42, 54, 62, 71, 73, 74, 76, 80, 83]  # "-1 1:1 6:1 ... 83:1"
    assert (np.flatnonzero(X[0]) + 1).tolist() == first_line and y[0] == -1.0


def test_number_formats_fast_and_slow_paths(tmp_path):
    text = "+1 1:.5 2:5. 3:-0 4:1e-3 5:00012.50 6:-.25 7:+3 8:123456789012345678 9:1E2\n"
    X, y = read_libsvm(write(tmp_path, text), 9)
    expected = [0.5, 5.0, -0.0, 1e-3, 12.5, -0.25, 3.0, 123456789012345678.0, 100.0]
    assert X[0].tolist() == expected and y.tolist() == [1.0]
    assert np.signbit(X[0, 2])


decimal_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(-1e6, 1e6).map(lambda v: f"{v:.6f}"),
    st.floats(-1e3, 1e3).map(lambda v: f"{v:.12f}"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"{v:g}"),
    st.integers(-10**17, 10**17).map(str),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.integers(1, 8), decimal_text, max_size=8), max_size=6),
       st.lists(st.sampled_from(["-1", "+1", "1", "-1.0", "1.0"]), min_size=6, max_size=6))
def test_values_equal_python_float(rows, labels):
    lines = [" ".join([labels[i]] + [f"{k}:{row[k]}" for k in sorted(row)])
             for i, row in enumerate(rows)]
    text = "\n".join(lines) + "\n"
    X, y = read_libsvm(io.StringIO(text), 8)
    X_ref, y_ref = reference(text, 8)
    assert np.array_equal(X, X_ref) and np.array_equal(y, y_ref)
    assert np.array_equal(np.signbit(X), np.signbit(X_ref))


@pytest.mark.parametrize("suffix, opener", [(".bz2", bz2.open), (".gz", gzip.open),
                                            (".xz", lzma.open)])
def test_compressed_files_by_suffix(tmp_path, suffix, opener):
    path = tmp_path / f"data{suffix}"
    with opener(path, "wt") as stream:
        stream.write(GOOD_LINES)
    X, y = read_libsvm(path, 3)
    assert X.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.5, -2.0]] and y.tolist() == [1.0, -1.0]


def test_file_objects_crlf_and_trailing_blanks():
    X, y = read_libsvm(io.BytesIO(b"-1 2:3 \r\n1 1:1\t3:4\r\n"), 3)
    assert X.tolist() == [[0.0, 3.0, 0.0], [1.0, 0.0, 4.0]] and y.tolist() == [-1.0, 1.0]


def test_empty_file_gives_no_rows():
    X, y = read_libsvm(io.StringIO(""), 5)
    assert X.shape == (0, 5) and y.shape == (0,)


def test_labels_are_mapped_to_minus_one_plus_one():
    X, y = read_libsvm(io.StringIO("0 1:1\n1 1:2\n0 1:3\n"), 1)
    assert y.tolist() == [-1.0, 1.0, -1.0]
    _, raw = read_libsvm(io.StringIO("2.5 1:1\n7 1:2\n-3 1:3\n"), 1, binary=False)
    assert raw.tolist() == [2.5, 7.0, -3.0]


def test_more_than_two_labels_rejected_for_binary():
    with pytest.raises(DataError, match=r"labels \(-3, 2.5, 7\) must take two values"):
        read_libsvm(io.StringIO("2.5 1:1\n7 1:2\n-3 1:3\n"), 1)


@pytest.mark.parametrize("bad_line, message", [
    ("1 3:4:5", "malformed"),
    ("1 :4", "malformed"),
    ("1 3:", "malformed"),
    ("1 3 2:1", "malformed"),
    ("3:1", "malformed"),
    ("1 2:1 1:1", "strictly increasing"),
    ("1 2:1 2:1", "strictly increasing"),
    ("1 4:1", r"feature index 4 must be an integer in \[1, n_features=3\]"),
    ("1 0:1", "feature index 0 must be"),
    ("1 1.5:1", "feature index 1.5 must be"),
    ("1 qid:3 1:1", "'qid' must be a number"),
    ("1 1:x", "'x' must be a number"),
    ("one 1:1", "'one' must be a number"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = write(tmp_path, GOOD_LINES + bad_line + "\n" + "1 1:1\n")
    with pytest.raises(DataError, match=message) as error:
        read_libsvm(path, 3)
    assert f"file {path} line 4" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("bad_line", ["1 1:nan", "1 2:inf", "nan 1:1", "1 1:-Infinity"])
def test_nan_and_inf_rejected(tmp_path, bad_line):
    path = write(tmp_path, GOOD_LINES + bad_line + "\n")
    with pytest.raises(DataError, match="must be a finite number") as error:
        read_libsvm(path, 3)
    assert f"file {path} line 4" in str(error.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(DataError, match="missing.txt cannot be read"):
        read_libsvm(tmp_path / "missing.txt", 3)
    (tmp_path / "broken.bz2").write_bytes(b"not bzip2 at all")
    with pytest.raises(DataError, match="broken.bz2 cannot be read"):
        read_libsvm(tmp_path / "broken.bz2", 3)


def test_n_features_must_be_positive():
    with pytest.raises(DpoptError, match="n_features=0 must be >= 1"):
        read_libsvm(io.StringIO("1 1:1\n"), 0)
