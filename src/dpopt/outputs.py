"""Every number dpopt writes is classified: private, or a labelled, opt-in non-private diagnostic.

Private: θ and what it gives on data outside the training set (test error), the privacy
guarantee and its accounting facts, public settings and planned quantities (e.g. the expected
data passes Σ_t b_t/n). Non-private diagnostics: anything computed from the training data
without noise (training objective, gradient norm, a step's batch loss, realised batch sizes and
passes, the times they take, clip rates, dropped-record counts). Diagnostics are computed only when asked for,
written apart (under ``"diagnostics"``, with :data:`NOT_PRIVATE` as their label) and labelled
wherever they are shown.

:func:`unclassified` walks a written payload and names every field that is in neither list, or a
diagnostic outside the ``"diagnostics"`` section: tests run it over everything ``dpopt run``,
``dpopt.fit``, ``dpopt tune``, ``dpopt reproduce`` and ``dpopt bench`` write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

V = TypeVar("V")

NOT_PRIVATE = ("NOT PRIVATE: computed from the training data without noise; these numbers carry no "
               "differential-privacy guarantee and must not be released")

#: Private metrics of a run, logged at every log point and at the output.
PRIVATE_METRICS = ("epsilon", "test_error", "expected_passes")
#: Counts an algorithm releases about its own run, functions of its noised releases alone
#: (:class:`dpopt.base.Reporting`; DPSUR's accepted steps): private, written in ``final``.
RELEASED_COUNTS = ("accepted_steps",)
#: Non-private diagnostics of a run (only with ``diagnostics=True``).
DIAGNOSTIC_METRICS = ("objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s", "clip_rate", "train_loss")

#: Private metrics of the reproductions: computed on the test data only, or from the test error.
EXPERIMENT_PRIVATE = ("test_loss", "loss_ratio", "reached_target", "test_accuracy")
#: Non-private metrics of the reproductions (the papers report them): training-data objectives,
#: gradient norms and stationarity, distances to a reference fitted on the training data, realised
#: passes, evaluations and times.
EXPERIMENT_DIAGNOSTICS = ("min_objective", "grad_norm_sq", "error_ratio", "goldstein", "function_evals",
                          "gradient_evals", "oracle_calls", "time_to_target_s", "cpu_time_to_target_s",
                          "epochs_to_target")


def is_private(metric: str) -> bool:
    """Whether a logged or reported metric is private (any metric not listed as private is not)."""
    return metric in PRIVATE_METRICS or metric in EXPERIMENT_PRIVATE or metric in RELEASED_COUNTS


def shown(metric: str) -> str:
    """A metric's name as a table column or figure title: labelled when it is not private."""
    return metric if is_private(metric) else f"{metric} (NOT PRIVATE)"


def split(metrics: Mapping[str, V]) -> tuple[dict[str, V], dict[str, V]]:
    """(private, diagnostic) parts of a metric dict; an unknown metric name is an error."""
    unknown = [m for m in metrics if not is_private(m) and m not in DIAGNOSTIC_METRICS + EXPERIMENT_DIAGNOSTICS]
    if unknown:
        raise ValueError(f"metrics {unknown} are not classified in dpopt.outputs")
    private = {m: v for m, v in metrics.items() if is_private(m)}
    return private, {m: v for m, v in metrics.items() if m not in private}


#: Facts a reproduction states about its problem that are public: sizes, settings, published
#: targets, statistics of the test data only (the majority-class error: of the test set's own
#: majority class), and how the data were prepared (a sentence, labelled NOT PRIVATE where the
#: preparation reads the data: :mod:`dpopt.jobs.preparation`).
PUBLIC_FACTS = frozenset({
    "n", "n_test", "dim", "d", "features", "task", "clients", "records_per_client", "model", "data", "source",
    "target_error", "delta", "smoke", "phi", "alpha", "goldstein_points", "goldstein_seed", "reference",
    "majority_class_test_error", "preparation",
})
#: Facts computed from the training data without noise (a reference optimum fitted on it, the
#: stationarity of θ0 on it): diagnostics.
DIAGNOSTIC_FACTS = frozenset({"goldstein_start", "reference_norm", "nonprivate_loss_ratio"})

#: Every other private field: settings, the output θ, the accounting facts, the structure of a
#: run's history and of a reproduction's results.json.
PRIVATE_FIELDS = frozenset(PRIVATE_METRICS + EXPERIMENT_PRIVATE + RELEASED_COUNTS) | PUBLIC_FACTS | {
    "step", "records", "final", "theta", "delta", "accountant", "neighboring_relation", "steps_done", "stopped",
    "randomness", "algorithm", "dataset", "data_source", "out", "epsilon_target", "processes", "diagnostics",
    "diverged_at", "experiment", "rows", "seeds", "quick", "log_points", "facts", "t_tests", "problem", "ours",
    "baseline", "only", "metrics", "mean", "std", "accountant_note",
    # which records the guarantee protects, and where the test metrics were measured (own data:
    # held-out rows of the user's file, labelled NOT PRIVATE there)
    "protected_records", "test_data",
    # a private tuning's release (dpopt.tuning): the selected run, its score on held-out data (and the
    # statement that those records are not protected), the distribution of the number of trials,
    # one trial's ε alone
    "validation_score", "trial_epsilon", "trials", "validation_fraction", "validation_split",
    # a bench's bench.json (dpopt.bench): its problems' cells of test metrics, each method's claimed ε,
    # the winner (or the methods that tie) and its p-value on the test metric; the command
    "problems", "metric", "cells", "winner", "runner_up", "p_value", "significant", "tied",
    "epsilon_tuning_and_training", "command",
}
#: Fields of a ``"diagnostics"`` section.
DIAGNOSTIC_FIELDS = frozenset(DIAGNOSTIC_METRICS) | frozenset(EXPERIMENT_DIAGNOSTICS) | DIAGNOSTIC_FACTS | {
    "label", "records", "final", "step", "facts", "t_tests", "problem", "epsilon", "ours", "baseline", "metrics",
    "mean", "std", "trials_run", "runs", "algorithm",
}
#: Fields whose values are public by nature and keyed by names, not walked: settings given by
#: name (hyper-parameters, grids, epochs per ε, a bench task's settings and each method's steps)
#: and the papers' published numbers.
PUBLIC_BY_NAME = frozenset({"hyperparameters", "params", "grids", "epochs", "paper", "task", "steps"})
#: Fields keyed by a method's name whose entries are walked (a bench cell's methods).
BY_METHOD = frozenset({"methods"})
#: The non-private tuning of the reproductions (its scores are training objectives), keyed by
#: method and not walked: allowed only inside ``"diagnostics"``.
TUNING = "tuning"


def _keys(payload: object, inside: bool, path: str) -> Iterator[tuple[str, bool]]:
    if isinstance(payload, dict):
        for key, value in payload.items():
            yield f"{path}.{key}".lstrip("."), inside
            if key in BY_METHOD and isinstance(value, dict):
                for name, entry in value.items():
                    yield from _keys(entry, inside, f"{path}.{key}.{name}")
            elif key not in PUBLIC_BY_NAME and key != TUNING:
                yield from _keys(value, inside or key == "diagnostics", f"{path}.{key}")
    elif isinstance(payload, list):
        for item in payload:
            yield from _keys(item, inside, f"{path}[]")


def _metric(key: str) -> str:
    """A t-test's p-value ``p_<metric>`` is classified as its metric (unless listed by its own name)."""
    return key.removeprefix("p_")


def unclassified(payload: object, extra_diagnostics: frozenset[str] = frozenset()) -> list[str]:
    """The fields of ``payload`` that are not classified where they stand: a private field must
    be in :data:`PRIVATE_FIELDS` or :data:`PUBLIC_BY_NAME`; inside ``"diagnostics"`` a field must
    be in :data:`DIAGNOSTIC_FIELDS`, be the tuning record, or be in ``extra_diagnostics``
    (measurements the caller added)."""
    wrong = []
    for path, inside in _keys(payload, False, ""):
        key = path.rsplit(".", 1)[-1].removesuffix("[]")
        allowed = (DIAGNOSTIC_FIELDS | extra_diagnostics | {TUNING} if inside
                   else PRIVATE_FIELDS | PUBLIC_BY_NAME | BY_METHOD)
        if key not in allowed and _metric(key) not in allowed:
            wrong.append(path)
    return wrong
