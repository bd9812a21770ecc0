"""The kinds of task a bench problem may declare (``task = { kind = "...", ... }`` in
``problems.toml``): each kind builds a :class:`~dpopt.tuning.task.Task` from its settings, with
the protected records, a held-out validation split of the training data (a fixed public
permutation, :func:`~dpopt.tuning.task.split`) that scores candidates, and the test data that
reports the selected θ. :data:`KINDS` is the registry; a kind's settings are its keyword
arguments. The problems reuse the reproductions' data and model code:

* ``glm``: a GLM on a registered data set (:func:`~dpopt.tuning.task.glm_task`);
* ``classifier``: an image classifier of :mod:`dpopt.models` (the DP-SRM reproduction's MNIST
  CNN) with per-record cross-entropy, its first ``records`` training images; test error;
* ``mlp-regression``: the DIFF2 paper's one-hidden-layer MLP with squared loss on a tabular data
  set; the metric is the test loss, the mean of (f(x) − y)² on the prepared data. Splitting it
  over clients is the algorithm's business (DIFF2's ``clients``);
* ``heavy-tailed``: the AClip paper's synthetic GLM data (:func:`dpopt.data.synthetic.heavy_tailed`);
* ``truncated-absolute``: the O2NC reproduction's nonsmooth robust regression
  (:func:`dpopt.experiments.o2nc_nonsmooth.synthetic`, loss min(|⟨x, θ⟩ − y|, cap)); the metric is
  the test mean absolute error.

The oracles of the first four are built by model name (:func:`dpopt.building.oracle_for`).
Each kind declares how its data are prepared (:func:`preparation`, a value of
:mod:`dpopt.jobs.preparation`): the first three read a registered data set, prepared by the
public bounds it declares (a data set that declares none is refused), the last two draw synthetic
data. Nothing is computed from the data before training: the bench's ε hold for the raw records.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import _validate
from ..building import metric_of, oracle_for
from ..data.bounds import Preparation
from ..jobs.preparation import SYNTHETIC, registered
from ..names import GLMS, MLP
from ..tuning.task import Task, glm_task, held_out_task


def glm(*, dataset: str, model: str, reg: float, validation_fraction: float, data_dir: str | None,
        preparation: Preparation) -> Task:
    """GLM ``model`` on the registered ``dataset``."""
    return glm_task(dataset, model, reg=reg, validation_fraction=validation_fraction, data_dir=data_dir,
                    preparation=preparation)


def classifier(*, dataset: str, model: str, records: int, microbatch_size: int, validation_fraction: float,
               data_dir: str | None, preparation: Preparation) -> Task:
    """``model`` (:func:`dpopt.models.make_model`, seed 0: θ0, the same for every run) on the first
    ``records`` training images of ``dataset`` (all test images); the metric is the test error."""
    from ..data import load
    from ..models import NETWORKS

    _validate.one_of("model", model, NETWORKS)
    loaded = preparation.prepare(load(dataset, data_dir))
    cut = slice(_validate.positive_int("records", records, maximum=len(loaded.X_train),
                                       maximum_name="the training images"))
    task = held_out_task(lambda X, y: oracle_for(model, X, y, microbatch_size=microbatch_size),
                         loaded.X_train[cut], loaded.y_train[cut], loaded.X_test, loaded.y_test,
                         validation_fraction=validation_fraction)
    return dataclasses.replace(task, theta0=task.oracle.flat_params().double())


def mlp_regression(*, dataset: str, validation_fraction: float, data_dir: str | None,
                   preparation: Preparation) -> Task:
    """The MLP (10 softplus units, squared loss, seed-0 initialisation: θ0) on ``dataset``."""
    from ..data import load

    loaded = preparation.prepare(load(dataset, data_dir))
    task = held_out_task(lambda X, y: oracle_for(MLP, X, y), loaded.X_train, loaded.y_train, loaded.X_test,
                         loaded.y_test, validation_fraction=validation_fraction, metric="test_loss",
                         measure=lambda oracle, X, y: metric_of(MLP, oracle, X, y))
    return dataclasses.replace(task, theta0=task.oracle.flat_params())


#: The heavy-tailed data's labels for each model it fits: responses, or their signs.
LABELS = {"ridge": "regression", "logistic": "binary"}


def heavy_tailed(*, noise: str, model: str, n: int, dim: int, reg: float, validation_fraction: float,
                 data_dir: str | None) -> Task:
    """GLM ``model`` (ridge: the paper's regression; logistic) on the heavy-tailed synthetic data,
    ``n`` records in all (the last fifth for testing), seed 0."""
    from ..data.synthetic import heavy_tailed as draw

    _validate.one_of("model", model, LABELS)
    data, _ = draw(noise, LABELS[model], n=n, dim=dim, seed=0, test_fraction=0.2)
    return held_out_task(lambda X, y: oracle_for(model, X, y, reg=reg), data.X_train, data.y_train, data.X_test,
                         data.y_test, validation_fraction=validation_fraction, metric=GLMS[model])


def truncated_absolute(*, dim: int, n: int, cap: float, validation_fraction: float, data_dir: str | None) -> Task:
    """Robust regression min(|⟨x, θ⟩ − y|, ``cap``) on the O2NC reproduction's synthetic family
    (unit-norm x in dimension ``dim``, 10 % of labels replaced by ±5; ``n`` training records, seed
    0); the metric is the test mean absolute error."""
    from ..experiments.o2nc_nonsmooth import synthetic
    from ..oracles import TruncatedAbsolute

    X, y, X_test, y_test = synthetic(dim, n)
    return held_out_task(lambda X_, y_: TruncatedAbsolute(X_, y_, cap=cap), X, y, X_test, y_test,
                         validation_fraction=validation_fraction, metric="test_mae")


@dataclass(frozen=True)
class Kind:
    """A kind of task: ``build(**settings, validation_fraction=, data_dir=)`` makes it; a kind on a
    ``registered`` data set (its ``dataset`` setting) also takes the ``preparation`` that data set
    declares, the others draw synthetic data."""

    build: Callable[..., Task]
    registered: bool


#: Task kinds by name.
KINDS: dict[str, Kind] = {
    "glm": Kind(glm, True), "classifier": Kind(classifier, True), "mlp-regression": Kind(mlp_regression, True),
    "heavy-tailed": Kind(heavy_tailed, False), "truncated-absolute": Kind(truncated_absolute, False)}


def _kind(settings: Mapping[str, object]) -> Kind:
    return KINDS[_validate.one_of("task kind", settings.get("kind"), KINDS)]


def preparation(settings: Mapping[str, object]) -> Preparation:
    """How the task ``settings`` declare prepares its data: by the public bounds its registered data
    set declares (:func:`~dpopt.jobs.preparation.registered`: refused if it declares none),
    or :data:`~dpopt.jobs.preparation.SYNTHETIC`."""
    return registered(str(settings.get("dataset"))) if _kind(settings).registered else SYNTHETIC


def build_task(settings: Mapping[str, object], *, validation_fraction: float, data_dir: str | None) -> Task:
    """The task ``settings["kind"]`` declares, built from the rest of ``settings`` (and the data
    prepared as :func:`preparation` declares)."""
    kind = _kind(settings)
    arguments = {key: value for key, value in settings.items() if key != "kind"} | {
        "validation_fraction": validation_fraction, "data_dir": data_dir}
    try:
        inspect.signature(kind.build).bind(**arguments, **({"preparation": None} if kind.registered else {}))
    except TypeError as err:  # a missing or unknown setting
        raise _validate.DpoptError(f"task={settings!r}: {err}") from None
    if kind.registered:
        arguments["preparation"] = preparation(settings)
    return kind.build(**arguments)
