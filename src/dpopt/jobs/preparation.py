"""How a problem's data are prepared, declared as a value before any data is read.

Every bench problem (:func:`dpopt.bench.tasks.preparation`) and every preset problem
(:attr:`dpopt.experiments.preset.Experiment.preparation`) names one of:

* :class:`~dpopt.data.bounds.PublicBounds`: each record mapped with public ranges only (those a
  registered data set declares: :func:`registered`);
* :class:`~dpopt.data.bounds.AsGiven`: nothing to do: the features already lie in a public range,
  or the data are synthetic, drawn from a public distribution (:data:`SYNTHETIC`);
* :class:`NotPrivate`: a named preparation that reads statistics of the data without noise, as a
  paper does (e.g. standardising with the training split's mean and std). One record then moves
  every other prepared record: no sensitivity holds, so no ε of a run on such data is a
  guarantee. Only a reproduction of a paper may declare one; every output that shows its results
  labels it (:func:`described`), and the bench refuses it.

The first two prepare each record on its own, with public numbers: neighbouring data sets stay
neighbouring and the preparation costs no privacy. A test walks every declared problem and checks
that of each preparation not labelled NOT PRIVATE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import data
from .._validate import DpoptError
from ..data.bounds import AsGiven, Preparation, PublicBounds

if TYPE_CHECKING:
    from ..data import Dataset

#: Synthetic data: drawn from a public distribution with a fixed seed, nothing computed from them.
SYNTHETIC = AsGiven("synthetic data drawn from a public distribution with a fixed seed")
#: How every output labels a :class:`NotPrivate` preparation.
LABEL = "NOT PRIVATE data preparation"


@dataclass(frozen=True)
class NotPrivate:
    """``apply``, a preparation that computes statistics of the data without noise; ``name`` says
    what it computes (and whose choice it is, e.g. a paper's)."""

    name: str
    apply: Callable[[Dataset], Dataset] = field(repr=False, compare=False)

    def prepare(self, dataset: Dataset) -> Dataset:
        return self.apply(dataset)


def registered(dataset: str) -> Preparation:
    """The public preparation the registered ``dataset`` declares (:func:`dpopt.data.preparation`);
    an error if it declares none."""
    declared = data.preparation(dataset)
    if declared is None:
        raise DpoptError(f"dataset={dataset!r} declares no public bounds of its features (`dpopt data info "
                         f"{dataset}`): a problem prepares its data from public bounds")
    return declared


def is_public(preparation: Preparation) -> bool:
    """Whether ``preparation`` is one of the public kinds (every record on its own, public numbers)."""
    return isinstance(preparation, PublicBounds | AsGiven)


def described(preparation: Preparation) -> str:
    """The sentence the outputs show about ``preparation``: where its numbers come from, and for a
    :class:`NotPrivate` one, :data:`LABEL` and what it means."""
    if isinstance(preparation, PublicBounds):
        return f"each record on its own, from public bounds ({preparation.source})"
    if isinstance(preparation, AsGiven):
        return f"none: {preparation.reason}"
    if isinstance(preparation, NotPrivate):
        return (f"{LABEL}: {preparation.name}, computed from the data without noise; one record moves every "
                "other, so no ε shown for this problem is a guarantee")
    raise DpoptError(f"preparation={preparation!r} must be declared as PublicBounds, AsGiven or NotPrivate")
