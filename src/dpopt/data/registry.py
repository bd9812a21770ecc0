"""Registry of the real data sets: where their files come from, how to check, fetch and load them.

Every data file is pinned by its size and sha256, which are checked on every :func:`load` and
on every download: the size first (from the file system, so a huge or growing file is refused
before it is read), then the sha256 of the bytes as they are copied into a private temporary
file, which is what gets parsed (so a file swapped in after the check is never parsed). Only
regular files are read: a FIFO, a device or a directory in place of a data file is refused.
A compressed file may instead be pinned by the sha256 of its decompressed content
(``RemoteFile.content_sha256``): then any compression of the same bytes is accepted (MNIST: the
mirror's original ``.gz`` files and the re-compressed shared copies differ only in their gzip
wrapper), up to a size bound derived from the content's size. Files live in
``<data dir>/<data set>/``; the data dir is ``data_dir`` if given, else
:func:`default_data_dir`. Data sets marked ``bundled`` ship inside the package and load without
any data dir (a copy in the data dir is used first).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import http.client
import lzma
import os
import stat
import tempfile
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import platformdirs

from dpopt._validate import DpoptError, one_of
from dpopt.data.cifar import read_cifar10
from dpopt.data.idx import read_idx
from dpopt.data import tabular
from dpopt.data.bounds import AsGiven, Preparation, PublicBounds, Range
from dpopt.data.libsvm import DataError, read_libsvm

__all__ = ["DataError", "Dataset", "RemoteFile", "default_data_dir", "fetch", "info", "load",
           "names", "preparation"]

TASKS = ("binary", "regression", "multiclass")
_BUNDLED_DIR = Path(__file__).with_name("bundled")
_CHUNK = 1 << 20
_TICK_COMMIT = "9d959b6e53e17145e93e9849ff1f9f6d2de8ae51"
_TICK_IJCNN1 = ("https://raw.githubusercontent.com/X-DataInitiative/tick-datasets/"
                f"{_TICK_COMMIT}/binary/ijcnn1/")
_MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"  # LeCun's original .gz files
_CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"  # Krizhevsky's own site
_DECOMPRESS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}

PathLike = str | os.PathLike[str]
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split in memory: dense float64 features ``X [n, d]`` and labels ``y [n]``.

    Binary labels are -1.0/+1.0; multiclass labels are the class indices 0.0, 1.0, ... (cast
    them to ``long`` for ``cross_entropy``). Images are stored flattened, one row per image
    (MNIST: 784 pixels, row-major); models reshape them (``dpopt.models`` start with
    ``nn.Unflatten``). ``source`` is one line saying where the files came from.
    """

    name: str
    task: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    source: str

    def __post_init__(self) -> None:
        one_of("task", self.task, TASKS)
        for field in ("X_train", "y_train", "X_test", "y_test"):
            object.__setattr__(self, field, np.asarray(getattr(self, field), dtype=np.float64))
        _check_split("train", self.X_train, self.y_train, self.task)
        _check_split("test", self.X_test, self.y_test, self.task)
        if self.X_test.shape[1] != self.dim:
            raise DpoptError(f"X_test.shape[1]={self.X_test.shape[1]} must equal "
                             f"X_train.shape[1]={self.dim}")

    @property
    def n(self) -> int:
        """Number of training rows."""
        return int(self.X_train.shape[0])

    @property
    def dim(self) -> int:
        """Number of features."""
        return int(self.X_train.shape[1])

    def majority_error(self) -> float:
        """Test error of always predicting the training majority class (binary ties predict -1,
        multiclass ties the smallest label)."""
        if self.task == "binary":
            majority = 1.0 if np.count_nonzero(self.y_train == 1.0) * 2 > self.n else -1.0
        elif self.task == "multiclass":
            classes, counts = np.unique(self.y_train, return_counts=True)
            majority = classes[np.argmax(counts)]
        else:
            raise DpoptError(f"task={self.task!r} must be 'binary' or 'multiclass' for majority_error()")
        return float(np.mean(self.y_test != majority))


def _check_split(split: str, X: np.ndarray, y: np.ndarray, task: str) -> None:
    """``X`` is 2-D, ``y`` 1-D with one label per row, binary labels in {-1, +1}, multiclass
    labels integers >= 0."""
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise DpoptError(f"X_{split}.shape={X.shape} and y_{split}.shape={y.shape} "
                         "must be (n, d) and (n,)")
    if task == "binary" and not np.isin(y, (-1.0, 1.0)).all():
        raise DpoptError(f"y_{split} must hold only -1.0 and +1.0 for task='binary'")
    if task == "multiclass" and not (np.isfinite(y) & (y >= 0) & (y == np.floor(y))).all():
        raise DpoptError(f"y_{split} must hold only class indices 0.0, 1.0, ... for task='multiclass'")


@dataclass(frozen=True)
class RemoteFile:
    """One data file: its name inside the data set folder, its sha256 and its download URL.

    With ``content_sha256`` (the sha256 of the file decompressed by its suffix: ``.gz``,
    ``.bz2``, ``.xz``), a file whose own sha256 differs is still accepted when its content has
    that hash: the same data in another compressed wrapper. ``sha256`` is then the hash of one
    known copy (checked first, since it is cheaper). ``size``: the bytes of the known copy, the
    only size accepted unless the file is pinned by its content (then up to :attr:`max_size`;
    ``content_size``, the bytes of the content, also bounds its decompression).
    """

    name: str
    sha256: str
    url: str | None
    content_sha256: str | None = None
    _: KW_ONLY
    size: int
    content_size: int | None = None

    @property
    def max_size(self) -> int:
        """The largest file accepted: the known copy's size; for a file pinned by its content, its
        content's size plus 1 % and 1 KiB (what gzip, bzip2 or xz add at worst to incompressible data)."""
        if self.content_size is None:
            return self.size
        return max(self.size, self.content_size + self.content_size // 100 + 1024)


@dataclass(frozen=True)
class _Spec:
    """Everything known about one data set before reading it."""

    name: str
    task: str
    files: tuple[RemoteFile, ...]
    parse: Callable[[Sequence[Path]], Arrays]
    description: str
    licence: str
    source: str
    bundled: bool
    n_train: int
    n_test: int
    dim: int
    #: How ``dpopt run`` prepares it for every model, from public bounds only (None: it declares
    #: none, and the user must give them).
    preparation: Preparation | None


#: LIBSVM's binary and scaled data sets and the image data sets are already in public ranges.
_BINARY_FEATURES = AsGiven("binary features 0/1 (LIBSVM's binarisation)")
_PIXELS = AsGiven("pixels / 255 in [0, 1]")
#: California Housing (1990 census block groups): public ranges from geography and the census's
#: own categories, not from the file. Longitude and latitude: California's bounding box; housing
#: median age: 0-52 years (the oldest category of year built, "1939 or earlier", ends 51 years
#: before 1990); rooms, bedrooms, population, households: block groups are drawn for 600-3,000
#: people, so generous caps of 20,000 rooms, 4,000 bedrooms, 10,000 people and 4,000 households
#: (the few larger groups are clipped); median income in $10,000s, top-coded at 15 ($150,000);
#: target the median house value, top-coded at $500,000 (written 500,001).
_CALIFORNIA = PublicBounds(
    features=(Range(-124.5, -114.0), Range(32.5, 42.0), Range(0, 52), Range(0, 20_000), Range(0, 4_000),
              Range(0, 10_000), Range(0, 4_000), Range(0, 15)),
    target=Range(0, 500_001),
    source="California's bounding box, the 1990 census's top-codes and block-group sizes")


def _libsvm_split(n_features: int) -> Callable[[Sequence[Path]], Arrays]:
    """Parser of a (train, test) pair of binary LIBSVM files with ``n_features`` features."""

    def parse(paths: Sequence[Path]) -> Arrays:
        train, test = paths
        return (*read_libsvm(train, n_features), *read_libsvm(test, n_features))

    return parse


def _mnist(paths: Sequence[Path]) -> Arrays:
    """Parser of MNIST's train images, train labels, test images and test labels (IDX files)."""
    train_images, train_labels, test_images, test_labels = paths
    return (*_mnist_split(train_images, train_labels), *_mnist_split(test_images, test_labels))


def _mnist_split(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X [n, 784]`` (pixel / 255, float64) and ``y [n]`` (0.0 … 9.0) from a pair of MNIST IDX files."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28):
        raise DataError(f"file {images_path} must hold uint8 images of 28x28 pixels, "
                        f"not {images.dtype} of shape {images.shape}")
    if labels.dtype != np.uint8 or labels.shape != images.shape[:1] or labels.max(initial=0) > 9:
        raise DataError(f"file {labels_path} must hold one uint8 label 0-9 per image of "
                        f"{images_path.name} ({len(images)}), not {labels.dtype} of shape {labels.shape}")
    X = images.reshape(len(images), -1).astype(np.float64)
    X /= 255.0
    return X, labels.astype(np.float64)


def _cifar10(paths: Sequence[Path]) -> Arrays:
    """Parser of ``cifar-10-python.tar.gz`` (:func:`dpopt.data.cifar.read_cifar10`). Its batches
    are pickles: it only runs after :func:`load` verified the archive's sha256."""
    (archive,) = paths
    return read_cifar10(archive)


_PIMA_HEADER = "pregnant,glucose,pressure,triceps,insulin,mass,pedigree,age,diabetes"
_PIMA_TRAIN = 500  # the AClip paper: "768 samples, where we select 500 samples for training"


def _pima(paths: Sequence[Path]) -> Arrays:
    """Parser of the Pima Indians Diabetes CSV (header line, 768 rows of 8 features + label).

    The CSV labels are 1 = tested positive, 0 = tested negative; they are mapped to LIBSVM's
    ``diabetes`` convention ``y = 1 - 2 * label``: **-1.0 = tested positive, +1.0 = tested
    negative**. The features are returned raw (no scaling). The first 500 rows are the
    training set, the remaining 268 the test set (file order, no shuffling).
    """
    (path,) = paths
    with open(path, encoding="ascii") as stream:
        header = stream.readline().strip()
        if header != _PIMA_HEADER:
            raise DataError(f"file {path} must start with the header line {_PIMA_HEADER!r}, "
                            f"not {header[:80]!r}")
        table = np.loadtxt(stream, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != 9 or len(table) <= _PIMA_TRAIN:
        raise DataError(f"file {path} must hold more than {_PIMA_TRAIN} rows of 8 features + "
                        f"label, not shape {table.shape}")
    label = table[:, 8]
    if not np.isin(label, (0.0, 1.0)).all():
        raise DataError(f"file {path} must have labels 0 (neg) and 1 (pos) only in its last column")
    X, y = table[:, :8], 1.0 - 2.0 * label
    return X[:_PIMA_TRAIN], y[:_PIMA_TRAIN], X[_PIMA_TRAIN:], y[_PIMA_TRAIN:]


_SPECS = (
    _Spec(
        name="adult",
        task="binary",
        files=(
            RemoteFile("a9a.bz2",
                       "1dcb2b4aedea0b5a9e964192dd211675d16cf05ab6477ddd0702d87c1d1af8da", None, size=100_552),
            RemoteFile("a9a.t.bz2",
                       "e55725b53c3c47f7053bd3ef12e41555539eac4c0fe989e69345cc4dd0ea6e8d", None, size=50_548),
        ),
        parse=_libsvm_split(123),
        description="UCI Adult binarised by LIBSVM (a9a, a9a.t): 123 binary features, "
                    "+1 = income > 50K",
        licence="UCI Adult is CC BY 4.0; a9a binarisation by LIBSVM (Platt)",
        source="LIBSVM a9a (train: github.com/SofianeTanji/snacks@352cf02, first 32,561 "
               "lines; test: github.com/UltramanGaia/ML2017-lab-02@a83899d data/a9a.t), "
               "re-compressed with bzip2",
        bundled=True,
        n_train=32_561,
        n_test=16_281,
        dim=123,
        preparation=_BINARY_FEATURES,
    ),
    _Spec(
        name="ijcnn1",
        task="binary",
        files=(
            RemoteFile("ijcnn1.trn.bz2",
                       "b38a4198ce142d43e96fb86d17b87211feec1f909ac344fa057455c69de29de3",
                       _TICK_IJCNN1 + "ijcnn1.trn.bz2", size=1_395_175),
            RemoteFile("ijcnn1.tst.bz2",
                       "acd1db430684fdd3f0c768ecc49aa8e749d0004fc117611220c2aa576a7b6a24",
                       _TICK_IJCNN1 + "ijcnn1.tst.bz2", size=2_597_597),
        ),
        parse=_libsvm_split(22),
        description="IJCNN 2001 challenge, winner's transformation (LIBSVM ijcnn1, ijcnn1.t): "
                    "22 features, about 9.7% positive",
        licence="LIBSVM data page states no licence; tick-datasets repository is BSD-3-Clause",
        source=f"LIBSVM ijcnn1 via github.com/X-DataInitiative/tick-datasets@{_TICK_COMMIT[:7]} "
               "binary/ijcnn1 (trn = tr + val, tst = ijcnn1.t)",
        bundled=False,
        n_train=49_990,
        n_test=91_701,
        dim=22,
        preparation=AsGiven("features scaled by LIBSVM into [-1, 1]"),
    ),
    _Spec(
        name="mnist",
        task="multiclass",
        # The .gz sha256s are those of the shared copies (README of shared/data): their gzip
        # wrappers differ from the mirror's originals (re-compressed; 2021 header timestamps),
        # so every file is pinned by its decompressed content, whose md5s are the official ones
        # (train-images 6bbc9ace…, train-labels a25bea73…, t10k-images 2646ac64…,
        # t10k-labels 27ae3e4e…): both the shared copies and a fresh download verify.
        files=(
            RemoteFile("train-images-idx3-ubyte.gz",
                       "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971",
                       _MNIST_MIRROR + "train-images-idx3-ubyte.gz",
                       "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
                       size=9_719_438, content_size=47_040_016),
            RemoteFile("train-labels-idx1-ubyte.gz",
                       "ec02e7948609e5754d47881c09b8afdd8dfa60600b9e5388c8c54a67069ec772",
                       _MNIST_MIRROR + "train-labels-idx1-ubyte.gz",
                       "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
                       size=28_881, content_size=60_008),
            RemoteFile("t10k-images-idx3-ubyte.gz",
                       "167310007f03058885c7e95e6c0b19c20de5c7fd3031f4cbdadc9014a523d80b",
                       _MNIST_MIRROR + "t10k-images-idx3-ubyte.gz",
                       "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
                       size=1_648_877, content_size=7_840_016),
            RemoteFile("t10k-labels-idx1-ubyte.gz",
                       "fc607395669ec21321ea83e4b82c0544b7e8e63ff5b34337c06bc0a17cc0da3c",
                       _MNIST_MIRROR + "t10k-labels-idx1-ubyte.gz",
                       "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
                       size=4_542, content_size=10_008),
        ),
        parse=_mnist,
        description="MNIST handwritten digits: 28x28 grey images flattened row-major to 784 "
                    "features pixel/255 in [0, 1]; labels 0-9",
        licence="MNIST (LeCun, Cortes & Burges) is usually cited as CC BY-SA 3.0",
        source="MNIST IDX files (LeCun, Cortes & Burges; mirror ossci-datasets.s3.amazonaws.com/"
               "mnist), verified by the sha256 of their decompressed content",
        bundled=False,
        n_train=60_000,
        n_test=10_000,
        dim=784,
        preparation=_PIXELS,
    ),
    _Spec(
        name="diabetes",
        task="binary",
        # No stable original-source URL serves these exact bytes (the CSV was derived from
        # mlbench's PimaIndiansDiabetes.rda with a header added): copy it into the data dir by
        # hand, or `fetch(..., base_url=...)` from a server holding it.
        files=(
            RemoteFile("pima_indians_diabetes.csv",
                       "fb921ad6e7a338044c272cede111fa19a433b9cc86e41a0347e83753869a19b5", None, size=23_078),
        ),
        parse=_pima,
        description="Pima Indians Diabetes (= LIBSVM diabetes): 8 raw features (pregnant, "
                    "glucose, pressure, triceps, insulin, mass, pedigree, age); -1 = tested "
                    "positive, +1 = tested negative; train = first 500 rows, test = last 268",
        licence="mlbench (Leisch & Dimitriadou) is GPL-2; data originally from UCI / NIDDK",
        source="R package mlbench 2.1-3 (Debian r-cran-mlbench 2.1-3-1) PimaIndiansDiabetes.rda, "
               "exported to CSV with a header line, values unchanged",
        bundled=False,
        n_train=500,
        n_test=268,
        dim=8,
        preparation=None,
    ),
    _Spec(
        name="cifar10",
        task="multiclass",
        # sha256 of the official archive (170,498,071 bytes; md5 c58f30108f718f92721af3b95e74349a,
        # the one torchvision checks), as pinned by Keras: github.com/keras-team/keras
        # keras/src/datasets/cifar10.py@7e4b17c, `file_hash=` of the same URL. Not in shared/data.
        files=(
            RemoteFile("cifar-10-python.tar.gz",
                       "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                       _CIFAR10_URL, size=170_498_071),
        ),
        parse=_cifar10,
        description="CIFAR-10 (Krizhevsky 2009): 32x32 colour images flattened channel-major "
                    "(R 1024, G 1024, B 1024; reshape a row to [3, 32, 32]) to 3072 features "
                    "pixel/255 in [0, 1]; labels 0-9 (airplane … truck)",
        licence="CIFAR-10 (Krizhevsky, Nair & Hinton) states no licence; cite Krizhevsky 2009",
        source="CIFAR-10 python version (cifar-10-python.tar.gz from www.cs.toronto.edu/~kriz), "
               "train = data_batch_1..5, test = test_batch",
        bundled=False,
        n_train=50_000,
        n_test=10_000,
        dim=3072,
        preparation=_PIXELS,
    ),
    _Spec(
        name="california_housing",
        task="regression",
        files=(RemoteFile("cal_housing.data.xz",
                          "ccfafab957dc5ff54007c5ac1704c39e88cb75316ddbffc510849dbc71504182", None,
                          size=330_584),),
        parse=tabular.california_housing,
        description="California Housing (Pace & Barry 1997, StatLib cal_housing.data): 8 raw features, target "
                    "median house value; random 80/20 split (seed 0)",
        licence="StatLib (Pace & Barry 1997) states no licence",
        source="StatLib cal_housing.data via github.com/lapets/course-data-science@de59926, xz-compressed",
        bundled=False,
        n_train=16_512,
        n_test=4_128,
        dim=8,
        preparation=_CALIFORNIA,
    ),
    _Spec(
        name="gas_turbine",
        task="regression",
        files=tuple(RemoteFile(f"gt_{year}.csv.xz", digest, None, size=size) for year, digest, size in (
            (2011, "d15f7181ca41039588b3879988c51a86626fbfa6a1310c0963ed3567a9dd28e8", 172_452),
            (2012, "3b1c06b2f018f89ef3645ebafed844a1b667c0fde4a93b245d95ccd784b1f474", 178_336),
            (2013, "377c21b18f8cf8878de73090e4b578db9a5a3a25c1a5ce7cff06ae9aae689d63", 167_860),
            (2014, "3d8ea744332b84d0fcd531b634e564d6fae214c941a69c94c375c932366ba82a", 165_160),
            (2015, "3a32ba15827305fce9cf76f85b0bd3291b60441d23547287e113a6990d80c937", 173_716))),
        parse=tabular.gas_turbine,
        description="Gas Turbine CO and NOx Emission (UCI 551), 2011-2015: 9 features (AT, AP, AH, AFDP, GTEP, "
                    "TIT, TAT, TEY, CDP), target CO, NOx removed; random 80/20 split (seed 0)",
        licence="UCI Gas Turbine CO and NOx Emission is CC BY 4.0 (Kaya, Tüfekci & Uzun 2019)",
        source="gt_2011..2015.csv (header removed) via github.com/StudentDaNewb/SP-Assignment-5@6dff099, "
               "xz-compressed",
        bundled=False,
        n_train=29_386,
        n_test=7_347,
        dim=9,
        preparation=None,
    ),
    _Spec(
        name="blogfeedback",
        task="regression",
        files=(RemoteFile("BlogFeedback.zip",
                          "d802b5ad26e333ba0f8ad5ceb878f5b4a26ec19797a0284612f7795a601ce0b8", None,
                          size=2_583_739),),
        parse=tabular.blogfeedback,
        description="BlogFeedback (UCI, Buza 2014): train and the 60 test files stacked, 280 features, target "
                    "comments in the next 24 h; random 80/20 split (seed 0)",
        licence="UCI BlogFeedback is CC BY 4.0 (Buza 2014)",
        source="BlogFeedback.zip via github.com/Akshaya0909/enigma@b722038",
        bundled=False,
        n_train=48_016,
        n_test=12_005,
        dim=280,
        preparation=None,
    ),
    _Spec(
        name="kddcup99",
        task="multiclass",
        files=(RemoteFile("kddcup.data_10_percent.gz",
                          "8045aca0d84e70e622d1148d7df782496f6333bf6eb979a1b0837c42a9fd9561",
                          "http://kdd.ics.uci.edu/databases/kddcup99/kddcup.data_10_percent.gz",
                          size=2_144_903),),
        parse=tabular.kddcup99,
        description="KDD Cup 1999, 10 % subset: 38 numeric attributes + one-hot protocol_type, service, flag "
                    "(118 features); labels the 23 classes in sorted order; random 80/20 split (seed 0)",
        licence="UCI KDD Cup 1999 is CC BY 4.0",
        source="kddcup.data_10_percent.gz (sha256 = scikit-learn's) via github.com/Kapetis/ST2@65faff4",
        bundled=False,
        n_train=395_216,
        n_test=98_805,
        dim=118,
        preparation=None,
    ),
)
_REGISTRY = {spec.name: spec for spec in _SPECS}


def names() -> tuple[str, ...]:
    """Names of the registered data sets, sorted."""
    return tuple(sorted(_REGISTRY))


def default_data_dir() -> Path:
    """``$DPOPT_DATA`` if set, else ``<user cache dir>/dpopt/data``."""
    env = os.environ.get("DPOPT_DATA")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("dpopt")) / "data"


def info(name: str) -> dict[str, Any]:
    """Metadata of data set ``name``: task, files (size, sha256, content_sha256, url), licence, sizes."""
    spec = _spec(name)
    files = [{"name": f.name, "size": f.size, "sha256": f.sha256, "content_sha256": f.content_sha256, "url": f.url}
             for f in spec.files]
    return {"name": spec.name, "task": spec.task, "description": spec.description,
            "licence": spec.licence, "source": spec.source, "bundled": spec.bundled,
            "n_train": spec.n_train, "n_test": spec.n_test, "dim": spec.dim, "files": files,
            "preparation": None if spec.preparation is None else repr(spec.preparation)}


def preparation(name: str) -> Preparation | None:
    """How ``dpopt run`` prepares data set ``name`` for every model: from the public bounds its
    registration declares (:mod:`dpopt.data.bounds`), or None if it declares none."""
    return _spec(name).preparation


def load(name: str, data_dir: PathLike | None = None) -> Dataset:
    """Load data set ``name`` from ``data_dir`` (default :func:`default_data_dir`).

    On each call every file is checked (a regular file of its registered size, then its sha256)
    while it is copied into a private temporary directory, and the copies are parsed: what is
    parsed is exactly what was verified. Parsing is cached in-process by the files' digests. The
    returned arrays are fresh copies, so callers may modify them.
    """
    spec = _spec(name)
    paths = _locate(spec, _resolve(data_dir))
    with tempfile.TemporaryDirectory(prefix="dpopt-data-") as private:
        copies = [Path(private, file.name) for file in spec.files]
        digests = tuple(_verified_copy(path, file, spec, copy) for path, file, copy in zip(paths, spec.files, copies))
        X_train, y_train, X_test, y_test = _parse(spec, digests, copies)
    where = ", ".join(str(path) for path in paths)
    return Dataset(spec.name, spec.task, X_train.copy(), y_train.copy(), X_test.copy(), y_test.copy(),
                   f"{spec.source}; read from {where}")


def fetch(name: str, data_dir: PathLike | None = None, *,
          base_url: str | None = None) -> list[Path]:
    """Download the missing or corrupt files of ``name`` into ``<data_dir>/<name>/``.

    Each download goes to a temporary file in the same folder, is checked against its
    sha256 (or the sha256 of its decompressed content) and then renamed into place.
    ``base_url`` replaces the directory of the URLs (the file is fetched from
    ``<base_url>/<file name>``). Bundled data sets need no download: their bundled paths
    are returned.
    """
    spec = _spec(name)
    if spec.bundled:
        return [_BUNDLED_DIR / file.name for file in spec.files]
    folder = _resolve(data_dir) / spec.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or exc
        raise DataError(f"data_dir={str(folder.parent)!r} cannot be written ({reason}); "
                        "pass another --data-dir or set DPOPT_DATA") from None
    paths = []
    for file in spec.files:
        target = folder / file.name
        if not (target.exists() and _check(target, file)[1] is None):
            _download(_url(file, base_url, folder), target, file)
        paths.append(target)
    return paths


def _spec(name: str) -> _Spec:
    """The spec of ``name``, or a :class:`DataError` listing the known names."""
    if name not in _REGISTRY:
        raise DataError(f"dataset={name!r} must be one of: {', '.join(names())}")
    return _REGISTRY[name]


def _resolve(data_dir: PathLike | None) -> Path:
    """Absolute data dir: ``data_dir`` or the default one."""
    folder = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    return folder.resolve()


def _locate(spec: _Spec, data_dir: Path) -> list[Path]:
    """Paths of the files of ``spec``: the data dir first, then the bundled copy."""
    paths = []
    for file in spec.files:
        path = data_dir / spec.name / file.name
        if not path.exists() and spec.bundled:
            path = _BUNDLED_DIR / file.name
        if not path.exists():
            raise DataError(f"data file {path} is missing: run `dpopt data fetch {spec.name}` "
                            "or pass --data-dir/DPOPT_DATA")
        paths.append(path)
    return paths


def _verified_copy(path: Path, file: RemoteFile, spec: _Spec, copy: Path) -> str:
    """Copy ``path`` to ``copy`` as it is verified to be ``file``; its sha256, or a :class:`DataError`."""
    actual, problem = _check(path, file, copy)
    if problem is not None:
        fix = ("delete it to use the bundled copy" if spec.bundled
               else f"run `dpopt data fetch {spec.name}` to download it again")
        raise DataError(f"data file {path} is corrupt: {problem}; {fix}")
    return actual


def _check(path: Path, file: RemoteFile, copy: Path | None = None) -> tuple[str | None, str | None]:
    """The sha256 of the file at ``path`` (``None`` if its size already rules it out) and why it
    is not ``file`` (``None`` if it is); a :class:`DataError` if it is not a regular file.

    Its size is checked before a byte is read; with ``copy`` its bytes are written there as they
    are hashed, and a content check reads the copy, so ``copy`` holds exactly what was verified.
    """
    with _open_regular(path) as source:
        expected = os.fstat(source.fileno()).st_size
        if (problem := _size_problem(expected, file)) is not None:
            return None, problem
        with (open(copy, "xb") if copy is not None else contextlib.nullcontext()) as target:
            actual, size = _copy(source, target, file.max_size)
    if size != expected:
        return actual, f"its size changed from {expected:,} bytes while it was read"
    return actual, _mismatch(copy or path, file, actual)


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a FIFO is opened without waiting for a
    writer, then refused); a :class:`DataError` naming what it is otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DataError(f"data file {path} cannot be read ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
        kind = next((name for test, name in kinds if test(mode)), "not a file")
        raise DataError(f"data file {path} is {kind}, not a regular file: put the data file itself there")
    return os.fdopen(fd, "rb")


def _size_problem(size: int, file: RemoteFile) -> str | None:
    """Why a file of ``size`` bytes cannot be ``file`` (``None`` if it can)."""
    if size == file.size or (file.content_sha256 is not None and size <= file.max_size):
        return None
    if file.content_sha256 is None:
        return f"size {size:,} bytes != expected {file.size:,}"
    return f"size {size:,} bytes exceeds {file.max_size:,}, more than any compression of its content takes"


def _copy(source: IO[bytes], target: IO[bytes] | None, limit: int) -> tuple[str, int]:
    """Hex sha256 and length of ``source``, read to its end or to just past ``limit`` bytes,
    written to ``target`` (if any) as it is hashed."""
    digest, size = hashlib.sha256(), 0
    while size <= limit and (chunk := source.read(min(_CHUNK, limit + 1 - size))):
        digest.update(chunk)
        size += len(chunk)
        if target is not None:
            target.write(chunk)
    return digest.hexdigest(), size


def _mismatch(path: Path, file: RemoteFile, actual: str) -> str | None:
    """Why the file at ``path``, of sha256 ``actual``, is not ``file`` (``None`` if it is)."""
    if actual == file.sha256:
        return None
    if file.content_sha256 is None:
        return f"sha256 {actual} != expected {file.sha256}"
    suffix = Path(file.name).suffix
    try:
        with _DECOMPRESS.get(suffix, open)(path, "rb") as stream:
            content, size = _copy(stream, None, file.content_size)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        return f"its sha256 {actual} is not the known copy's and it cannot be decompressed ({exc})"
    if size > file.content_size:
        return f"it decompresses to more than the {file.content_size:,} bytes of the expected content"
    if content == file.content_sha256:
        return None
    return (f"sha256 of its decompressed content {content} != expected {file.content_sha256} "
            f"(and its sha256 {actual} is not the known copy's {file.sha256})")


#: Parsed data sets by (name, the sha256 of each file): the same bytes parse to the same arrays.
_PARSED: dict[tuple[str, tuple[str, ...]], Arrays] = {}
_PARSED_MAX = 4


def _parse(spec: _Spec, digests: tuple[str, ...], copies: Sequence[Path]) -> Arrays:
    """The arrays of the (verified) files ``copies`` of ``spec``, whose sha256s are ``digests``."""
    key = (spec.name, digests)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]  # the oldest
        _PARSED[key] = spec.parse(copies)
    return _PARSED[key]


def _url(file: RemoteFile, base_url: str | None, folder: Path) -> str:
    """Download URL of ``file``, under ``base_url`` if given; else an error saying where to copy it."""
    if base_url is not None:
        return f"{base_url.rstrip('/')}/{file.name}"
    if file.url is None:
        raise DataError(f"data file {file.name} has no download URL: copy it by hand to {folder / file.name} "
                        f"({file.size:,} bytes, sha256 {file.sha256}); the folder is <data dir>/{folder.name}, the "
                        "data dir --data-dir, else $DPOPT_DATA, else the user cache (in Python, "
                        "dpopt.data.fetch(..., base_url=URL) downloads it from a server of yours)")
    return file.url


def _download(url: str, target: Path, file: RemoteFile) -> None:
    """Download ``url`` to ``target`` atomically, keeping it only if it verifies as ``file``."""
    handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".part")
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            actual, size = _copy_url(url, out, target, file.max_size)
        too_large = f"more than {file.max_size:,} bytes (expected {file.size:,})" if size > file.max_size else None
        problem = too_large or _size_problem(size, file) or _mismatch(temp, file, actual)
        if problem is not None:
            raise DataError(f"download {url} is corrupt: {problem}; nothing was written to "
                            f"{target.parent}")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def _copy_url(url: str, out: IO[bytes], target: Path, limit: int) -> tuple[str, int]:
    """Stream ``url`` into ``out`` (at most just past ``limit`` bytes); the hex sha256 and length."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return _copy(response, out, limit)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DataError(f"download {url} failed ({exc}); check the network, "
                        f"or copy the file to {target} by hand") from None
