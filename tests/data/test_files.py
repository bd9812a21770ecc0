"""What a data file must be before it is read: a regular file of its registered size; and the
bytes parsed are the bytes whose sha256 was checked."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dpopt.data import DataError, fetch, files, load, loader

CSV = "pima_indians_diabetes.csv"


def diabetes_copy(shared_data_dir: Path, target: Path) -> Path:
    """``target/diabetes/<CSV>``: a writable copy of the shared file."""
    (target / "diabetes").mkdir(parents=True)
    shutil.copyfile(shared_data_dir / "diabetes" / CSV, target / "diabetes" / CSV)
    return target / "diabetes" / CSV


@pytest.fixture
def no_hashing(monkeypatch):
    """Any sha256 computed while files are checked fails the test: a refusal must come before reading."""
    def refuse(*args):
        raise AssertionError("the file was hashed before its size was checked")

    monkeypatch.setattr(files, "hashlib", SimpleNamespace(sha256=refuse))


def test_a_huge_file_is_refused_by_its_size_before_it_is_read(tmp_path, no_hashing):
    folder = tmp_path / "ijcnn1"
    folder.mkdir()
    for name in ("ijcnn1.trn.bz2", "ijcnn1.tst.bz2"):
        with open(folder / name, "wb") as sparse:
            sparse.truncate(20 * 2**30)  # 20 GiB, sparse: takes no disk space
    with pytest.raises(DataError, match=r"^data file .*ijcnn1.trn.bz2 is corrupt: size 21,474,836,480 bytes != "
                                        r"expected 1,395,175; run `dpopt data fetch ijcnn1` to download it again$"):
        load("ijcnn1", tmp_path)


def test_a_content_pinned_file_is_bounded_by_its_content_size(tmp_path, shared_data_dir, no_hashing):
    folder = tmp_path / "mnist"
    shutil.copytree(shared_data_dir / "mnist", folder, copy_function=os.symlink)
    (folder / "train-images-idx3-ubyte.gz").unlink()  # the first file read
    with open(folder / "train-images-idx3-ubyte.gz", "wb") as sparse:
        sparse.truncate(2**30)
    # the bound: 47,040,016 bytes of content, + 1 % + 1 KiB
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz is corrupt: size 1,073,741,824 bytes exceeds "
                                        r"47,511,440, more than any compression of its content takes;"):
        load("mnist", tmp_path)


def test_a_content_pinned_file_is_not_decompressed_past_its_content_size(tmp_path, shared_data_dir):
    folder = tmp_path / "mnist"
    shutil.copytree(shared_data_dir / "mnist", folder, copy_function=os.symlink)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(10**6)))  # 1 MB of zeros in 1 kB
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz is corrupt: it decompresses to more than the "
                                        r"10,008 bytes of the expected content;"):
        load("mnist", tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "character device", "directory"])
def test_only_regular_files_are_read(tmp_path, shared_data_dir, kind):
    path = tmp_path / "diabetes" / CSV
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    elif kind == "character device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    what = {"fifo": "a FIFO (named pipe)", "character device": "a character device", "directory": "a directory"}[kind]
    with pytest.raises(DataError) as error:
        load("diabetes", tmp_path)
    assert str(error.value) == f"data file {path} is {what}, not a regular file: put the data file itself there"


def test_a_fifo_in_the_data_dir_is_not_replaced_by_the_bundled_copy(tmp_path):
    (tmp_path / "adult").mkdir()
    os.mkfifo(tmp_path / "adult" / "a9a.bz2")
    with pytest.raises(DataError, match=r"a9a.bz2 is a FIFO \(named pipe\), not a regular file"):
        load("adult", tmp_path)


def test_the_bytes_parsed_are_the_bytes_hashed(tmp_path, shared_data_dir, monkeypatch):
    """The file is swapped for other (well-formed) data right after its sha256 is computed."""
    path = diabetes_copy(shared_data_dir, tmp_path)
    genuine = load("diabetes", shared_data_dir)
    swapped = bytearray(path.read_bytes())
    first_label = swapped.index(b"\n", swapped.index(b"\n") + 1) - 1  # the label of the first record
    swapped[first_label] ^= 0x01  # 1 -> 0: still a valid CSV
    real_sha256 = hashlib.sha256

    class Swapping:
        def __init__(self, *args):
            self.digest = real_sha256(*args)

        def update(self, data):
            self.digest.update(data)

        def hexdigest(self):
            path.write_bytes(bytes(swapped))  # the attacker's moment: after the hash, before the parse
            return self.digest.hexdigest()

    monkeypatch.setattr(files, "hashlib", SimpleNamespace(sha256=Swapping))
    monkeypatch.setattr(loader, "_PARSED", {})  # parse again, not from the cache
    loaded = load("diabetes", tmp_path)
    assert path.read_bytes() == bytes(swapped)  # the swap happened
    assert np.array_equal(loaded.y_train, genuine.y_train) and np.array_equal(loaded.X_train, genuine.X_train)


def test_loading_leaves_no_private_copy(tmp_path, shared_data_dir, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(loader.tempfile, "tempdir", None)  # re-read TMPDIR
    load("diabetes", shared_data_dir)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_download_larger_than_the_file_is_cut_short(server, tmp_path):
    (server.root / "ijcnn1.trn.bz2").write_bytes(bytes(5_000_000))
    with pytest.raises(DataError, match=r"^download .*/ijcnn1.trn.bz2 is corrupt: more than 1,395,175 bytes "
                                        r"\(expected 1,395,175\); nothing was written to "):
        fetch("ijcnn1", tmp_path, base_url=server.url)
    assert list((tmp_path / "ijcnn1").iterdir()) == []
