"""Tests of the CIFAR-10 reader and its registry entry, on tiny fake archives with the layout of
``cifar-10-python.tar.gz`` (the real 170 MB archive is not in the shared data)."""

import dataclasses
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dpopt.data import DataError, fetch, info, load
from dpopt.data.catalogue import Catalogue, shipped
from dpopt.data.cifar import TEST_MEMBER, TRAIN_MEMBERS, read_cifar10

ARCHIVE = "cifar-10-python.tar.gz"
SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
N_TRAIN, N_TEST = (4, 4, 4, 4, 4), 3


class Python2Pickler(pickle._Pickler):
    """Protocol-2 pickler writing ``bytes`` as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING),
    as cPickle did for the real batches (Python 3 would write ``_codecs.encode`` calls)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def batch_pickle(data: np.ndarray, labels: list[int], label: bytes = b"fake batch",
                 numpy_module: str = "numpy.core.multiarray") -> bytes:
    """One batch pickled like the real files: a dict with byte-string keys, protocol 2."""
    batch = {b"batch_label": label, b"labels": labels, b"data": data,
             b"filenames": [b"img_%d.png" % k for k in range(len(labels))]}
    out = io.BytesIO()
    Python2Pickler(out, protocol=2).dump(batch)
    raw = out.getvalue()
    for spelling in (b"numpy.core.multiarray", b"numpy._core.multiarray"):  # GLOBAL is "module\nname\n"
        raw = raw.replace(b"c" + spelling + b"\n_reconstruct\n", b"c" + numpy_module.encode() + b"\n_reconstruct\n")
    assert b"c" + numpy_module.encode() + b"\n_reconstruct\n" in raw and b"_codecs" not in raw
    return raw


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``n`` random images as [n, 32, 32, 3] (height, width, RGB), their batch rows (channel-major
    like the real files) and labels."""
    rng = np.random.default_rng(seed)
    hwc = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    rows = np.ascontiguousarray(hwc.transpose(0, 3, 1, 2).reshape(n, 3072))
    return hwc, rows, [int(k) for k in rng.integers(0, 10, size=n)]


def write_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, payload in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(payload)
            archive.addfile(entry, io.BytesIO(payload))
    return path


def fake_members(numpy_module: str = "numpy.core.multiarray") -> tuple[dict[str, bytes], dict]:
    """Members of a fake archive (5 train batches of 4 images, a test batch of 3) and the images."""
    members = {"cifar-10-batches-py/batches.meta": pickle.dumps({b"label_names": [b"airplane"]}, 2)}
    expected = {"train": [], "test": []}
    for k, (name, n) in enumerate(zip((*TRAIN_MEMBERS, TEST_MEMBER), (*N_TRAIN, N_TEST))):
        hwc, rows, labels = images(n, seed=k)
        members[name] = batch_pickle(rows, labels, b"batch %d" % k, numpy_module)
        expected["test" if name == TEST_MEMBER else "train"].append((hwc, labels))
    members["cifar-10-batches-py/readme.html"] = b"<html></html>"
    return members, expected


@pytest.fixture
def fake(tmp_path) -> tuple[Path, dict]:
    members, expected = fake_members()
    return write_archive(tmp_path / ARCHIVE, members), expected


@pytest.mark.parametrize("numpy_module", ["numpy.core.multiarray", "numpy._core.multiarray"])
def test_reads_a_fake_archive_with_the_real_layout(tmp_path, numpy_module):
    members, expected = fake_members(numpy_module)
    X_train, y_train, X_test, y_test = read_cifar10(write_archive(tmp_path / ARCHIVE, members))
    assert X_train.shape == (20, 3072) and X_test.shape == (3, 3072)
    assert y_train.shape == (20,) and y_test.shape == (3,)
    assert {a.dtype for a in (X_train, y_train, X_test, y_test)} == {np.dtype(np.float64)}
    for X, y, split in ((X_train, y_train, "train"), (X_test, y_test, "test")):
        hwc = np.concatenate([images for images, _ in expected[split]])
        labels = [label for _, batch_labels in expected[split] for label in batch_labels]
        assert 0.0 <= X.min() and X.max() <= 1.0
        # rows are channel-major: reshaped to [3, 32, 32] they give back the (height, width, RGB) images
        assert np.array_equal(np.rint(X.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1) * 255), hwc)
        assert np.array_equal(X * 255, np.rint(X * 255)) and np.array_equal(y, labels)
    first = expected["train"][0][0][0]  # image 0 of data_batch_1, [32, 32, 3]
    assert X_train[0, 0] == first[0, 0, 0] / 255     # red of pixel (row 0, column 0)
    assert X_train[0, 1] == first[0, 1, 0] / 255     # red of pixel (0, 1)
    assert X_train[0, 32] == first[1, 0, 0] / 255    # red of pixel (1, 0)
    assert X_train[0, 1024] == first[0, 0, 1] / 255  # green of pixel (0, 0)
    assert X_train[0, 2048] == first[0, 0, 2] / 255  # blue of pixel (0, 0)
    assert X_train[4, 0] == expected["train"][1][0][0, 0, 0, 0] / 255  # data_batch_2 follows data_batch_1


def test_pixel_values_map_to_pixel_over_255(tmp_path):
    members, _ = fake_members()
    data = np.zeros((4, 3072), dtype=np.uint8)
    data[:, 0], data[1, 5], data[2, 3071] = 0, 255, 128
    members[TRAIN_MEMBERS[0]] = batch_pickle(data, [0, 9, 3, 9])
    X_train, y_train, _, _ = read_cifar10(write_archive(tmp_path / ARCHIVE, members))
    assert X_train[1, 5] == 1.0 and X_train[2, 3071] == 128 / 255 and X_train[0, 0] == 0.0
    assert list(y_train[:4]) == [0.0, 9.0, 3.0, 9.0]


def evil_pickle(module: str, name: str, marker: Path) -> bytes:
    """A protocol-0 pickle calling ``module.name`` on a command / path that creates ``marker``."""
    argument = f"touch {marker}" if name == "system" else f"open({str(marker)!r}, 'w')"
    return f"c{module}\n{name}\n(S'{argument}'\ntR.".encode()


@pytest.mark.parametrize("module, name", [("os", "system"), ("builtins", "eval"), ("posix", "system")])
def test_a_pickle_with_a_forbidden_global_is_refused_before_running(tmp_path, module, name):
    marker = tmp_path / "pwned"
    members, _ = fake_members()
    members[TRAIN_MEMBERS[2]] = evil_pickle(module, name, marker)
    with pytest.raises(DataError) as error:
        read_cifar10(write_archive(tmp_path / ARCHIVE, members))
    message = str(error.value)
    assert message.startswith(f"member {TRAIN_MEMBERS[2]} of {tmp_path / ARCHIVE} refers to the "
                              f"global {module}.{name}, which is refused")
    assert "numpy.ndarray" in message and "\n" not in message
    assert not marker.exists()


def test_a_missing_member_is_named(tmp_path):
    members, _ = fake_members()
    del members[TEST_MEMBER], members[TRAIN_MEMBERS[3]]
    with pytest.raises(DataError, match=r"must be the CIFAR-10 python archive, but it has no member "
                                        r"cifar-10-batches-py/data_batch_4, cifar-10-batches-py/test_batch$"):
        read_cifar10(write_archive(tmp_path / ARCHIVE, members))


@pytest.mark.parametrize("data, labels, match", [
    (np.zeros((4, 3072), dtype=np.float32), [0] * 4, r"b'data' as a uint8 array \[n, 3072\], not float32"),
    (np.zeros((4, 1024), dtype=np.uint8), [0] * 4, r"b.data. as a uint8 array .*, not uint8 of shape \(4, 1024\)"),
    (np.zeros((4, 3072), dtype=np.uint8), [0, 1, 10, 2], r"one label 0-9 per image \(4\), not 4 labels in \[0, 10\]"),
    (np.zeros((4, 3072), dtype=np.uint8), [0, 1, 2], r"one label 0-9 per image \(4\), not 3 labels"),
])
def test_malformed_batches_are_refused(tmp_path, data, labels, match):
    members, _ = fake_members()
    members[TEST_MEMBER] = batch_pickle(data, labels)
    with pytest.raises(DataError, match=f"^member {TEST_MEMBER} of .* must hold {match}"):
        read_cifar10(write_archive(tmp_path / ARCHIVE, members))


def test_not_an_archive_and_truncated_pickles(tmp_path):
    not_gz = tmp_path / ARCHIVE
    not_gz.write_bytes(b"not a tar.gz file at all")
    with pytest.raises(DataError, match=f"^file {not_gz} is not a readable tar.gz archive"):
        read_cifar10(not_gz)
    members, _ = fake_members()
    members[TEST_MEMBER] = members[TEST_MEMBER][:100]
    with pytest.raises(DataError, match=f"^member {TEST_MEMBER} of .* is not a readable pickle"):
        read_cifar10(write_archive(tmp_path / "truncated.tar.gz", members))


def test_registry_entry():
    meta = info("cifar10")
    assert (meta["task"], meta["n_train"], meta["n_test"], meta["dim"]) == ("multiclass", 50_000, 10_000, 3072)
    assert meta["bundled"] is False
    assert meta["files"] == [{"name": ARCHIVE, "size": 170_498_071, "sha256": SHA256, "content_sha256": None,
                              "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"}]


def test_registry_parser_is_the_reader(fake):
    path, _ = fake
    for ours, theirs in zip(shipped().entry("cifar10").parse([path]), read_cifar10(path)):
        assert np.array_equal(ours, theirs)


def test_missing_archive_says_how_to_fetch(tmp_path):
    with pytest.raises(DataError) as error:
        load("cifar10", tmp_path)
    message = str(error.value)
    assert str(tmp_path / "cifar10" / ARCHIVE) in message
    assert "run `dpopt data fetch cifar10` or pass --data-dir/DPOPT_DATA" in message


def test_load_checks_the_size_and_sha256_before_unpickling_anything(tmp_path):
    marker = tmp_path / "pwned"
    members, _ = fake_members()
    members[TRAIN_MEMBERS[0]] = evil_pickle("os", "system", marker)
    folder = tmp_path / "cifar10"
    folder.mkdir()
    size = write_archive(folder / ARCHIVE, members).stat().st_size
    with pytest.raises(DataError, match=f"{ARCHIVE} is corrupt: size {size:,} bytes != expected 170,498,071; "
                                        "run `dpopt data fetch cifar10` to download it again$"):
        load("cifar10", tmp_path)
    entry = shipped().entry("cifar10")  # an archive of the catalogued size: its sha256 refuses it
    resized = dataclasses.replace(entry, files=(dataclasses.replace(entry.files[0], size=size),))
    with pytest.raises(DataError, match=f"{ARCHIVE} is corrupt: sha256 [0-9a-f]{{64}} != expected {SHA256}; "
                                        "run `dpopt data fetch cifar10` to download it again$"):
        load("cifar10", tmp_path, catalogue=Catalogue({"cifar10": resized}))
    assert not marker.exists()


def test_fetch_refuses_an_archive_that_does_not_match_the_pin(server, tmp_path, fake):
    path, _ = fake
    (server.root / ARCHIVE).write_bytes(path.read_bytes())
    size = path.stat().st_size
    with pytest.raises(DataError, match=rf"^download {server.url}/{ARCHIVE} is corrupt: size {size:,} bytes "
                                        rf"!= expected 170,498,071; nothing was written to "):
        fetch("cifar10", tmp_path / "data", base_url=server.url)
    assert server.requests == [f"/{ARCHIVE}"]
    assert list((tmp_path / "data" / "cifar10").iterdir()) == []  # no file and no temporary file
