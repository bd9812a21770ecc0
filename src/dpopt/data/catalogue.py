"""The catalogue of data sets: ``catalogue.toml`` beside this module, read into typed entries.

Each entry says everything known about a data set before its files are read: its task, sizes and
number of features, its files (name, size and sha256, a download URL), the parser that reads them
(:data:`dpopt.data.parsers.PARSERS`), its licence and provenance, and the public preparation
``dpopt run`` applies to it (:mod:`dpopt.data.bounds`). The file's header lists the keys. The file
is checked as it is read: a wrong or missing key is a one-line :class:`DataError` naming the data
set and the key (``catalogue …: adult.files[0].sha256 must be …``).

:func:`shipped` is the package's catalogue; :func:`names`, :func:`info` and :func:`preparation`
read it. Another catalogue (:meth:`Catalogue.read`) can be given to :func:`dpopt.data.load` and
:func:`dpopt.data.fetch`.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TypeGuard, TypedDict

from dpopt._validate import DpoptError
from dpopt.data.bounds import AsGiven, Preparation, PublicBounds, Range
from dpopt.data.dataset import TASKS, Arrays, DataError
from dpopt.data.parsers import PARSERS

__all__ = ["CATALOGUE", "Catalogue", "Entry", "RemoteFile", "info", "names", "preparation", "shipped"]

#: The package's catalogue file.
CATALOGUE = Path(__file__).with_name("catalogue.toml")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = ("task", "description", "licence", "source", "bundled", "n_train", "n_test", "dim", "parser", "files")
_FILE_KEYS = ("name", "sha256", "size")
_OPTIONAL_FILE_KEYS = ("url", "content_sha256", "content_size")
_BOUNDS_KEYS = ("features", "target", "row_norm", "source")


class FileInfo(TypedDict):
    """A file of a data set: its name, size in bytes, sha256 (of the file and of its content) and URL."""

    name: str
    size: int
    sha256: str
    content_sha256: str | None
    url: str | None


class DatasetInfo(TypedDict):
    """A data set's metadata as ``dpopt data info`` shows it."""

    name: str
    task: str
    description: str
    licence: str
    source: str
    bundled: bool
    n_train: int
    n_test: int
    dim: int
    files: list[FileInfo]
    preparation: str | None


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
class Entry:
    """Everything known about one data set before reading it (one table of the catalogue)."""

    name: str
    task: str
    files: tuple[RemoteFile, ...]
    #: A name of :data:`~dpopt.data.parsers.PARSERS`.
    parser: str
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

    def parse(self, paths: Sequence[Path]) -> Arrays:
        """The arrays of its (verified) files ``paths``, in catalogue order."""
        return PARSERS[self.parser](paths, self.dim)

    def info(self) -> DatasetInfo:
        """Its metadata: task, files (size, sha256, content_sha256, url), licence, sizes, preparation."""
        files = [FileInfo(name=f.name, size=f.size, sha256=f.sha256, content_sha256=f.content_sha256, url=f.url)
                 for f in self.files]
        return {"name": self.name, "task": self.task, "description": self.description,
                "licence": self.licence, "source": self.source, "bundled": self.bundled,
                "n_train": self.n_train, "n_test": self.n_test, "dim": self.dim, "files": files,
                "preparation": None if self.preparation is None else repr(self.preparation)}


@dataclass(frozen=True)
class Catalogue:
    """Data sets by name."""

    entries: Mapping[str, Entry]

    @classmethod
    def read(cls, path: str | Path) -> Catalogue:
        """The catalogue file ``path``, checked (a :class:`DataError` naming the data set and key)."""
        try:
            tables = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            return cls({name: _entry(name, table) for name, table in tables.items()})
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise DataError(f"catalogue {path} is not a readable TOML file: {err}") from None
        except DataError as err:
            raise DataError(f"catalogue {path}: {err}") from None

    def names(self) -> tuple[str, ...]:
        """Names of its data sets, sorted."""
        return tuple(sorted(self.entries))

    def entry(self, name: str) -> Entry:
        """The entry of ``name``, or a :class:`DataError` listing the known names."""
        if name not in self.entries:
            raise DataError(f"dataset={name!r} must be one of: {', '.join(self.names())}")
        return self.entries[name]


@functools.cache
def shipped() -> Catalogue:
    """The package's catalogue (:data:`CATALOGUE`), read once."""
    return Catalogue.read(CATALOGUE)


def names() -> tuple[str, ...]:
    """Names of the catalogued data sets, sorted."""
    return shipped().names()


def info(name: str) -> DatasetInfo:
    """Metadata of data set ``name``: task, files (size, sha256, content_sha256, url), licence, sizes."""
    return shipped().entry(name).info()


def preparation(name: str) -> Preparation | None:
    """How ``dpopt run`` prepares data set ``name`` for every model: from the public bounds its
    catalogue entry declares (:mod:`dpopt.data.bounds`), or None if it declares none."""
    return shipped().entry(name).preparation


# ------------------------------------------------------------------------------ reading and checking


def _entry(name: str, value: object) -> Entry:
    """The entry ``name`` of the catalogue from its TOML table."""
    table = _keys(name, value, required=_ENTRY_KEYS, optional=("preparation",))
    task, parser, bundled = table["task"], table["parser"], table["bundled"]
    if not (isinstance(task, str) and task in TASKS):
        raise DataError(f"{name}.task must be one of: {', '.join(TASKS)}, not {task!r}")
    if not isinstance(bundled, bool):
        raise DataError(f"{name}.bundled must be true or false, not {bundled!r}")
    if not (isinstance(parser, str) and parser in PARSERS):
        raise DataError(f"{name}.parser must be one of: {', '.join(sorted(PARSERS))}, not {parser!r}")
    files = table["files"]
    if not (isinstance(files, list) and files):
        raise DataError(f"{name}.files must be a non-empty array of tables ([[{name}.files]])")
    remote = tuple(_file(f"{name}.files[{i}]", file) for i, file in enumerate(files))
    if len({file.name for file in remote}) != len(remote):
        raise DataError(f"{name}.files must have distinct names")
    dim = _count(f"{name}.dim", table["dim"], minimum=1)
    prepared = _preparation(f"{name}.preparation", table["preparation"], task, dim) if "preparation" in table \
        else None
    return Entry(name=name, task=task, files=remote, parser=parser,
                 description=_text(f"{name}.description", table["description"]),
                 licence=_text(f"{name}.licence", table["licence"]), source=_text(f"{name}.source", table["source"]),
                 bundled=bundled, n_train=_count(f"{name}.n_train", table["n_train"], minimum=1),
                 n_test=_count(f"{name}.n_test", table["n_test"], minimum=1), dim=dim, preparation=prepared)


def _file(where: str, value: object) -> RemoteFile:
    """A :class:`RemoteFile` from its table ``where``."""
    table = _keys(where, value, required=_FILE_KEYS, optional=_OPTIONAL_FILE_KEYS)
    name = _text(f"{where}.name", table["name"])
    if Path(name).name != name or name in (".", ".."):
        raise DataError(f"{where}.name must be a file name without a folder, not {name!r}")
    url = _text(f"{where}.url", table["url"]) if "url" in table else None
    if ("content_sha256" in table) != ("content_size" in table):
        raise DataError(f"{where} must give content_sha256 and content_size together, or neither")
    content_sha256 = _sha256(f"{where}.content_sha256", table["content_sha256"]) if "content_sha256" in table else None
    content_size = _count(f"{where}.content_size", table["content_size"], minimum=0) if "content_size" in table \
        else None
    return RemoteFile(name, _sha256(f"{where}.sha256", table["sha256"]), url, content_sha256,
                      size=_count(f"{where}.size", table["size"], minimum=0), content_size=content_size)


def _preparation(where: str, value: object, task: str, dim: int) -> Preparation:
    """:class:`AsGiven` (``as_given = "reason"``) or :class:`PublicBounds` from the table ``where``."""
    if isinstance(value, dict) and "as_given" in value:
        given = _keys(where, value, required=("as_given",), optional=())
        return AsGiven(_text(f"{where}.as_given", given["as_given"]))
    table = _keys(where, value, required=("features", "source"), optional=("target", "row_norm"))
    features = table["features"]
    if not (isinstance(features, list) and len(features) == dim):
        raise DataError(f"{where}.features must be an array of {dim} [low, high] pairs (one per feature)")
    ranges = tuple(_range(f"{where}.features[{j}]", pair) for j, pair in enumerate(features))
    if ("target" in table) != (task == "regression"):
        raise DataError(f"{where}.target must be given for a regression task and only then (task is {task!r})")
    target = _range(f"{where}.target", table["target"]) if "target" in table else None
    row_norm = table.get("row_norm")
    if row_norm is not None and not (_is_number(row_norm) and math.isfinite(row_norm) and row_norm > 0):
        raise DataError(f"{where}.row_norm must be a finite number > 0, not {row_norm!r}")
    return PublicBounds(features=ranges, target=target, row_norm=row_norm,
                        source=_text(f"{where}.source", table["source"]))


def _keys(where: str, table: object, *, required: Sequence[str], optional: Sequence[str]) -> dict[str, object]:
    """``table``, a table with every ``required`` key and no key beyond ``optional``."""
    if not isinstance(table, dict):
        raise DataError(f"{where} must be a table, not {table!r}")
    if missing := [key for key in required if key not in table]:
        raise DataError(f"{where}.{missing[0]} is missing")
    if unknown := sorted(set(table) - {*required, *optional}):
        raise DataError(f"{where}.{unknown[0]} is not a key of the catalogue: "
                        f"use {', '.join([*required, *optional])}")
    return table


def _text(where: str, value: object) -> str:
    if not (isinstance(value, str) and value.strip()):
        raise DataError(f"{where} must be a non-empty string, not {value!r}")
    return value


def _count(where: str, value: object, *, minimum: int) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        raise DataError(f"{where} must be an integer >= {minimum}, not {value!r}")
    return value


def _sha256(where: str, value: object) -> str:
    if not (isinstance(value, str) and _SHA256.fullmatch(value)):
        raise DataError(f"{where} must be 64 lowercase hex digits, not {value!r}")
    return value


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _range(where: str, pair: object) -> Range:
    """A :class:`Range` from ``[low, high]``; its numbers kept as written (integers stay integers)."""
    low, high = pair if isinstance(pair, list) and len(pair) == 2 else (None, None)
    if not (_is_number(low) and _is_number(high)):
        raise DataError(f"{where} must be a pair [low, high] of numbers, not {pair!r}")
    try:
        return Range(low, high)
    except DpoptError:
        raise DataError(f"{where} must be finite with low < high, not {pair!r}") from None
