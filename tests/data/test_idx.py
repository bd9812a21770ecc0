"""Tests of the IDX reader and the MNIST registration: the real files (counts, pixel statistics),
every malformed-file error, and checksums of the decompressed content (any gzip wrapper of the
official bytes loads and downloads; other content is refused)."""

import gzip
import io
from pathlib import Path

import numpy as np
import pytest

from dpopt._validate import DpoptError
from dpopt.data import DataError, Dataset, fetch, info, load, read_idx

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


@pytest.fixture(scope="module")
def mnist_dir(shared_data_dir) -> Path:
    return shared_data_dir / "mnist"


@pytest.fixture(scope="module")
def mnist(shared_data_dir) -> Dataset:
    return load("mnist", shared_data_dir)


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    """An IDX file of ``array`` (item type ``code``), written by hand: magic, dims, big-endian items."""
    header = bytes([0, 0, code, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def mnist_copy(source: Path, target: Path, replace: dict[str, bytes]) -> Path:
    """``target/mnist`` with the shared files symlinked, except ``replace``'s (name -> bytes)."""
    folder = target / "mnist"
    folder.mkdir(parents=True)
    for name in FILES:
        if name in replace:
            (folder / name).write_bytes(replace[name])
        else:
            (folder / name).symlink_to(source / name)
    return folder


def regzip(path: Path, edit=None) -> bytes:
    """The content of the gzip file ``path`` (``edit``ed), re-compressed with another header."""
    content = bytearray(gzip.decompress(path.read_bytes()))
    if edit is not None:
        edit(content)
    data = gzip.compress(bytes(content), compresslevel=1, mtime=123456789)
    assert data != path.read_bytes()
    return data


# ------------------------------------------------------------------------------ read_idx


def test_read_idx_on_the_real_files(mnist_dir):
    train_x = read_idx(mnist_dir / "train-images-idx3-ubyte.gz")
    train_y = read_idx(mnist_dir / "train-labels-idx1-ubyte.gz")
    test_x = read_idx(str(mnist_dir / "t10k-images-idx3-ubyte.gz"))
    with (mnist_dir / "t10k-labels-idx1-ubyte.gz").open("rb") as stream:
        test_y = read_idx(stream)
    assert train_x.shape == (60_000, 28, 28) and test_x.shape == (10_000, 28, 28)
    assert train_x.dtype == test_x.dtype == train_y.dtype == np.uint8
    assert train_y.shape == (60_000,) and test_y.shape == (10_000,)
    assert np.bincount(train_y).tolist() == TRAIN_COUNTS
    assert np.bincount(test_y).tolist() == TEST_COUNTS
    assert train_x.mean() / 255 == pytest.approx(0.1307, abs=1e-3)
    assert test_x.mean() / 255 == pytest.approx(0.1325, abs=1e-3)
    assert (train_x / 255).std() == pytest.approx(0.3081, abs=1e-3)
    assert train_x.flags.writeable and train_y[0] == 5 and test_y[0] == 7  # well-known first labels


def test_plain_files_streams_and_every_item_type(tmp_path, mnist_dir):
    plain = tmp_path / "labels.idx"  # decompressed: recognised by content, not by name
    plain.write_bytes(gzip.decompress((mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    labels = read_idx(plain)
    assert np.bincount(labels).tolist() == TEST_COUNTS
    assert np.array_equal(read_idx(io.BytesIO(plain.read_bytes())), labels)
    for dtype, code in [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C),
                        (np.float32, 0x0D), (np.float64, 0x0E)]:
        array = (np.arange(24).reshape(2, 3, 4) * (1 if dtype == np.uint8 else -300)).astype(dtype)
        got = read_idx(io.BytesIO(gzip.compress(idx_bytes(array, code))))
        assert got.dtype == dtype and got.dtype.isnative and np.array_equal(got, array)
    empty = read_idx(io.BytesIO(idx_bytes(np.zeros((0, 28, 28), np.uint8), 0x08)))
    assert empty.shape == (0, 28, 28)


LABELS = idx_bytes(np.array([3, 1, 4, 1, 5], np.uint8), 0x08)


@pytest.mark.parametrize("data, problem", [
    (b"\0\0\x08", r"is not an IDX file: 3 bytes, shorter than the 4-byte magic number"),
    (b"\x01" + LABELS[1:], r"is not an IDX file: magic number 16779265 \(0x01000801\) must be 0x0000TTDD"),
    (LABELS[:2] + b"\x07" + LABELS[3:], r"magic number 1793 \(0x00000701\) must be .*known item type"),
    (LABELS[:3] + b"\0", r"magic number 2048 \(0x00000800\) must be .* DD >= 1 dimensions "
                         r"\(MNIST: 2049 labels, 2051 images\)"),
    (LABELS[:4] + b"\0\0", r"is truncated: its magic number 2049 announces 1 dimensions \(8 header "
                           r"bytes\), but the file has 6 bytes"),
    (LABELS[:-1], r"is truncated: its header says shape \(5,\) of uint8 = 5 data bytes, but 4 follow"),
    (LABELS + b"\0", r"is too long: its header says shape \(5,\) of uint8 = 5 data bytes, but 6 follow"),
    (gzip.compress(LABELS)[:-6], r"cannot be decompressed \(gzip\): "),
])
def test_malformed_files_name_the_file_and_the_problem(tmp_path, data, problem):
    path = tmp_path / "bad-idx1-ubyte.gz"
    path.write_bytes(data)
    with pytest.raises(DataError, match=problem) as error:
        read_idx(path)
    message = str(error.value)
    assert message.startswith(f"file {path} ") and "\n" not in message


def test_real_file_cut_short_and_unreadable_sources(tmp_path, mnist_dir):
    content = gzip.decompress((mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes())
    short = tmp_path / "t10k-images-idx3-ubyte"
    short.write_bytes(content[:-784])  # one image short
    with pytest.raises(DataError, match=rf"^file {short} is truncated: its header says shape "
                                        r"\(10000, 28, 28\) of uint8 = 7,840,000 data bytes, but "
                                        r"7,839,216 follow the header$"):
        read_idx(short)
    corrupt = bytearray((mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes())
    corrupt[2000] ^= 0xFF
    (tmp_path / "flipped.gz").write_bytes(bytes(corrupt))
    with pytest.raises(DataError, match=r"flipped.gz cannot be decompressed \(gzip\)"):
        read_idx(tmp_path / "flipped.gz")
    with pytest.raises(DataError, match=r"^file .*missing cannot be read: No such file"):
        read_idx(tmp_path / "missing")
    with pytest.raises(DataError, match=r"must be opened in binary mode"):
        read_idx(io.StringIO("text"))


# ----------------------------------------------------------------------- MNIST in the registry


def test_load_mnist_from_the_shared_files(mnist, mnist_dir):
    assert (mnist.task, mnist.n, mnist.dim) == ("multiclass", 60_000, 784)
    assert mnist.X_train.shape == (60_000, 784) and mnist.X_test.shape == (10_000, 784)
    assert mnist.X_train.dtype == mnist.y_test.dtype == np.float64
    assert mnist.X_train.min() == 0.0 and mnist.X_train.max() == 1.0
    assert np.bincount(mnist.y_train.astype(int)).tolist() == TRAIN_COUNTS
    assert np.bincount(mnist.y_test.astype(int)).tolist() == TEST_COUNTS
    assert mnist.X_train.mean() == pytest.approx(0.1307, abs=1e-3)
    assert mnist.X_test.mean() == pytest.approx(0.1325, abs=1e-3)
    images = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")  # rows are row-major images / 255
    assert np.array_equal(mnist.X_test[[0, 9_999]], images[[0, 9_999]].reshape(2, 784) / 255.0)
    assert mnist.majority_error() == pytest.approx(1 - 1135 / 10_000)  # class 1 is the majority
    assert "ossci-datasets" in mnist.source and "t10k-labels-idx1-ubyte.gz" in mnist.source
    meta = info("mnist")
    assert [f["name"] for f in meta["files"]] == list(FILES)
    assert meta["files"][0]["url"] == "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz"
    assert meta["files"][0]["content_sha256"].startswith("ba891046e650")
    assert (meta["n_train"], meta["n_test"], meta["dim"], meta["bundled"]) == (60_000, 10_000, 784, False)


def test_another_gzip_wrapper_of_the_same_content_loads(tmp_path, mnist_dir):
    name = "t10k-labels-idx1-ubyte.gz"
    mnist_copy(mnist_dir, tmp_path, {name: regzip(mnist_dir / name)})
    ds = load("mnist", tmp_path)
    assert np.bincount(ds.y_test.astype(int)).tolist() == TEST_COUNTS


def test_other_content_is_refused_with_the_content_hash(tmp_path, mnist_dir):
    name = "train-labels-idx1-ubyte.gz"

    def relabel(content):
        content[100] = (content[100] + 1) % 10

    folder = mnist_copy(mnist_dir, tmp_path, {name: regzip(mnist_dir / name, relabel)})
    with pytest.raises(DataError) as error:
        load("mnist", tmp_path)
    message = str(error.value)
    assert message.startswith(f"data file {folder / name} is corrupt: sha256 of its decompressed "
                              "content ")
    assert f"!= expected {info('mnist')['files'][1]['content_sha256']}" in message
    assert message.endswith("; run `dpopt data fetch mnist` to download it again")
    (folder / name).unlink()
    (folder / name).write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"is corrupt: its sha256 [0-9a-f]{64} is not the known "
                                        r"copy's and it cannot be decompressed \("):
        load("mnist", tmp_path)


def test_multiclass_labels_and_majority():
    X = np.zeros((4, 2))
    ds = Dataset("toy", "multiclass", X, [2.0, 0.0, 2.0, 0.0], X, [0.0, 2.0, 1.0, 0.0], "made up")
    assert ds.majority_error() == 0.5  # tie between 0 and 2: the smallest label, 0
    for bad in ([0.0, 1.5, 2.0, 0.0], [0.0, -1.0, 2.0, 0.0], [0.0, np.nan, 1.0, 0.0]):
        with pytest.raises(DpoptError, match=r"y_train must hold only class indices 0.0, 1.0, "):
            Dataset("toy", "multiclass", X, bad, X, [0.0] * 4, "made up")
    regression = Dataset("toy", "regression", X, [0.5] * 4, X, [0.5] * 4, "made up")
    with pytest.raises(DpoptError, match="task='regression' must be 'binary' or 'multiclass'"):
        regression.majority_error()


# ----------------------------------------------------------------------------- fetching



def test_fetch_accepts_the_mirrors_wrapper_and_refuses_other_content(server, tmp_path, mnist_dir):
    name = "t10k-labels-idx1-ubyte.gz"  # the "mirror" serves the official bytes in another gzip
    (server.root / name).write_bytes(regzip(mnist_dir / name))
    data_dir = tmp_path / "data"
    folder = mnist_copy(mnist_dir, data_dir, {})
    (folder / name).unlink()
    paths = fetch("mnist", data_dir, base_url=server.url)
    assert server.requests == [f"/{name}"]  # the verified shared files were kept
    assert paths[3] == data_dir.resolve() / "mnist" / name
    assert (folder / name).read_bytes() == (server.root / name).read_bytes()
    assert fetch("mnist", data_dir, base_url=server.url) == paths and len(server.requests) == 1

    def relabel(content):
        content[8] = (content[8] + 1) % 10

    (server.root / name).write_bytes(regzip(mnist_dir / name, relabel))
    (folder / name).unlink()
    with pytest.raises(DataError, match=rf"download {server.url}/{name} is corrupt: sha256 of its "
                                        r"decompressed content [0-9a-f]{64} != expected ff7bcfd4"):
        fetch("mnist", data_dir, base_url=server.url)
    assert sorted(p.name for p in folder.iterdir()) == sorted(set(FILES) - {name})  # no temp file
