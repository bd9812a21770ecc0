"""What ``run`` and ``tune`` share: where their data come from, a registered data set
(``--dataset``) or a file of one's own (``--data``) read against its public schema, and the public
bounds that prepare it (:class:`Source`); and what they train on it (:class:`TrainingRequest`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from .. import _validate
from .common import Request, add_data_dir

if TYPE_CHECKING:
    from ..data.bounds import Preparation
    from ..data.own import Described, Schema

#: The flags that describe a file of one's own (``--data``); a registered data set has its own.
OWN = ("task", "target", "schema", "classes", "features", "test_data")


def add_flags(sub: argparse.ArgumentParser, dataset_help: str) -> None:
    """``--dataset``, a file of one's own, its public schema and the public bounds that prepare it."""
    sub.add_argument("--dataset", help=dataset_help)
    sub.add_argument("--data", help="a file of your own instead: CSV with a header (.csv, .csv.gz), NPZ (arrays "
                     "X and the target), LIBSVM (.libsvm, .svm, optionally compressed), read against its public "
                     "schema (--task, --target, --classes, --features or --schema); a row outside it is refused "
                     "with its line number. A row is held out for testing iff a public hash of its values (seed "
                     "0) is below 0.2, so one added row moves no other; the held-out rows are not protected and "
                     "their test error is labelled NOT PRIVATE (use --test-data to train on every row)")
    sub.add_argument("--schema", help="with --data: a JSON file of the public schema, e.g. {\"task\": "
                     "\"multiclass\", \"target\": \"label\", \"classes\": 10, \"features\": 784}: task "
                     "(binary, multiclass, regression), target (CSV column or NPZ array), classes (multiclass: K, "
                     "labels 0..K-1), features (their number, or a CSV's column names in order); flags given "
                     "too must agree with it")
    sub.add_argument("--task", help="with --data: binary (labels 1, or 0/-1), multiclass or regression")
    sub.add_argument("--target", help="with --data: the target's CSV column or NPZ array (NPZ default y)")
    sub.add_argument("--classes", type=int, help="with --data, multiclass: the number of classes K (public; "
                     "never read from the labels)")
    sub.add_argument("--features", type=int, help="with --data: the number of features (needed for LIBSVM; a "
                     "CSV's header and an NPZ's X fix it)")
    sub.add_argument("--test-data", help="with --data: a separate public test file of the same schema; every "
                     "row of --data then trains and the test error is not labelled NOT PRIVATE")
    sub.add_argument("--feature-bounds", help="public ranges of the features, LOW:HIGH for all or a JSON file (a "
                     "list of [low, high] per feature, or for a CSV an object column -> [low, high]): each feature "
                     "is clipped to its range and mapped onto [-1, 1]; needed with --data")
    sub.add_argument("--target-bounds", help="with --feature-bounds, regression: the target's public range "
                     "LOW:HIGH (clipped, mapped onto [-1, 1])")
    sub.add_argument("--row-norm", type=float, help="with --feature-bounds: scale each prepared row to norm at "
                     "most this (public) bound")
    add_data_dir(sub)


@dataclass(frozen=True)
class OwnFile:
    """A file of one's own, ``path``, read against its public ``schema``
    (:class:`dpopt.data.own.Schema`); ``test_data``: a separate test file of the same schema."""

    path: str
    schema: Schema
    test_data: str | None = None


@dataclass(frozen=True)
class Source:
    """A registered data set (``own`` None) or a file of one's own; the public bounds given (None:
    a registered set's declared ones); the data directory."""

    dataset: str
    own: OwnFile | None = None
    feature_bounds: str | None = None
    target_bounds: str | None = None
    row_norm: float | None = None
    data_dir: str | None = None

    @property
    def name(self) -> str:
        """The data set's name in outputs and default folders: the registered name or the file's."""
        return self.dataset if self.own is None else Path(self.own.path).name

    @classmethod
    def parse(cls, args: argparse.Namespace) -> Source:
        """The data of ``args``: ``--dataset`` (checked; default adult) or ``--data`` with its schema
        (checked), not both; the schema flags only with ``--data``."""
        from .. import data
        from ..data import own

        if args.feature_bounds is None and (args.target_bounds is not None or args.row_norm is not None):
            raise _validate.DpoptError("--target-bounds and --row-norm go with --feature-bounds")
        bounds = {"feature_bounds": args.feature_bounds, "target_bounds": args.target_bounds,
                  "row_norm": args.row_norm, "data_dir": args.data_dir}
        if args.data is None:
            for name in OWN:
                if getattr(args, name) is not None:
                    raise _validate.DpoptError(f"--{name} is for --data (a file of your own); a registered data set "
                                               "has its own")
            return cls(_validate.one_of("dataset", args.dataset or "adult", data.names()), **bounds)
        if args.dataset is not None:
            raise _validate.DpoptError("give --dataset (a registered data set) or --data (a file), not both")
        schema = own.Schema.of(args.schema, task=args.task, target=args.target, features=args.features,
                               classes=args.classes)
        return cls(Path(args.data).name, OwnFile(args.data, schema, args.test_data), **bounds)

    def prepared(self) -> Described:
        """The data set, as a :class:`dpopt.data.own.Described` (what the outputs state about it),
        prepared for every model from public bounds only (:mod:`dpopt.data.bounds`): the
        ``feature_bounds`` (and ``target_bounds``, ``row_norm``) if given, else those the registered
        data set declares (checked before any data is read); never from statistics of the data."""
        from .. import data
        from ..data import own

        if self.feature_bounds is None:
            self.declared()  # refused before any data is read if there are none
        if self.own is None:
            dataset = data.load(self.name, self.data_dir)
            # a registered file is pinned by its sha256: its number of classes is a public fact of that file
            classes = (int(max(dataset.y_train.max(), dataset.y_test.max())) + 1 if dataset.task == "multiclass"
                       else None)
            described = own.Described(dataset, f"the {dataset.n} training records of {self.name}",
                                      f"the test split of {self.name}", classes)
        else:
            described = own.read(self.own.path, self.own.schema, test=self.own.test_data)
        return replace(described, dataset=self.preparation(described.columns).prepare(described.dataset))

    def declared(self) -> Preparation:
        """The public bounds the registered data set declares (a one-line error if it declares none,
        or for a file of one's own)."""
        from .. import data

        found = data.preparation(self.name) if self.own is None else None
        if found is None:
            raise _validate.DpoptError(f"data set {self.name!r} declares no public bounds of its features: give "
                                       "--feature-bounds LOW:HIGH or FILE.json (and --target-bounds LOW:HIGH for "
                                       "regression); they must be public, not computed from the data")
        return found

    def preparation(self, columns: tuple[str, ...] | None) -> Preparation:
        """The bounds given (a CSV's feature ``columns`` name them), else the declared ones."""
        from ..data.bounds import PublicBounds, Range, feature_ranges

        if self.feature_bounds is None:
            return self.declared()
        target = None if self.target_bounds is None else Range.parse("target_bounds", self.target_bounds)
        return PublicBounds(feature_ranges(self.feature_bounds, columns), target, self.row_norm)


class Given(TypedDict):
    """The fields of a :class:`TrainingRequest` as the command line gives them."""

    algorithm: str
    data: Source
    model: str
    reg: float
    epsilon: float
    delta: float
    allow_large_delta: bool
    steps: int
    json: bool


@dataclass(frozen=True, kw_only=True)
class TrainingRequest(Request):
    """``algorithm`` (by its registered name) trained on ``data`` with ``model`` (regularisation
    ``reg``) for ``steps`` steps, (``epsilon``, ``delta``)-DP in total (δ >= 1/n only with
    ``allow_large_delta``: the plan checks ε, δ, the steps and n)."""

    algorithm: str
    data: Source
    model: str
    reg: float
    epsilon: float
    delta: float
    allow_large_delta: bool
    steps: int

    @staticmethod
    def given(args: argparse.Namespace, data: Source) -> Given:
        """The fields of this class as ``args`` gives them, with ``data``."""
        return {"algorithm": args.algorithm, "data": data, "model": args.model, "reg": args.reg,
                "epsilon": args.epsilon, "delta": args.delta, "allow_large_delta": args.allow_large_delta,
                "steps": args.steps, "json": args.json}
