"""Registry of the real data sets: where their files come from, how to check, fetch and load them.

Every data file is pinned by its sha256, which is checked on every :func:`load` and on
every download. Files live in ``<data dir>/<data set>/``; the data dir is ``data_dir`` if
given, else :func:`default_data_dir`. Data sets marked ``bundled`` ship inside the
package and load without any data dir (a copy in the data dir is used first).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import platformdirs

from dpopt._validate import DpoptError, one_of
from dpopt.data.libsvm import DataError, read_libsvm

__all__ = ["DataError", "Dataset", "RemoteFile", "default_data_dir", "fetch", "info", "load",
           "names"]

TASKS = ("binary", "regression")
_BUNDLED_DIR = Path(__file__).with_name("bundled")
_CHUNK = 1 << 20
_TICK_COMMIT = "9d959b6e53e17145e93e9849ff1f9f6d2de8ae51"
_TICK_IJCNN1 = ("https://raw.githubusercontent.com/X-DataInitiative/tick-datasets/"
                f"{_TICK_COMMIT}/binary/ijcnn1/")

PathLike = str | os.PathLike[str]
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split in memory: dense float64 features and labels.

    Binary labels are -1.0/+1.0. ``source`` is one line saying where the files came from.
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
        """Test error of always predicting the training majority class (ties predict -1)."""
        if self.task != "binary":
            raise DpoptError(f"task={self.task!r} must be 'binary' for majority_error()")
        majority = 1.0 if np.count_nonzero(self.y_train == 1.0) * 2 > self.n else -1.0
        return float(np.mean(self.y_test != majority))


def _check_split(split: str, X: np.ndarray, y: np.ndarray, task: str) -> None:
    """``X`` is 2-D, ``y`` 1-D with one label per row, binary labels in {-1, +1}."""
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise DpoptError(f"X_{split}.shape={X.shape} and y_{split}.shape={y.shape} "
                         "must be (n, d) and (n,)")
    if task == "binary" and not np.isin(y, (-1.0, 1.0)).all():
        raise DpoptError(f"y_{split} must hold only -1.0 and +1.0 for task='binary'")


@dataclass(frozen=True)
class RemoteFile:
    """One data file: its name inside the data set folder, its sha256 and its download URL."""

    name: str
    sha256: str
    url: str | None


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


def _libsvm_split(n_features: int) -> Callable[[Sequence[Path]], Arrays]:
    """Parser of a (train, test) pair of binary LIBSVM files with ``n_features`` features."""

    def parse(paths: Sequence[Path]) -> Arrays:
        train, test = paths
        return (*read_libsvm(train, n_features), *read_libsvm(test, n_features))

    return parse


_SPECS = (
    _Spec(
        name="adult",
        task="binary",
        files=(
            RemoteFile("a9a.bz2",
                       "1dcb2b4aedea0b5a9e964192dd211675d16cf05ab6477ddd0702d87c1d1af8da", None),
            RemoteFile("a9a.t.bz2",
                       "e55725b53c3c47f7053bd3ef12e41555539eac4c0fe989e69345cc4dd0ea6e8d", None),
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
    ),
    _Spec(
        name="ijcnn1",
        task="binary",
        files=(
            RemoteFile("ijcnn1.trn.bz2",
                       "b38a4198ce142d43e96fb86d17b87211feec1f909ac344fa057455c69de29de3",
                       _TICK_IJCNN1 + "ijcnn1.trn.bz2"),
            RemoteFile("ijcnn1.tst.bz2",
                       "acd1db430684fdd3f0c768ecc49aa8e749d0004fc117611220c2aa576a7b6a24",
                       _TICK_IJCNN1 + "ijcnn1.tst.bz2"),
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
    """Metadata of data set ``name``: task, files (sha256, url), licence, sizes."""
    spec = _spec(name)
    files = [{"name": f.name, "sha256": f.sha256, "url": f.url} for f in spec.files]
    return {"name": spec.name, "task": spec.task, "description": spec.description,
            "licence": spec.licence, "source": spec.source, "bundled": spec.bundled,
            "n_train": spec.n_train, "n_test": spec.n_test, "dim": spec.dim, "files": files}


def load(name: str, data_dir: PathLike | None = None) -> Dataset:
    """Load data set ``name`` from ``data_dir`` (default :func:`default_data_dir`).

    Every file's sha256 is checked on each call; parsing is cached in-process. The returned
    arrays are fresh copies, so callers may modify them.
    """
    spec = _spec(name)
    paths = tuple(_locate(spec, _resolve(data_dir)))
    for path, file in zip(paths, spec.files):
        _verify(path, file, spec)
    cached = _parse(spec.name, paths)
    return Dataset(cached.name, cached.task, cached.X_train.copy(), cached.y_train.copy(),
                   cached.X_test.copy(), cached.y_test.copy(), cached.source)


def fetch(name: str, data_dir: PathLike | None = None, *,
          base_url: str | None = None) -> list[Path]:
    """Download the missing or corrupt files of ``name`` into ``<data_dir>/<name>/``.

    Each download goes to a temporary file in the same folder, is checked against its
    sha256 and then renamed into place. ``base_url`` replaces the directory of the URLs
    (the file is fetched from ``<base_url>/<file name>``). Bundled data sets need no
    download: their bundled paths are returned.
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
        if not (target.is_file() and _sha256(target) == file.sha256):
            _download(_url(file, base_url), target, file.sha256)
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
        if not path.is_file() and spec.bundled:
            path = _BUNDLED_DIR / file.name
        if not path.is_file():
            raise DataError(f"data file {path} is missing: run `dpopt data fetch {spec.name}` "
                            "or pass --data-dir/DPOPT_DATA")
        paths.append(path)
    return paths


def _verify(path: Path, file: RemoteFile, spec: _Spec) -> None:
    """Raise :class:`DataError` unless ``path`` has the sha256 of ``file``."""
    actual = _sha256(path)
    if actual != file.sha256:
        fix = ("delete it to use the bundled copy" if spec.bundled
               else f"run `dpopt data fetch {spec.name}` to download it again")
        raise DataError(f"data file {path} is corrupt: sha256 {actual} != expected "
                        f"{file.sha256}; {fix}")


def _sha256(path: Path) -> str:
    """Hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def _parse(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Parse the (already verified) files of data set ``name``; cached per file paths."""
    spec = _REGISTRY[name]
    X_train, y_train, X_test, y_test = spec.parse(paths)
    where = ", ".join(str(path) for path in paths)
    return Dataset(spec.name, spec.task, X_train, y_train, X_test, y_test,
                   f"{spec.source}; read from {where}")


def _url(file: RemoteFile, base_url: str | None) -> str:
    """Download URL of ``file``, under ``base_url`` if given."""
    if base_url is not None:
        return f"{base_url.rstrip('/')}/{file.name}"
    if file.url is None:
        raise DataError(f"data file {file.name} has no download URL: pass base_url")
    return file.url


def _download(url: str, target: Path, expected: str) -> None:
    """Download ``url`` to ``target`` atomically, keeping it only if its sha256 is ``expected``."""
    handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".part")
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            actual = _copy_url(url, out, target)
        if actual != expected:
            raise DataError(f"download {url} is corrupt: sha256 {actual} != expected "
                            f"{expected}; nothing was written to {target.parent}")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def _copy_url(url: str, out: IO[bytes], target: Path) -> str:
    """Stream ``url`` into ``out``; return the hex sha256 of the bytes."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DataError(f"download {url} failed ({exc}); check the network, "
                        f"or copy the file to {target} by hand") from None
    return digest.hexdigest()
