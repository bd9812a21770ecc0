"""Tests of the data set registry: real counts, bundling, checksums, errors and fetching."""

import shutil
from pathlib import Path

import numpy as np
import platformdirs
import pytest

from dpopt._validate import DpoptError
from dpopt.data import DataError, Dataset, default_data_dir, fetch, info, load, names

IJCNN1_FILES = ("ijcnn1.trn.bz2", "ijcnn1.tst.bz2")


def labels(y: np.ndarray) -> tuple[int, int]:
    """(count of -1, count of +1)."""
    return int(np.count_nonzero(y == -1.0)), int(np.count_nonzero(y == 1.0))


def copy_ijcnn1(source: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for name in IJCNN1_FILES:
        shutil.copyfile(source / "ijcnn1" / name, target / name)
    return target


def flip_byte(path: Path, offset: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def ijcnn1(shared_data_dir) -> Dataset:
    return load("ijcnn1", shared_data_dir)


def test_ijcnn1_real_numbers(ijcnn1):
    assert ijcnn1.task == "binary" and (ijcnn1.n, ijcnn1.dim) == (49_990, 22)
    assert ijcnn1.X_train.shape == (49_990, 22) and ijcnn1.X_test.shape == (91_701, 22)
    assert ijcnn1.X_train.dtype == ijcnn1.y_test.dtype == np.float64
    assert labels(ijcnn1.y_train) == (45_137, 4_853)
    assert labels(ijcnn1.y_test) == (82_989, 8_712)
    assert ijcnn1.X_train.min() >= -1.0 and ijcnn1.X_train.max() == 1.0
    # The test split was scaled with the training ranges, so it slightly leaves [-1, 1].
    assert -1.33 < ijcnn1.X_test.min() < -1.0 and 1.0 < ijcnn1.X_test.max() < 1.32
    assert ijcnn1.X_train[0, 5] == 1.0 and ijcnn1.X_train[0, 10] == -0.731854  # line 1
    assert ijcnn1.majority_error() == pytest.approx(8_712 / 91_701)
    assert "tick-datasets@9d959b6" in ijcnn1.source and "ijcnn1.tst.bz2" in ijcnn1.source


def test_adult_is_bundled_and_loads_from_an_empty_data_dir(tmp_path):
    adult = load("adult", tmp_path)
    assert adult.X_train.shape == (32_561, 123) and adult.X_test.shape == (16_281, 123)
    assert labels(adult.y_train) == (24_720, 7_841)
    assert labels(adult.y_test) == (12_435, 3_846)
    assert set(np.unique(adult.X_train)) == {0.0, 1.0}
    assert adult.majority_error() == pytest.approx(3_846 / 16_281)
    assert "bundled" in adult.source
    assert list(tmp_path.iterdir()) == []  # loading never writes


def test_adult_files_in_the_data_dir_are_used_first(tmp_path):
    bundled = Path(fetch("adult")[0]).parent
    folder = tmp_path / "adult"
    folder.mkdir()
    for name in ("a9a.bz2", "a9a.t.bz2"):
        shutil.copyfile(bundled / name, folder / name)
    assert str(folder / "a9a.bz2") in load("adult", tmp_path).source
    flip_byte(folder / "a9a.t.bz2")
    with pytest.raises(DataError, match="a9a.t.bz2 is corrupt: .*; delete it to use the bundled"):
        load("adult", tmp_path)


def test_load_returns_independent_copies(tmp_path):
    first = load("adult", tmp_path)
    first.X_train[:] = 7.0
    assert set(np.unique(load("adult", tmp_path).X_train)) == {0.0, 1.0}


def test_info_names_and_default_dir(monkeypatch, tmp_path, ijcnn1):
    assert names() == ("adult", "blogfeedback", "california_housing", "cifar10", "diabetes", "gas_turbine", "ijcnn1",
                       "kddcup99", "mnist")
    meta = info("ijcnn1")
    assert (meta["n_train"], meta["n_test"], meta["dim"]) == (ijcnn1.n, 91_701, ijcnn1.dim)
    assert meta["files"][0]["sha256"].startswith("b38a4198ce14")
    assert meta["files"][1]["url"] == (
        "https://raw.githubusercontent.com/X-DataInitiative/tick-datasets/"
        "9d959b6e53e17145e93e9849ff1f9f6d2de8ae51/binary/ijcnn1/ijcnn1.tst.bz2")
    assert info("adult")["bundled"] is True and info("adult")["task"] == "binary"
    monkeypatch.setenv("DPOPT_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("DPOPT_DATA")
    assert default_data_dir() == Path(platformdirs.user_cache_dir("dpopt")) / "data"


def test_load_uses_dpopt_data_env(monkeypatch, shared_data_dir, ijcnn1):
    monkeypatch.setenv("DPOPT_DATA", str(shared_data_dir))
    assert load("ijcnn1").n == ijcnn1.n


@pytest.mark.parametrize("call", [load, info, fetch])
def test_unknown_dataset_lists_allowed_names(call):
    with pytest.raises(DataError, match=r"^dataset='foo' must be one of: adult, blogfeedback, california_housing, "
                       r"cifar10, diabetes, gas_turbine, ijcnn1, kddcup99, mnist$"):
        call("foo")


def test_missing_file_says_how_to_fetch(tmp_path):
    with pytest.raises(DataError) as error:
        load("ijcnn1", tmp_path)
    message = str(error.value)
    assert str(tmp_path / "ijcnn1" / "ijcnn1.trn.bz2") in message
    assert "run `dpopt data fetch ijcnn1` or pass --data-dir/DPOPT_DATA" in message


def test_corrupt_file_is_rejected_with_both_hashes(tmp_path, shared_data_dir):
    folder = copy_ijcnn1(shared_data_dir, tmp_path / "ijcnn1")
    flip_byte(folder / "ijcnn1.tst.bz2")
    with pytest.raises(DataError) as error:
        load("ijcnn1", tmp_path)
    message = str(error.value)
    assert f"{folder / 'ijcnn1.tst.bz2'} is corrupt: sha256 " in message
    assert f"!= expected {info('ijcnn1')['files'][1]['sha256']}" in message
    assert info("ijcnn1")["files"][1]["sha256"].startswith("acd1db430684")
    assert message.endswith("; run `dpopt data fetch ijcnn1` to download it again")
    assert "\n" not in message


def test_dataset_checks_its_arrays():
    X, y = np.zeros((3, 2)), np.array([1.0, -1.0, 1.0])
    with pytest.raises(DpoptError, match="task='ordinal' must be one of: binary, regression, multiclass"):
        Dataset("toy", "ordinal", X, y, X, y, "made up")
    with pytest.raises(DpoptError, match="y_train must hold only -1.0 and"):
        Dataset("toy", "binary", X, y + 1, X, y, "made up")
    with pytest.raises(DpoptError, match=r"X_test.shape\[1\]=3 must equal X_train.shape\[1\]=2"):
        Dataset("toy", "binary", X, y, np.zeros((3, 3)), y, "made up")
    regression = Dataset("toy", "regression", X, y + 1, X, y, "made up")
    with pytest.raises(DpoptError, match="task='regression' must be 'binary'"):
        regression.majority_error()



def test_fetch_downloads_verified_files_once(server, tmp_path, shared_data_dir, ijcnn1):
    copy_ijcnn1(shared_data_dir, server.root)
    data_dir = tmp_path / "data"
    paths = fetch("ijcnn1", data_dir, base_url=server.url)
    assert paths == [data_dir.resolve() / "ijcnn1" / name for name in IJCNN1_FILES]
    assert sorted(p.name for p in (data_dir / "ijcnn1").iterdir()) == list(IJCNN1_FILES)
    assert server.requests == [f"/{name}" for name in IJCNN1_FILES]
    fetched = load("ijcnn1", data_dir)
    assert np.array_equal(fetched.X_test, ijcnn1.X_test)
    assert labels(fetched.y_train) == (45_137, 4_853)
    assert fetch("ijcnn1", data_dir, base_url=server.url) == paths
    assert len(server.requests) == 2  # nothing downloaded again


def test_fetch_replaces_a_corrupt_local_file(server, tmp_path, shared_data_dir):
    copy_ijcnn1(shared_data_dir, server.root)
    local = copy_ijcnn1(shared_data_dir, tmp_path / "ijcnn1")
    flip_byte(local / "ijcnn1.trn.bz2")
    fetch("ijcnn1", tmp_path, base_url=server.url)
    assert server.requests == ["/ijcnn1.trn.bz2"]
    assert (local / "ijcnn1.trn.bz2").read_bytes() == (
        shared_data_dir / "ijcnn1" / "ijcnn1.trn.bz2").read_bytes()


def test_fetch_of_a_corrupt_download_leaves_nothing(server, tmp_path, shared_data_dir):
    served = copy_ijcnn1(shared_data_dir, server.root)
    flip_byte(served / "ijcnn1.trn.bz2")
    with pytest.raises(DataError, match=r"ijcnn1.trn.bz2 is corrupt: sha256 [0-9a-f]{64} != "
                                        r"expected b38a4198"):
        fetch("ijcnn1", tmp_path, base_url=server.url)
    assert list((tmp_path / "ijcnn1").iterdir()) == []  # no file and no temporary file


def test_fetch_failure_is_one_line_and_leaves_nothing(server, tmp_path):
    with pytest.raises(DataError, match=r"download http://127\.0\.0\.1:\d+/ijcnn1.trn.bz2 "
                                        r"failed \(HTTP Error 404") as error:
        fetch("ijcnn1", tmp_path, base_url=server.url)
    assert "\n" not in str(error.value)
    assert list((tmp_path / "ijcnn1").iterdir()) == []


def test_fetch_of_bundled_data_is_a_no_op(tmp_path):
    paths = fetch("adult", tmp_path)
    assert [p.name for p in paths] == ["a9a.bz2", "a9a.t.bz2"] and all(p.is_file() for p in paths)
    assert list(tmp_path.iterdir()) == []


def test_fetch_into_an_unusable_data_dir(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(DataError, match=r"data_dir='.*/file' cannot be written "
                                        r"\(Not a directory\); pass another --data-dir"):
        fetch("ijcnn1", not_a_dir)
