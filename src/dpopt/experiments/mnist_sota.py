"""mnist-sota: the best private MNIST model dpopt gives at ε = 3, 2 and 1, δ = 1e−5, and the
published recipes it starts from.

Source: Tramèr & Boneh 2021, "Differentially private learning needs better features (or much
more data)" (ICLR; arXiv:2011.11660; code github.com/ftramer/Handcrafted-DP), Table 1 at
(ε = 3, δ = 1e−5): the end-to-end tanh CNN of Papernot et al. 2021 ("Tempered sigmoid
activations for deep learning with differential privacy", AAAI) 98.1 %, ScatterNet features +
linear model 98.7 %. Their recipes (the repository's README): DP-SGD with SGD momentum 0.9, clip
C = 0.1; the CNN with batch 512, learning rate 0.5, 40 epochs; ScatterNet + linear with batch
4096, learning rate 8, normalised by batch statistics computed with noise (σ = 8, its cost composed
into ε = 3), ~50 epochs at their noise multiplier; Fashion-MNIST's ScatterNet recipe normalises
with GroupNorm (27 groups), which costs nothing.

Every run is a practitioner's loop (:mod:`dpopt.experiments.optimizer_loop`): :class:`dpopt.Private`
releases DP-SGD's noised gradient, ``torch.optim.SGD`` with momentum steps from it, and the
output is the last iterate or a moving average of the iterates (post-processing, free). The
problems are the CNN on the pixels (:func:`dpopt.models.mnist_cnn`, Papernot et al.'s network)
and the linear model on scattering features (:class:`dpopt.scattering.Scattering2D`, J = 2, L = 8:
a fixed public filter bank applied to each image alone) normalised by GroupNorm (27 groups, no
affine parameters: each image's on its own), both computed once and cached
(:class:`dpopt.scattering.GroupNormalised`, :func:`dpopt.scattering.features`), so that the model
is its linear layer alone (``"linear"``; the same network as ``"scatternet-linear"`` on the raw
features, without the normalisation at every step). A third problem adds augmentation multiplicity (De et al. 2022,
:mod:`dpopt.augmentation`): each training record is seen through five views, the features of its
image and of the image shifted by one pixel in each direction, its loss the mean over them; one
clipped gradient per record, so the release and its privacy event are DP-SGD's.

Methods are declared in ``presets/mnist-sota.toml``: an algorithm of the registry with its options,
an optimizer with its options. A method runs on a problem at an ε where the file gives its
hyper-parameters (``tuned``), and only if this dpopt has what it names: a method whose algorithm
option or optimizer does not exist yet is left out, and the report says why (:func:`unavailable`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import _validate
from ..algorithms import registry
from ..augmentation import mean_over_views, shift
from ..base import Algorithm
from ..data import load
from ..data.bounds import Preparation
from ..json_types import JsonObject
from ..models import cross_entropy
from ..plan import steps_for_epochs
from ..report import assignments, pyplot, save_figure
from ..scattering import GroupNormalised, Scattering2D, features
from ..train import History
from . import declared
from ._runner import Method, Params, Problem, time_to_target
from ._torch import classifier_problem
from .optimizer_loop import OptimizerLoop, optimizer_class
from ..jobs.preparation import registered
from .payload import Payload, ProblemKey, Row, named
from .preset import Tuning, declared_experiment

DATA = declared.load("mnist-sota")
NAME = DATA["name"]
#: The scattering transform of 28 × 28 images (81 channels of 7 × 7).
SCATTERING = Scattering2D((28, 28), J=2, L=8)


@dataclass(frozen=True)
class Setting:
    """One problem as the preset file declares it: ``model`` (a name of :data:`dpopt.models.NETWORKS`,
    with ``model_options``) on MNIST's pixels or, with ``scattering``, on their scattering features,
    GroupNorm-normalised in ``feature_groups`` groups if given; the first ``records`` training and
    test records (None: all); the error the time to target is measured at; the engine's chunk size;
    ``run_cost``: a run's CPU seconds as measured, which orders the queue (:meth:`~.preset.Experiment.run_cost`);
    ``shifts``: with it, augmentation multiplicity (:mod:`dpopt.augmentation`): each training record
    is the features of its image shifted by each (rows, columns) pair, and its loss the mean over
    those views (the test images are seen once, unshifted)."""

    model: str
    target_error: float
    microbatch_size: int
    scattering: bool = False
    feature_groups: int | None = None
    model_options: dict[str, Any] | None = None
    records: int | None = None
    run_cost: float | None = None
    shifts: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.shifts is not None:  # the file's lists of [rows, columns], as tuples
            if not self.shifts or not self.scattering:
                raise _validate.DpoptError(f"shifts={self.shifts!r} must give at least one view [rows, columns] of "
                                           "scattering features (scattering = true), or be left out")
            object.__setattr__(self, "shifts", tuple((int(r), int(c)) for r, c in self.shifts))


SETTINGS = {key: Setting(**spec) for key, spec in DATA.parameter("problems").items()}


def preparation(key: ProblemKey) -> Preparation:
    """MNIST's registered preparation (pixels / 255) for every problem; the scattering features
    (and their GroupNorm) are a fixed public map of each prepared image (:func:`arrays`), not part
    of the data's preparation."""
    return registered("mnist")


def arrays(setting: Setting, data_dir: str | None) -> tuple[np.ndarray, ...]:
    """Train and test rows of ``setting`` (pixels / 255, or their scattering features, normalised
    if the setting says so; with ``shifts``, each training row ``[K, d]``: its K views) and labels."""
    data = registered("mnist").prepare(load("mnist", data_dir))
    cut = slice(setting.records)
    X, X_test = data.X_train[cut], data.X_test[cut]
    if setting.scattering:
        transform = feature_map(setting)
        X = views(transform, X.reshape(-1, 28, 28), setting.shifts)
        X_test = features(transform, X_test.reshape(-1, 28, 28), name=repr(transform)).numpy()
    return X, data.y_train[cut], X_test, data.y_test[cut]


def views(transform: Scattering2D | GroupNormalised, images: np.ndarray,
          shifts: tuple[tuple[int, int], ...] | None) -> np.ndarray:
    """``transform``'s features of ``images`` ``[n, d]`` or, with ``shifts``, of each shifted copy
    of them, ``[n, K, d]``: each view's features computed (or read from the cache) on their own and
    copied into one array, so that at most one view is held twice (the five views of MNIST's
    training images take 4.8 GB). The array is torch's: numpy asks the kernel for huge pages for an
    array this large, and the first writes into it took 7 s for one view here (the kernel compacting
    memory to find them) against 0.7 s into torch's; a step reads the views no faster from huge pages
    (0.339 against 0.331 s a step, interleaved)."""
    if shifts is None:
        return features(transform, images, name=repr(transform)).numpy()
    pixels = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))

    def view(rows: int, columns: int) -> torch.Tensor:
        return features(transform, shift(pixels, rows, columns).numpy(), name=repr(transform))

    first = view(*shifts[0])
    out = torch.empty(len(images), len(shifts), first.shape[1], dtype=torch.float32)
    out[:, 0] = first
    del first
    for k, (rows, columns) in enumerate(shifts[1:], start=1):
        out[:, k] = view(rows, columns)
    return out.numpy()


def feature_map(setting: Setting) -> Scattering2D | GroupNormalised:
    """The scattering transform, followed by the setting's GroupNorm if it has one."""
    if setting.feature_groups is None:
        return SCATTERING
    return GroupNormalised(SCATTERING, setting.feature_groups)


def final_metrics(history: History, *, target_error: float) -> dict[str, float]:
    """The output's test accuracy, and the time to the target error (:func:`time_to_target` on the
    expected data passes: a :class:`dpopt.Private` loop does not see the realised batches)."""
    return {"test_accuracy": 1 - history.final["test_error"]} | time_to_target(
        history, target_error=target_error, passes="expected_passes")


def build_problem(key: ProblemKey, data_dir: str | None) -> tuple[Problem, JsonObject]:
    """The classifier of problem ``key`` and facts for the report."""
    setting = SETTINGS[named(key)]
    X, y, X_test, y_test = arrays(setting, data_dir)
    loss = cross_entropy if setting.shifts is None else mean_over_views(cross_entropy)
    problem = classifier_problem(setting.model, X, y, X_test, y_test, microbatch_size=setting.microbatch_size,
                                 train_metrics=False, model_options=setting.model_options or {}, loss=loss,
                                 history_metrics=lambda h: final_metrics(h, target_error=setting.target_error))
    normalised = "" if setting.feature_groups is None else f", GroupNorm in {setting.feature_groups} groups"
    features_of = (f"scattering features ({SCATTERING.channels} × {SCATTERING.output_shape[0]} × "
                   f"{SCATTERING.output_shape[1]}, J = {SCATTERING.J}, L = {SCATTERING.L}{normalised}; a fixed public "
                   "map of each image, cached)" if setting.scattering else "pixels")
    if setting.shifts is not None:
        features_of += (f"; each training record seen as {len(setting.shifts)} views, its image shifted by (rows, "
                        f"columns) in {', '.join(map(str, setting.shifts))}, its loss their mean")
    facts: JsonObject = {
        "n": len(X), "n_test": len(X_test), "dim": problem.oracle.dim, "data": "mnist", "features": features_of,
        "model": setting.model + (f" ({options})" if (options := assignments(setting.model_options or {})) else ""),
        "target_error": setting.target_error, "delta": DATA["delta"]}
    return problem, facts


# ------------------------------------------------------------------------------- the methods


@dataclass(frozen=True)
class Declared:
    """A method as the preset file declares it (``[methods.<name>] settings``): a registry
    ``algorithm`` with its ``algorithm_options``, a torch ``optimizer`` by name with its ``options``."""

    algorithm: str
    optimizer: str
    options: dict[str, float] = field(default_factory=dict)
    algorithm_options: dict[str, float] = field(default_factory=dict)


DECLARED = {name: Declared(**spec["settings"]) for name, spec in DATA["methods"].items()}


def unavailable(settings: Declared) -> str | None:
    """Why this dpopt cannot run the method declared as ``settings`` (its algorithm does not take
    one of its options, its optimizer does not exist), or None."""
    try:
        registry.entry(settings.algorithm)
        registry.Knobs.of(1, **settings.algorithm_options)
        optimizer_class(settings.optimizer)
    except _validate.DpoptError as err:
        return str(err)
    return None


def _method(name: str, settings: Declared, tuned: dict[float | None, Params]) -> Method:
    """The declared method: its algorithm by name with the run's batch size and clip, for the run's
    epochs; its loop the declared optimizer at the run's learning rate, schedule and average, and at the
    run's ``momentum`` where the run gives one (else the method's)."""

    def build(n: int, p: Params) -> tuple[Algorithm[object], int]:
        algorithm = registry.build(settings.algorithm, n=n, batch_size=p["batch_size"], clip=p["clip"],
                                   **settings.algorithm_options)
        return algorithm, steps_for_epochs(algorithm, n, p["epochs"])

    def loop(p: Params) -> OptimizerLoop:
        options = settings.options | ({"momentum": p["momentum"]} if "momentum" in p else {})
        return OptimizerLoop(settings.optimizer, lr=p["lr"], options=tuple(sorted(options.items())),
                             schedule=p.get("schedule", "constant"), ema=p.get("ema"))

    return Method(name, build, {}, tuned, loop=loop)


def methods(key: ProblemKey, epochs: int, tuned: Tuning, epsilon: float) -> list[Method]:
    """The file's methods, in its order, that give values for ``key`` at ``epsilon`` and that this
    dpopt can run."""
    return [_method(name, settings, tuned[name]) for name, settings in DECLARED.items()
            if epsilon in tuned.get(name, {}) and unavailable(settings) is None]


# ----------------------------------------------------------------------------------- reports


#: The best published MNIST test accuracy we know at each ε (δ = 1e-5): DPSUR (Fu et al., VLDB 2024),
#: ScatterNet + linear with selective updates, the mean of 5 runs; the authors' code charges only the
#: steps its test accepts, where dpopt charges every step (docs/algorithms.md, DPSUR).
PUBLISHED = {1.0: 0.9793, 2.0: 0.9870, 3.0: 0.9888}
PUBLISHED_BY = ("DPSUR, ScatterNet + linear with selective updates, 5 runs (Fu et al. 2024), whose ε charges only "
                "the steps it accepts")
#: The label of the published numbers in the accuracy figure (drawn as points, no spread).
PUBLISHED_LABEL = f"published: {PUBLISHED_BY}"


def analyses(payload: Payload) -> list[str]:
    """The acceptance lines (at full size): DP-SGD's CNN mean; at each ε with a published anchor
    (:data:`PUBLISHED`), the best row's mean beside it (:func:`_compared`); and every declared method
    left out, with the reason."""
    lines = [f"* **Not run: {name}** — {reason}" for name, settings in DECLARED.items()
             if (reason := unavailable(settings)) is not None]
    rows = payload["rows"]
    if payload["quick"] or not rows:
        return lines
    accuracy = {(r["problem"], r["algorithm"], r["epsilon"]): r["metrics"]["test_accuracy"] for r in rows}
    cnn = accuracy.get(("tanh-cnn:mnist", "DP-SGD", 3.0))
    if cnn is not None:
        verdict = "meets" if cnn["mean"] >= 0.98 else "**misses**"
        lines.append(f"* ε = 3: the CNN with DP-SGD (the published recipe) reaches {_percent(cnn)}: {verdict} "
                     "98.0 % (the paper: 98.1 %).")
    for epsilon, published in PUBLISHED.items():
        at = {where: value for where, value in accuracy.items() if where[2] == epsilon}
        if at:
            (problem, name, _), best = max(at.items(), key=lambda item: item[1]["mean"])
            lines.append(f"* ε = {epsilon:g}: the best method is {name} on `{problem}` at {_percent(best)}: "
                         f"{_compared(best, published)} the best published {published:.2%} ({PUBLISHED_BY}).")
    return lines


#: The figure of test accuracy against ε (:func:`figures`).
ACCURACY_FIGURE = "accuracy_vs_epsilon.png"


def accuracy_by_epsilon(payload: Payload) -> dict[str, list[tuple[float, float, float]]]:
    """The figure's series, ``label → [(ε, mean, std), …]`` by increasing ε: DP-SGD on the ScatterNet
    features (``scatternet:mnist``, or its ``-smoke`` version under ``--quick``) at each ε, and the
    best row at each ε (the highest mean test accuracy, any problem and method) under its method's
    name where that is not the DP-SGD row; at full size, the best published numbers
    (:data:`PUBLISHED`, no spread: drawn as points)."""
    series: dict[str, list[tuple[float, float, float]]] = {}
    at: dict[float, list[Row]] = {}
    for row in payload["rows"]:
        if row["epsilon"] is not None:
            at.setdefault(row["epsilon"], []).append(row)
    scatternet = PRESET.problems(payload["quick"])[PRESET.PROBLEMS.index("scatternet:mnist")]
    for epsilon in sorted(at):
        dp_sgd = [row for row in at[epsilon] if row.get("problem") == scatternet and row["algorithm"] == "DP-SGD"]
        best = max(at[epsilon], key=lambda row: row["metrics"]["test_accuracy"]["mean"])
        for row in dp_sgd:
            series.setdefault("DP-SGD, ScatterNet + linear", []).append(_accuracy(epsilon, row))
        if best not in dp_sgd:
            series.setdefault(f"best: {best['algorithm']}", []).append(_accuracy(epsilon, best))
    if not payload["quick"]:
        series[PUBLISHED_LABEL] = [(eps, value, math.nan) for eps, value in sorted(PUBLISHED.items())]
    return series


def _accuracy(epsilon: float, row: Row) -> tuple[float, float, float]:
    """``(ε, mean, std)`` of a row's test accuracy (std NaN where one run gives none)."""
    accuracy = row["metrics"]["test_accuracy"]
    return epsilon, accuracy["mean"], accuracy.get("std", math.nan)


def figures(out_dir: Path, payload: Payload) -> None:
    """:data:`ACCURACY_FIGURE`: test accuracy against ε (log scale), mean ± std over the seeds of
    each series of :func:`accuracy_by_epsilon`, the published numbers as points."""
    series = accuracy_by_epsilon(payload)
    if not series:
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for label, points in series.items():
        eps, mean, std = (np.array(values, dtype=float) for values in zip(*points))
        published = label == PUBLISHED_LABEL
        ax.errorbar(eps, mean, yerr=None if published else std, label=label, marker="D" if published else "o",
                    linestyle="none" if published else "-", capsize=3)
    ax.set_xscale("log")
    ax.minorticks_off()  # only the run's ε are labelled (a log axis labels some minor ticks too)
    ax.set_xticks(sorted({eps for points in series.values() for eps, _, _ in points}))
    ax.get_xaxis().set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("ε (δ = 1e-5)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=8)
    fig.suptitle(f"mnist-sota: test accuracy against ε, mean ± std over {payload['seeds']} seeds; "
                 f"{DATA['figure_note']}", fontsize=9, wrap=True)
    save_figure(out_dir / ACCURACY_FIGURE, fig)


def _compared(summary: dict[str, float], published: float) -> str:
    """``level with`` the published mean when it is within one standard deviation of ours (a few seeds
    cannot tell them apart), else ``above`` or ``**behind**``."""
    gap = summary["mean"] - published
    if abs(gap) <= summary.get("std", 0.0):
        return "level with"
    return "above" if gap > 0 else "**behind**"


def _percent(summary: dict[str, float]) -> str:
    std = summary.get("std")
    return f"{summary['mean']:.2%}" + ("" if std is None or not math.isfinite(std) else f" ± {std:.2%}")


PRESET = declared_experiment(DATA, make_problem=build_problem, make_methods=methods, preparation=preparation,
                             analyses=analyses, draw=figures, run_cost=lambda key: SETTINGS[named(key)].run_cost)
