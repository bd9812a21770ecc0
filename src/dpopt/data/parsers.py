"""The parsers a catalogue entry names (``parser = "..."`` in ``catalogue.toml``): :data:`PARSERS`.

A parser turns the verified files of a data set, in the order the catalogue lists them, into its
split's arrays ``X_train, y_train, X_test, y_test`` (:data:`~dpopt.data.dataset.Arrays`; labels as
:class:`~dpopt.data.dataset.Dataset` wants them). It also receives the number of features the
catalogue declares, which a LIBSVM file does not state; the other formats fix their own width.
The readers of the formats are :mod:`~dpopt.data.libsvm`, :mod:`~dpopt.data.idx`,
:mod:`~dpopt.data.cifar` and :mod:`~dpopt.data.tabular`; this module adapts them to data sets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from dpopt.data import tabular
from dpopt.data.cifar import read_cifar10
from dpopt.data.dataset import Arrays, DataError
from dpopt.data.idx import read_idx
from dpopt.data.libsvm import read_libsvm

__all__ = ["PARSERS", "Parser", "cifar10", "libsvm_pair", "mnist", "pima"]

#: The files of a data set (catalogue order) and its declared number of features → its arrays.
Parser = Callable[[Sequence[Path], int], Arrays]


def libsvm_pair(paths: Sequence[Path], n_features: int) -> Arrays:
    """A (train, test) pair of LIBSVM files with ``n_features`` features."""
    train, test = paths
    return (*read_libsvm(train, n_features), *read_libsvm(test, n_features))


def mnist(paths: Sequence[Path]) -> Arrays:
    """MNIST's train images, train labels, test images and test labels (IDX files)."""
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


def cifar10(paths: Sequence[Path]) -> Arrays:
    """``cifar-10-python.tar.gz`` (:func:`dpopt.data.cifar.read_cifar10`). Its batches are pickles:
    it only runs after :func:`dpopt.data.load` verified the archive's sha256."""
    (archive,) = paths
    return read_cifar10(archive)


_PIMA_HEADER = "pregnant,glucose,pressure,triceps,insulin,mass,pedigree,age,diabetes"
_PIMA_TRAIN = 500  # the AClip paper: "768 samples, where we select 500 samples for training"


def pima(paths: Sequence[Path]) -> Arrays:
    """The Pima Indians Diabetes CSV (header line, 768 rows of 8 features + label).

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


def _own_width(parse: Callable[[Sequence[Path]], Arrays]) -> Parser:
    """``parse`` as a :data:`Parser`: its format fixes the number of features itself."""
    return lambda paths, n_features: parse(paths)


#: Parser name (the catalogue's ``parser`` key) → parser.
PARSERS: Mapping[str, Parser] = {
    "libsvm": libsvm_pair,
    "mnist": _own_width(mnist),
    "cifar10": _own_width(cifar10),
    "pima": _own_width(pima),
    "california_housing": _own_width(tabular.california_housing),
    "gas_turbine": _own_width(tabular.gas_turbine),
    "blogfeedback": _own_width(tabular.blogfeedback),
    "kddcup99": _own_width(tabular.kddcup99),
}
