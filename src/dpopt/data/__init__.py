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
"""

from dpopt.data.idx import read_idx
from dpopt.data.registry import (
    DataError,
    Dataset,
    default_data_dir,
    fetch,
    info,
    load,
    names,
    preparation,
)
from dpopt.data.synthetic import NOISES, SYNTHETIC_TASKS, heavy_tailed

__all__ = ["DataError", "Dataset", "NOISES", "SYNTHETIC_TASKS", "default_data_dir", "fetch",
           "heavy_tailed", "info", "load", "names", "preparation", "read_idx"]
