"""Reader for the official "CIFAR-10 python version" archive ``cifar-10-python.tar.gz``.

The archive (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html) holds the folder
``cifar-10-batches-py/`` with five training batches ``data_batch_1`` … ``data_batch_5`` and one
``test_batch`` of 10,000 images each (plus ``batches.meta`` and ``readme.html``, not read here).
Each batch is a pickle (written by Python 2's cPickle) of a dict with the byte-string keys
``b"data"`` (a ``uint8 [10000, 3072]`` numpy array, one image per row, **channel-major**: the
1024 red pixels, then the 1024 green, then the 1024 blue, each channel row-major 32×32),
``b"labels"`` (a list of ints 0-9), ``b"batch_label"`` and ``b"filenames"``.

:func:`read_cifar10` returns ``X [n, 3072]`` float64 pixel / 255 in [0, 1], rows kept in that
channel-major layout (a model reshapes a row to ``[3, 32, 32]``, as ``nn.Unflatten(1, (3, 32,
32))`` does), and ``y [n]`` the labels as float64 0.0 … 9.0 (0 airplane, 1 automobile, 2 bird,
3 cat, 4 deer, 5 dog, 6 frog, 7 horse, 8 ship, 9 truck). The archive is read in place (members
are streamed, nothing is extracted to disk).

.. warning::
   **Unpickling can run arbitrary code.** Only pass files whose sha256 was verified first:
   :func:`dpopt.data.load` checks the archive against its pinned sha256 before it calls this
   parser. As a second line of defence the batches are read with a restricted unpickler that
   resolves only the globals a numpy array needs (``numpy.core.multiarray._reconstruct``, also
   spelled ``numpy._core.multiarray._reconstruct`` by numpy 2, ``numpy.ndarray`` and
   ``numpy.dtype``); any other global (``os.system``, ``builtins.eval``, …) raises
   :class:`DataError` before anything is called.
"""

from __future__ import annotations

import os
import pickle
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from dpopt.data.dataset import DataError

try:  # numpy >= 2 (and the forward-compatibility alias of late numpy 1.x)
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x without numpy._core
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

__all__ = ["FOLDER", "TEST_MEMBER", "TRAIN_MEMBERS", "read_cifar10"]

FOLDER = "cifar-10-batches-py"
TRAIN_MEMBERS = tuple(f"{FOLDER}/data_batch_{k}" for k in range(1, 6))
TEST_MEMBER = f"{FOLDER}/test_batch"
PIXELS = 3 * 32 * 32  # one row: R (1024), G (1024), B (1024), each 32x32 row-major
CLASSES = 10

# The only globals a batch pickle refers to: the three needed to rebuild its numpy array
# (numpy 1.x writes ``numpy.core.multiarray``, numpy 2 ``numpy._core.multiarray``).
_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., object]] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that resolves only :data:`_ALLOWED_GLOBALS` and refuses every other global."""

    def __init__(self, stream: IO[bytes], where: str) -> None:
        super().__init__(stream, encoding="bytes")
        self.where = where

    def find_class(self, module: str, name: str) -> Callable[..., object]:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = ", ".join(f"{m}.{n}" for m, n in _ALLOWED_GLOBALS)
            raise DataError(f"{self.where} refers to the global {module}.{name}, which is refused: a "
                            f"CIFAR-10 batch may only use {allowed}") from None


def read_cifar10(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)`` from ``cifar-10-python.tar.gz`` at ``path``.

    ``X`` is float64 pixel / 255 in [0, 1], one image per row in the files' channel-major
    layout ``[R(1024) G(1024) B(1024)]`` (reshape a row to ``[3, 32, 32]``); ``y`` float64 class
    indices 0.0 … 9.0. Training rows are ``data_batch_1`` … ``data_batch_5`` in order.

    **Call it only on an archive whose sha256 was verified** (:func:`dpopt.data.load` does so
    before parsing): batches are pickles. The restricted unpickler refuses any global other than
    those of a numpy array. A missing member, a pickle that refers to another global, or a
    batch that is not a dict of uint8 ``[n, 3072]`` data and n labels 0-9 raises
    :class:`DataError` naming the archive and the member.
    """
    path = Path(path)
    wanted = (*TRAIN_MEMBERS, TEST_MEMBER)
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:  # one pass over the compressed stream
                if member.name not in wanted:
                    continue
                where = f"member {member.name} of {path}"
                if member.name in batches:
                    raise DataError(f"{where} appears twice in the archive")
                stream = archive.extractfile(member) if member.isfile() else None
                if stream is None:
                    raise DataError(f"{where} must be a regular file")
                with stream:
                    batches[member.name] = _read_batch(stream, where)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        raise DataError(f"file {path} is not a readable tar.gz archive ({exc})") from None
    missing = [name for name in wanted if name not in batches]
    if missing:
        raise DataError(f"file {path} must be the CIFAR-10 python archive, but it has no member "
                        f"{', '.join(missing)}")
    X_train, y_train = _stack([batches[name] for name in TRAIN_MEMBERS])
    X_test, y_test = _stack([batches[TEST_MEMBER]])
    return X_train, y_train, X_test, y_test


def _read_batch(stream: IO[bytes], where: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``uint8 [n, 3072]`` images and ``uint8 [n]`` labels of one batch pickle."""
    try:
        batch = _BatchUnpickler(stream, where).load()
    except DataError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError, UnicodeDecodeError) as exc:
        raise DataError(f"{where} is not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{where} must be a dict with keys b'data' and b'labels', not {keys}")
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != PIXELS:
        what = f"{data.dtype} of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{where} must hold b'data' as a uint8 array [n, {PIXELS}], not {what}")
    if not isinstance(labels, list) or not all(type(label) is int for label in labels):
        raise DataError(f"{where} must hold b'labels' as a list of ints")
    y = np.array(labels, dtype=np.int64)
    if y.shape != data.shape[:1] or not ((y >= 0) & (y < CLASSES)).all():
        raise DataError(f"{where} must hold one label 0-{CLASSES - 1} per image ({len(data)}), "
                        f"not {len(y)} labels in [{y.min(initial=0)}, {y.max(initial=0)}]")
    return data, y.astype(np.uint8)


def _stack(batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Batches one after another: float64 ``X`` (pixel / 255) and ``y``."""
    X = np.concatenate([data for data, _ in batches]).astype(np.float64)
    X /= 255.0
    return X, np.concatenate([labels for _, labels in batches]).astype(np.float64)
