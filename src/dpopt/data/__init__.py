"""Real data sets, pinned by sha256, loaded as dense float64 train/test splits.

>>> from dpopt import data
>>> data.names()
('adult', 'blogfeedback', 'california_housing', 'cifar10', 'diabetes', 'gas_turbine', 'ijcnn1', 'kddcup99', 'mnist')
>>> ds = data.load("adult")          # bundled with the package: works offline
>>> ds.X_train.shape, ds.X_test.shape
((32561, 123), (16281, 123))

Other data sets are downloaded once with :func:`fetch` (CLI: ``dpopt data fetch ijcnn1``)
into :func:`default_data_dir` (``$DPOPT_DATA`` or the user cache dir) or ``data_dir``.
Every problem (unknown name, missing or corrupt file, malformed line) raises
:class:`DataError` with a one-line message saying what to do.

The package, one job per module: :mod:`~dpopt.data.dataset` (the :class:`Dataset` type),
:mod:`~dpopt.data.catalogue` (the data sets, declared in ``catalogue.toml``),
:mod:`~dpopt.data.parsers` (the parsers it names, over the format readers
:mod:`~dpopt.data.libsvm`, :mod:`~dpopt.data.idx`, :mod:`~dpopt.data.cifar`, :mod:`~dpopt.data.tabular`),
:mod:`~dpopt.data.files` (locating, verifying and downloading files), :mod:`~dpopt.data.loader`
(:func:`load`), :mod:`~dpopt.data.bounds` (preparation from public bounds), :mod:`~dpopt.data.own`
(a user's own file) and :mod:`~dpopt.data.synthetic`.
"""

from dpopt.data.catalogue import info, names, preparation
from dpopt.data.dataset import DataError, Dataset
from dpopt.data.files import default_data_dir, fetch
from dpopt.data.idx import read_idx
from dpopt.data.loader import load
from dpopt.data.synthetic import NOISES, SYNTHETIC_TASKS, heavy_tailed

__all__ = ["NOISES", "SYNTHETIC_TASKS", "DataError", "Dataset", "default_data_dir", "fetch", "heavy_tailed", "info",
           "load", "names", "preparation", "read_idx"]
