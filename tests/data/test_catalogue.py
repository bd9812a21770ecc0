"""The catalogue of data sets (``src/dpopt/data/catalogue.toml``): how a data set is added, and the
one-line errors that name the data set and the key of a wrong table.

How to add a data set: :func:`test_a_data_set_added_to_the_catalogue_loads_verified` does it. Put its
files in ``<data dir>/<name>/``, write a table like the toy one below into the catalogue (the
files' sha256 and size, the parser that reads them: a name of ``dpopt.data.parsers.PARSERS``; add
one there for a new format), and ``dpopt.data.load(name)`` checks every file against its pin and
parses it.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dpopt.data import DataError, fetch, load
from dpopt.data.bounds import AsGiven
from dpopt.data.catalogue import CATALOGUE, Catalogue, shipped
from dpopt.data.files import BUNDLED

ROOT = Path(__file__).resolve().parents[2]
TRAIN = "+1 1:0.5 3:1\n-1 2:0.25\n+1 1:1 2:-1 3:0.75\n"
TEST = "-1 3:-0.5\n+1 1:0.125 2:1\n"


def toy_table(files: dict[str, bytes], url: str | None = None) -> str:
    """The catalogue table of the toy data set whose files hold ``files``."""
    lines = ['[toy]', 'task = "binary"', 'description = "three features, five records"',
             'licence = "made up for this test"', 'source = "tests/data/test_catalogue.py"', "bundled = false",
             "n_train = 3", "n_test = 2", "dim = 3", 'parser = "libsvm"',
             'preparation = { as_given = "features already in [-1, 1]" }']
    for name, content in files.items():
        lines += ["", "[[toy.files]]", f'name = "{name}"', f'sha256 = "{hashlib.sha256(content).hexdigest()}"',
                  f"size = {len(content)}"] + ([f'url = "{url}/{name}"'] if url else [])
    return "\n".join(lines) + "\n"


def with_toy(tmp_path: Path, table: str) -> Path:
    """A copy of the package's catalogue with ``table`` added."""
    path = tmp_path / "catalogue.toml"
    path.write_text(CATALOGUE.read_text(encoding="utf-8") + "\n" + table, encoding="utf-8")
    return path


def test_a_data_set_added_to_the_catalogue_loads_verified(tmp_path):
    files = {"toy.train": TRAIN.encode(), "toy.test": TEST.encode()}
    data_dir = tmp_path / "data"
    (data_dir / "toy").mkdir(parents=True)
    for name, content in files.items():
        (data_dir / "toy" / name).write_bytes(content)
    catalogue = Catalogue.read(with_toy(tmp_path, toy_table(files)))
    assert catalogue.names() == (*shipped().names(), "toy")
    toy = load("toy", data_dir, catalogue=catalogue)
    assert (toy.name, toy.task, toy.n, toy.dim) == ("toy", "binary", 3, 3)
    assert np.array_equal(toy.X_train, [[0.5, 0, 1], [0, 0.25, 0], [1, -1, 0.75]])
    assert np.array_equal(toy.y_train, [1, -1, 1])
    assert np.array_equal(toy.X_test, [[0, 0, -0.5], [0.125, 1, 0]]) and np.array_equal(toy.y_test, [-1, 1])
    assert toy.source == f"tests/data/test_catalogue.py; read from {data_dir / 'toy' / 'toy.train'}, " \
                         f"{data_dir / 'toy' / 'toy.test'}"
    entry = catalogue.entry("toy")
    assert entry.preparation == AsGiven("features already in [-1, 1]")
    assert entry.info()["files"][1] == {"name": "toy.test", "size": len(TEST), "content_sha256": None, "url": None,
                                        "sha256": hashlib.sha256(TEST.encode()).hexdigest()}
    # The pin is checked: one changed byte (a record's label) and the file is refused.
    (data_dir / "toy" / "toy.test").write_bytes(TEST.replace("-1", "+1", 1).encode())
    with pytest.raises(DataError, match=rf"^data file .*toy.test is corrupt: sha256 [0-9a-f]{{64}} != expected "
                                        rf"{hashlib.sha256(TEST.encode()).hexdigest()}; run `dpopt data fetch toy` "
                                        "to download it again$"):
        load("toy", data_dir, catalogue=catalogue)


def test_a_data_set_added_with_urls_is_fetched_verified(server, tmp_path):
    files = {"toy.train": TRAIN.encode(), "toy.test": TEST.encode()}
    for name, content in files.items():
        (server.root / name).write_bytes(content)
    catalogue = Catalogue.read(with_toy(tmp_path, toy_table(files, server.url)))
    paths = fetch("toy", tmp_path / "data", catalogue=catalogue)
    assert [path.read_bytes() for path in paths] == list(files.values())
    assert load("toy", tmp_path / "data", catalogue=catalogue).n == 3
    assert server.requests == ["/toy.train", "/toy.test"]


@pytest.mark.parametrize(("change", "message"), [
    (('sha256 = "', 'sha256 = "0'), "toy.files[0].sha256 must be 64 lowercase hex digits, not '0TRAIN_SHA256'"),
    (('parser = "libsvm"', 'parser = "svmlight"'),
     ("toy.parser must be one of: blogfeedback, california_housing, cifar10, gas_turbine, kddcup99, libsvm, mnist, "
      "pima, not 'svmlight'")),
    (('task = "binary"', 'task = "ranking"'), "toy.task must be one of: binary, regression, multiclass, not 'ranking'"),
    (('n_test = 2', 'n_tests = 2'), "toy.n_test is missing"),
    (('dim = 3', 'dim = 3\nlicense = "MIT"'),
     ("toy.license is not a key of the catalogue: use task, description, licence, source, bundled, n_train, n_test, "
      "dim, parser, files, preparation")),
    (('size = 42', 'size = -30'), "toy.files[0].size must be an integer >= 0, not -30"),
    (('name = "toy.test"', 'name = "../toy.test"'),
     "toy.files[1].name must be a file name without a folder, not '../toy.test'"),
    (("size = 42", 'size = 42\ncontent_sha256 = "' + "0" * 64 + '"'),
     "toy.files[0] must give content_sha256 and content_size together, or neither"),
    (('preparation = { as_given = "features already in [-1, 1]" }',
      'preparation = { features = [[0, 1], [0, 1]], source = "made up" }'),
     "toy.preparation.features must be an array of 3 [low, high] pairs (one per feature)"),
    (('preparation = { as_given = "features already in [-1, 1]" }',
      'preparation = { features = [[0, 1], [0, 1], [1, 0]], source = "made up" }'),
     "toy.preparation.features[2] must be finite with low < high, not [1, 0]"),
    (('preparation = { as_given = "features already in [-1, 1]" }',
      'preparation = { features = [[0, 1], [0, 1], [0, 1]], target = [0, 9], source = "made up" }'),
     "toy.preparation.target must be given for a regression task and only then (task is 'binary')"),
])
def test_a_wrong_table_is_refused_in_one_line_naming_the_data_set_and_key(tmp_path, change, message):
    table = toy_table({"toy.train": TRAIN.encode(), "toy.test": TEST.encode()})
    assert change[0] in table
    path = with_toy(tmp_path, table.replace(*change, 1))
    with pytest.raises(DataError) as error:
        Catalogue.read(path)
    message = message.replace("TRAIN_SHA256", hashlib.sha256(TRAIN.encode()).hexdigest())
    assert str(error.value) == f"catalogue {path}: {message}"


def test_a_file_that_is_not_toml_is_refused(tmp_path):
    path = with_toy(tmp_path, "[toy\n")
    with pytest.raises(DataError, match=rf"^catalogue {re.escape(str(path))} is not a readable TOML file: "):
        Catalogue.read(path)


def test_the_bundled_files_ship_with_their_catalogued_sizes_and_the_catalogue_ships_too():
    bundled = [(entry.name, file) for entry in shipped().entries.values() if entry.bundled for file in entry.files]
    assert [name for name, _ in bundled] == ["adult", "adult"]
    for _, file in bundled:
        content = (BUNDLED / file.name).read_bytes()
        assert (len(content), hashlib.sha256(content).hexdigest()) == (file.size, file.sha256)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "catalogue.toml" in package_data["dpopt.data"]
