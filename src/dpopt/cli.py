"""The ``dpopt`` command line: ``run | reproduce | account | calibrate | audit | data``.

Every command takes ``--json`` for machine-readable output on stdout (strict JSON: see
:mod:`dpopt.report`). Exit codes: 0 done; 2 invalid input or a failure, with one line
``dpopt: error: <argument>=<value> must be …`` and no traceback; 3 a ``run`` that diverged (θ or
its objective not finite), after writing what it has; 130 interrupted (Ctrl-C), saying what was kept.

Each command imports what it needs when it runs: the parser, ``account`` and ``calibrate`` start
without torch (``tests/test_cli_start.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import _validate, lock, report
from .names import ACCOUNTANTS, ALGORITHMS, NOISES, NON_PRIVATE

if TYPE_CHECKING:
    import dp_accounting as dpa
    from dp_accounting import NeighboringRelation

MECHANISMS = ("poisson-gaussian", "wor-gaussian", "gaussian", "tree")
EXPLAINED = ("aclip",)
MODELS = ("logistic", "nonconvex-logistic", "ridge", "mlp")
FEDERATED = ("diff2-gd", "diff2-bvr")


#: A value that starts with a minus sign (``-5:5``, ``-1e-3``, ``-.5``), never an option: argparse
#: takes only plain negative numbers for values and reads ``--feature-bounds -5:5`` as two options.
_NEGATIVE_VALUE = re.compile(r"-[0-9.]")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, and whose option values may start with a
    minus sign followed by a digit or a point (no dpopt option does)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"dpopt: error: {message}\n")
        sys.exit(2)

    def _parse_optional(self, arg_string: str) -> Any:
        if _NEGATIVE_VALUE.match(arg_string):
            return None  # a value (argparse: "not an option")
        return super()._parse_optional(arg_string)


def _mechanism_event(args: argparse.Namespace, z: float) -> tuple[dpa.DpEvent, NeighboringRelation]:
    """The composed event of ``--steps`` runs of the named mechanism with multiplier z ("tree": one
    binary tree over ``--steps`` increments, each record in one increment)."""
    import dp_accounting as dpa
    from dp_accounting import NeighboringRelation

    steps = _validate.positive_int("steps", args.steps)
    if args.mechanism == "tree":  # dpopt.mechanisms.tree_event, without importing torch
        return dpa.SingleEpochTreeAggregationDpEvent(z, [steps]), NeighboringRelation.REPLACE_SPECIAL
    if args.mechanism == "gaussian":
        return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), steps), NeighboringRelation.REPLACE_ONE
    if args.mechanism == "poisson-gaussian":
        rate = _sampling_rate(args)
        event = dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(z))
        return dpa.SelfComposedDpEvent(event, steps), NeighboringRelation.ADD_OR_REMOVE_ONE
    if args.dataset_size is None or args.batch_size is None:
        raise _validate.DpoptError("mechanism=wor-gaussian needs --dataset-size and --batch-size")
    n = _validate.positive_int("dataset_size", args.dataset_size)
    b = _validate.positive_int("batch_size", args.batch_size, maximum=n, maximum_name="dataset_size")
    return (dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(z)), steps),
            NeighboringRelation.REPLACE_ONE)


def _sampling_rate(args: argparse.Namespace) -> float:
    if args.sampling_rate is not None:
        return _validate.unit_interval("sampling_rate", args.sampling_rate)
    if args.dataset_size is None or args.batch_size is None:
        raise _validate.DpoptError("mechanism=poisson-gaussian needs --sampling-rate or --dataset-size and --batch-size")
    n = _validate.positive_int("dataset_size", args.dataset_size)
    return _validate.positive_int("batch_size", args.batch_size, maximum=n, maximum_name="dataset_size") / n


def _account(args: argparse.Namespace) -> dict[str, Any]:
    from .accounting import RELATION_NAMES, accountant_for, epsilon_of

    if args.explain is not None:
        return _explain(args)
    if args.mechanism is None or args.noise_multiplier is None:
        raise _validate.DpoptError("account needs --mechanism and --noise-multiplier (or --explain aclip)")
    z = _validate.positive("noise_multiplier", args.noise_multiplier)
    delta = _validate.open_unit("delta", args.delta)
    event, relation = _mechanism_event(args, z)
    return {"epsilon": epsilon_of(event, delta, relation, args.accountant), "delta": delta,
            "accountant": accountant_for(event, relation, args.accountant),
            "neighboring_relation": RELATION_NAMES[relation], "mechanism": args.mechanism,
            "noise_multiplier": z, "steps": args.steps}


def _explain(args: argparse.Namespace) -> dict[str, Any]:
    """``--explain aclip``: the ε the AClip paper's noise formula really gives (see ``paper_noise``)."""
    from .algorithms.aclip import paper_noise

    _validate.one_of("explain", args.explain, EXPLAINED)
    for name in ("epsilon", "dataset_size", "batch_size"):
        if getattr(args, name) is None:
            raise _validate.DpoptError(f"--explain aclip needs --{name.replace('_', '-')}")
    return paper_noise(epsilon=args.epsilon, delta=args.delta, n=args.dataset_size, batch_size=args.batch_size,
                       steps=args.steps, restarts=args.restarts)


def _calibrate(args: argparse.Namespace) -> dict[str, Any]:
    from .accounting import RELATION_NAMES, accountant_for, solve_noise

    target = _validate.positive("epsilon", args.epsilon)
    delta = _validate.open_unit("delta", args.delta)
    relation = _mechanism_event(args, 1.0)[1]
    z, achieved = solve_noise(lambda s: _mechanism_event(args, s)[0], epsilon=target, delta=delta,
                              relation=relation, accountant=args.accountant)
    return {"noise_multiplier": z, "epsilon": achieved, "target_epsilon": target, "delta": delta,
            "accountant": accountant_for(_mechanism_event(args, z)[0], relation, args.accountant),
            "neighboring_relation": RELATION_NAMES[relation], "mechanism": args.mechanism, "steps": args.steps}


def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train here, in ``--nproc`` data-parallel processes, or as one rank of torchrun's group;
    rank 0's summary (None on the other ranks, which write and print nothing)."""
    import torch

    from . import distributed

    nproc = _validate.positive_int("nproc", args.nproc)
    rank_timeout = _validate.positive("rank_timeout", distributed.RANK_TIMEOUT if args.rank_timeout is None
                                      else args.rank_timeout)
    _shared_noise(max(nproc, distributed.world_size()), args.noise)
    _validate.one_of("backend", args.backend, ("local", "torch"))
    if args.backend == "torch" and args.algorithm not in FEDERATED:
        raise _validate.DpoptError(f"backend='torch' runs the federated algorithms ({', '.join(FEDERATED)}); "
                                   f"algorithm={args.algorithm!r} is data-parallel with --nproc alone")
    if args.backend == "torch" and nproc == 1 and distributed.world_size() == 1:
        raise _validate.DpoptError("nproc=1 must be >= 2 with backend='torch' (rank 0 is the server)")
    if nproc > 1 and distributed.world_size() == 1:
        return distributed.launch(_run, nproc, args, rank_timeout=rank_timeout)[0]
    created = distributed.init_from_env(rank_timeout=rank_timeout)
    try:
        with _holding_out(args):
            return _train(args)
    finally:
        if created:
            torch.distributed.destroy_process_group()


def _shared_noise(processes: int, noise: str) -> None:
    """Data-parallel ranks must add one shared draw (DESIGN.md rule 3): only the seeded generator,
    identical on every rank, gives it; a CSPRNG would add a different draw on every rank."""
    if processes > 1 and noise != "torch":
        raise _validate.DpoptError(f"noise={noise!r} draws independently in every process; data-parallel runs "
                                   f"({processes} processes) need noise='torch' (one draw from the shared seed)")


def _out(args: argparse.Namespace) -> Path:
    """``--out``; by default named after the (checked) algorithm and data set."""
    _validate.one_of("algorithm", args.algorithm, ALGORITHMS)
    name = _data_name(args)
    if args.algorithm in NON_PRIVATE:
        raise _validate.DpoptError(f"algorithm={args.algorithm!r} is not private (ε = ∞) and cannot meet "
                                   f"epsilon={args.epsilon!r}: train it in Python (dpopt.run) as a non-private reference")
    return Path(args.out or f"results/run-{args.algorithm}-{name}")


def _data_name(args: argparse.Namespace) -> str:
    """The registered ``--dataset`` (default adult), checked, or the name of the ``--data`` file."""
    from . import data

    if args.data is None:
        for own in ("task", "target", "schema", "classes", "features", "test_data"):
            if getattr(args, own) is not None:
                raise _validate.DpoptError(f"--{own} is for --data (a file of your own); a registered data set "
                                           "has its own")
        return _validate.one_of("dataset", args.dataset or "adult", data.names())
    if args.dataset is not None:
        raise _validate.DpoptError("give --dataset (a registered data set) or --data (a file), not both")
    return Path(args.data).name


def _prepared_data(args: argparse.Namespace) -> Any:
    """The data set to train on, as a :class:`dpopt.data.own.Described` (what the outputs state
    about it), prepared for every model from public bounds only (:mod:`dpopt.data.bounds`):
    ``--feature-bounds`` (and ``--target-bounds``, ``--row-norm``) if given, else those the
    registered data set declares; never from statistics of the data. A file of one's own is read
    against its public schema (:mod:`dpopt.data.own`)."""
    from dataclasses import replace

    from . import data
    from .data import own
    from .data.bounds import PublicBounds, Range, feature_ranges

    name = _data_name(args)
    schema = None if args.data is None else own.Schema.of(args.schema, task=args.task, target=args.target,
                                                          features=args.features, classes=args.classes)
    declared = data.preparation(name) if args.data is None else None
    if args.feature_bounds is None and (args.target_bounds is not None or args.row_norm is not None):
        raise _validate.DpoptError("--target-bounds and --row-norm go with --feature-bounds")
    if args.feature_bounds is None and declared is None:
        raise _validate.DpoptError(f"data set {name!r} declares no public bounds of its features: give "
                                   "--feature-bounds LOW:HIGH or FILE.json (and --target-bounds LOW:HIGH for "
                                   "regression); they must be public, not computed from the data")
    if schema is None:
        dataset = data.load(name, args.data_dir)
        # a registered file is pinned by its sha256: its number of classes is a public fact of that file
        classes = int(max(dataset.y_train.max(), dataset.y_test.max())) + 1 if dataset.task == "multiclass" else None
        described = own.Described(dataset, f"the {dataset.n} training records of {name}",
                                  f"the test split of {name}", classes)
    else:
        described = own.read(args.data, schema, test=args.test_data)
    if args.feature_bounds is None:
        return replace(described, dataset=declared.prepare(described.dataset))
    target = None if args.target_bounds is None else Range.parse("target_bounds", args.target_bounds)
    bounds = PublicBounds(feature_ranges(args.feature_bounds, described.columns), target, args.row_norm)
    return replace(described, dataset=bounds.prepare(described.dataset))


def _fits(model: str, dataset: Any) -> None:
    """``model`` must be able to learn ``dataset``'s task."""
    needed = {"ridge": ("regression",), "mlp": ("regression", "multiclass", "binary")}.get(model, ("binary",))
    if dataset.task not in needed:
        raise _validate.DpoptError(f"dataset={dataset.name!r} is a {dataset.task} task; model={model!r} "
                                   f"needs a {' or '.join(needed)} data set")


@contextlib.contextmanager
def _holding_out(args: argparse.Namespace) -> Iterator[None]:
    """Rank 0, which alone writes ``--out``, holds its lock for the whole run: before anything
    there is touched, until the results are written. Results whose checkpoint is gone are not
    overwritten (a new run would start from ε = 0 and replace the record of a spent budget)."""
    from . import distributed

    if distributed.rank() != 0:
        yield
        return
    out = _out(args)
    with lock.held(out / "checkpoint.pt"):
        if (out / "history.json").exists() and not (out / "checkpoint.pt").exists():
            raise _validate.DpoptError(f"out={str(out)!r} holds the results of a run (history.json) but not its "
                                       "checkpoint.pt, so it cannot be resumed; use another --out for a new run")
        yield


def _train(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch

    from . import data, distributed
    from .accounting import calibrate
    from .algorithms.by_name import build as build_algorithm
    from .algorithms.by_name import noise_of
    from .models import logistic_loss, mlp_oracle
    from .oracles import make as make_oracle
    from .train import OsSeed, run

    out = _out(args)
    epsilon = _validate.positive("epsilon", args.epsilon)
    delta = _validate.open_unit("delta", args.delta)
    steps = _validate.positive_int("steps", args.steps)
    described = _prepared_data(args)
    dataset = described.dataset
    _fits(args.model, dataset)
    X_test, y_test = torch.as_tensor(dataset.X_test), torch.as_tensor(dataset.y_test)
    if args.model == "mlp":  # the DIFF2 paper's network; a binary task: one logit, logistic loss
        oracle = mlp_oracle(dataset.X_train, dataset.y_train, classes=described.classes,
                            loss=logistic_loss if dataset.task == "binary" else None)
        test_error = (mlp_oracle(dataset.X_test, dataset.y_test).loss if dataset.task == "regression"
                      else lambda theta: oracle.error(theta, X_test, y_test))
    else:
        oracle = make_oracle(args.model, torch.as_tensor(dataset.X_train), torch.as_tensor(dataset.y_train),
                             reg=args.reg)
        test_error = (lambda theta: oracle.error(theta, X_test, y_test))
    _validate.meaningful_delta(delta, oracle.n, allow_large_delta=args.allow_large_delta,
                               override="--allow-large-delta")
    processes, lead = distributed.world_size(), distributed.rank() == 0
    if processes > 1 and args.backend == "local":
        oracle = distributed.Sharded(oracle)
    algorithm = build_algorithm(args.algorithm, n=oracle.n, batch_size=args.batch_size, lr=args.lr, clip=args.clip,
                                clip_diff=args.clip_diff, gamma=args.gamma, sampling=args.sampling,
                                obj_clip=args.obj_clip, noise=args.noise, clients=args.clients, restart=args.restart,
                                local_steps=args.local_steps, backend=distributed.backend(args.backend))
    ratios = (_validate.positive("noise_ratio", args.noise_ratio), 1.0) if args.algorithm == "dp-srm" else None
    algorithm = calibrate(algorithm, epsilon=epsilon, delta=delta, n=oracle.n, steps=steps,
                          accountant=args.accountant, ratios=ratios)
    seed = args.seed if args.seed is not None or processes == 1 else OsSeed(distributed.shared_secret_seed())
    with distributed.resumable(out / "checkpoint.pt") as checkpoint_path:  # rank 0 alone writes out/
        theta0 = oracle.flat_params() if args.model == "mlp" else None  # the network's initialisation
        history = run(algorithm, oracle, steps=steps, seed=seed, delta=delta, accountant=args.accountant,
                      theta0=theta0, noise_source=noise_of(args.noise)[1],
                      test_error=(lambda theta: float(test_error(theta))) if lead else None,
                      checkpoint_path=checkpoint_path, checkpoint_every=args.checkpoint_every if lead else None,
                      max_epsilon=args.max_epsilon, progress=lead and not args.json and sys.stderr.isatty(),
                      diagnostics=args.diagnostics, allow_large_delta=args.allow_large_delta)
    if not lead:
        return None
    payload = {"algorithm": args.algorithm, "dataset": dataset.name, "data_source": dataset.source, "model": args.model, "epsilon_target": epsilon,
               "hyperparameters": repr(algorithm), "processes": processes, "protected_records": described.protected,
               "test_data": described.test_data, **history.to_dict()}
    report.write_json(out / "history.json", payload)
    report.write_text(out / "summary.md", _summary(args.algorithm, dataset.name, history, described))
    run_figure(out / "curves.png", history, algorithm=args.algorithm, dataset=dataset.name, epsilon=epsilon,
               test_label="test error (NOT PRIVATE)" if described.test_unprotected else "test error")
    return {k: payload[k] for k in ("algorithm", "dataset", "epsilon_target", "final", "delta", "accountant",
                                    "accountant_note", "neighboring_relation", "steps_done", "stopped", "diverged_at",
                                    "randomness", "protected_records", "test_data")} | {"out": str(out)}


def run_figure(path: Path, history: Any, *, algorithm: str, dataset: str, epsilon: float,
               test_label: str = "test error") -> None:
    """``dpopt run``'s figure: the test error (its panel titled ``test_label``) and the ε spent
    against the expected data passes, and the training objective (NOT PRIVATE) if diagnostics were
    asked for; one run, so no spread."""
    passes = [r["expected_passes"] for r in history.records]
    panels = {test_label: {algorithm: (passes, [r["test_error"] for r in history.records])},
              "ε spent (guarantee)": {algorithm: (passes, [r["epsilon"] for r in history.records])}}
    if history.diagnostics is not None:
        panels["training objective (NOT PRIVATE)"] = {algorithm: (
            passes, [r["objective"] for r in history.diagnostics["records"]])}
    report.curves_figure(path, panels, xlabel="expected data passes",
                         title=f"{algorithm} on {dataset}: one run at target ε = {epsilon:g}, δ = {history.delta:g} "
                               f"({history.accountant})")


def _summary(algorithm: str, dataset: str, history: Any, described: Any) -> str:
    """summary.md: the private results, what the guarantee protects and where the test error was
    measured (NOT PRIVATE on held-out rows of one's own file); the diagnostics, if asked for, in a
    section of their own."""
    text = report.markdown_table([{"algorithm": algorithm, "dataset": dataset, **history.final}],
                                 ["algorithm", "dataset", "epsilon", "test_error", "expected_passes"])
    text += f"\n\nδ = {history.delta:g}, {history.accountant}, {history.neighboring_relation}; randomness: " \
            f"{history.randomness}.\n"
    text += f"\nProtected: {described.protected}. Test error: {described.test_data}.\n"
    if history.accountant_note is not None:
        text += f"\nAccountant: {history.accountant_note}.\n"
    if history.diagnostics is not None:
        final = history.diagnostics["final"]
        text += f"\n## Diagnostics: {history.diagnostics['label']}\n\n" + report.markdown_table(
            [final], list(final)) + "\n"
    return text


def _audit(args: argparse.Namespace) -> dict[str, Any]:
    """Plan ``--algorithm`` at (--epsilon, --delta) on the canary world's n + 1 records, then audit it
    (a progress bar on a terminal). It is built for the records of D, so that its batch sizes fit
    both worlds: under add/remove-one D has the n background records alone."""
    from dp_accounting import NeighboringRelation

    from . import audit
    from .algorithms import registry
    from .plan import plan_for

    entry = registry.entry(args.algorithm)
    epsilon = _validate.positive("epsilon", args.epsilon)
    n = _validate.positive_int("dataset_size", args.dataset_size)

    def built(records: int) -> Any:
        return registry.build(args.algorithm, n=records, batch_size=args.batch_size, lr=args.lr, clip=args.clip,
                              sampling=args.sampling, noise=args.noise)

    algorithm = built(n + 1)
    if algorithm.relation() == NeighboringRelation.ADD_OR_REMOVE_ONE:
        algorithm = built(n)
    # an audit's δ is the δ its claim is checked at, whatever the world's n
    plan = plan_for(algorithm, n=n + 1, steps=args.steps, delta=args.delta,
                    epsilon=epsilon if entry.private else None, allow_large_delta=True)
    engine = audit.ENGINES[_validate.one_of("engine", args.engine, audit.ENGINES)]
    progress = not args.json and sys.stderr.isatty()
    if args.one_run:
        return audit.audit_one_run(plan, name=args.algorithm, confidence=args.confidence, engine=engine,
                                   seed=args.seed, progress=progress).to_dict()
    result = audit.audit(plan, name=args.algorithm, runs=args.runs, confidence=args.confidence, seed=args.seed,
                         threat_model=audit.THREAT_MODELS[_validate.one_of("threat_model", args.threat_model,
                                                                           audit.THREAT_MODELS)],
                         bound=audit.KINDS[_validate.one_of("bound", args.bound, audit.KINDS)], engine=engine,
                         progress=progress)
    return result.to_dict()


def _reproduce(args: argparse.Namespace) -> dict[str, Any]:
    from .experiments import reproduce

    return reproduce(args.name, seeds=args.seeds, quick=args.quick, out=args.out, data_dir=args.data_dir,
                     retune=args.retune, progress=not args.json and sys.stderr.isatty(), workers=args.workers)


def _tune(args: argparse.Namespace) -> dict[str, Any]:
    """``dpopt tune`` on a registered data set, or on a file of one's own read and prepared as
    ``run`` does (:func:`_prepared_data`)."""
    from .tuning.command import run_tune

    if args.data is None:
        _data_name(args)
        for bound in ("feature_bounds", "target_bounds", "row_norm"):
            if getattr(args, bound) is not None:
                raise _validate.DpoptError(f"--{bound.replace('_', '-')} is for --data: tune runs on a registered "
                                           "data set as it is registered")
        return run_tune(args)
    described = _prepared_data(args)
    _fits(args.model, described.dataset)
    return run_tune(args, described)


def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from .bench import run_bench, shown_command

    return run_bench(args, shown_command(sys.argv[1:]))


def _data(args: argparse.Namespace) -> Any:
    from . import data

    if args.action == "list":
        return {"datasets": data.names(), "data_dir": str(Path(args.data_dir) if args.data_dir else data.default_data_dir())}
    if args.name is None:
        raise _validate.DpoptError(f"`dpopt data {args.action}` needs a data set name: one of {', '.join(data.names())}")
    if args.action == "info":
        return data.info(args.name)
    return {"fetched": [str(path) for path in data.fetch(args.name, args.data_dir)]}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpopt", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--json", action="store_true", help="machine-readable output on stdout")

    def own_data(sub: argparse.ArgumentParser) -> None:
        """A file of one's own, its public schema and the public bounds that prepare it (run, tune)."""
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

    def large_delta(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--allow-large-delta", action="store_true", help="accept --delta >= 1/n knowingly (refused "
                         "by default: with δ >= 1/n, publishing each record whole with probability δ meets the "
                         "guarantee)")

    for name, help_text in (("account", "ε of a mechanism run --steps times"),
                            ("calibrate", "noise multiplier for a target ε (the inverse of account)")):
        sub = commands.add_parser(name, help=help_text)
        if name == "account":
            sub.add_argument("--mechanism", choices=MECHANISMS)
            sub.add_argument("--noise-multiplier", type=float)
            sub.add_argument("--explain", help="aclip: the ε the AClip paper's noise formula σ̂ = λm√(N ln(1/δ))/(nε) "
                             "really gives (needs --epsilon, --dataset-size, --batch-size, --steps, --delta)")
            sub.add_argument("--epsilon", type=float, help="with --explain: the ε the paper's formula targets")
            sub.add_argument("--restarts", type=int, default=1, help="with --explain aclip: τ stages of --steps each")
        else:
            sub.add_argument("--mechanism", choices=MECHANISMS, required=True)
            sub.add_argument("--epsilon", type=float, required=True)
        sub.add_argument("--sampling-rate", type=float)
        sub.add_argument("--dataset-size", type=int)
        sub.add_argument("--batch-size", type=int)
        sub.add_argument("--steps", type=int, required=True)
        sub.add_argument("--delta", type=float, required=True)
        sub.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
        common(sub)

    sub = commands.add_parser("run", help="train one algorithm on one data set at a target ε")
    sub.add_argument("--algorithm", required=True, help=f"one of: {', '.join(ALGORITHMS)}")
    sub.add_argument("--dataset", help="a registered data set (`dpopt data list`; default adult), prepared from "
                     "the public bounds it declares (`dpopt data info NAME`)")
    own_data(sub)
    sub.add_argument("--model", choices=MODELS, default="logistic", help="mlp: the DIFF2 paper's network (binary: "
                     "one logit and the logistic loss; multiclass: K logits and cross-entropy; regression: squared "
                     "loss)")
    sub.add_argument("--reg", type=float, default=1e-3, help="regularisation λ")
    sub.add_argument("--epsilon", type=float, required=True)
    sub.add_argument("--delta", type=float, default=1e-5)
    large_delta(sub)
    sub.add_argument("--steps", type=int, default=500)
    sub.add_argument("--batch-size", type=int, default=256)
    sub.add_argument("--sampling", choices=("poisson", "fixed"), default="poisson")
    sub.add_argument("--lr", type=float, default=0.5)
    sub.add_argument("--clip", type=float, default=1.0)
    sub.add_argument("--clip-diff", type=float, default=0.01, help="DP-SRM's and DIFF2's C2")
    sub.add_argument("--clients", type=int, default=10, help="DIFF2's P (an i.i.d. equal split)")
    sub.add_argument("--restart", type=int, default=20, help="DIFF2's restart interval T")
    sub.add_argument("--local-steps", type=int, default=2, help="DIFF2-BVR-L-SGD's K")
    sub.add_argument("--backend", default="local", help="local, or torch: DIFF2's clients on ranks 1..K-1 of "
                     "--nproc K processes (or torchrun's), the server on rank 0")
    sub.add_argument("--gamma", type=float, default=0.01, help="DP-SRM/STORM momentum γ")
    sub.add_argument("--noise-ratio", type=float, default=1.0, help="DP-SRM's σ0/σ, fixed while calibrating")
    sub.add_argument("--obj-clip", type=float, default=1.0, help="DP-AGD's clip of per-record losses")
    sub.add_argument("--noise", choices=NOISES, default="torch", help="noise source: the run's seeded generator, "
                     "the OS CSPRNG (secure), or the exact discrete Gaussian (discrete; full-batch dp-gd only)")
    sub.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    sub.add_argument("--seed", type=int, help="make the run reproducible (its guarantee then rests on the seed "
                     "staying secret); default: secret randomness from the operating system")
    sub.add_argument("--diagnostics", action="store_true", help="also write the training objective, gradient norm, "
                     "realised passes and times, labelled NOT PRIVATE (computed from the training data without noise)")
    sub.add_argument("--max-epsilon", type=float, help="stop before a step that would exceed this ε")
    sub.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (resumes from out/)")
    sub.add_argument("--data-dir", help="data directory (default: $DPOPT_DATA or the user cache)")
    sub.add_argument("--out", help="output directory (default results/run-<algorithm>-<dataset>)")
    sub.add_argument("--nproc", type=int, default=1, help="data-parallel processes (gloo on 127.0.0.1; the same "
                     "run as one process; under torchrun leave it at 1)")
    sub.add_argument("--rank-timeout", type=float, help="seconds a process of a data-parallel run may stop "
                     "answering before the run is stopped with an error naming it (default: "
                     "dpopt.distributed.RANK_TIMEOUT)")
    common(sub)

    sub = commands.add_parser("audit", help="empirical ε lower bound by the canary method (see dpopt.audit)")
    named = sub.add_mutually_exclusive_group(required=True)
    named.add_argument("--algorithm", help=f"one of: {', '.join(ALGORITHMS)}")
    named.add_argument("--algo", dest="algorithm", help=argparse.SUPPRESS)  # the former name, kept working
    sub.add_argument("--epsilon", type=float, required=True, help="the claimed ε the algorithm is calibrated to")
    sub.add_argument("--delta", type=float, default=1e-5)
    sub.add_argument("--steps", type=int, default=20)
    sub.add_argument("--dataset-size", type=int, default=99, help="background records (the canary is one more)")
    sub.add_argument("--batch-size", type=int, default=50)
    sub.add_argument("--sampling", choices=("poisson", "fixed"), default="poisson")
    sub.add_argument("--lr", type=float, default=1.0)
    sub.add_argument("--clip", type=float, default=1.0)
    sub.add_argument("--noise", choices=NOISES, default="torch")
    sub.add_argument("--runs", type=int, default=10_000, help="canaries audited on each of D and D plus the canary")
    sub.add_argument("--threat-model", default="releases", help="releases (the adversary sees every noised "
                     "release) or final (only the output)")
    sub.add_argument("--bound", default="gaussian-dp", help="gaussian-dp (a fitted Gaussian-DP estimate) or "
                     "clopper-pearson (non-parametric); the JSON holds both")
    sub.add_argument("--engine", default="glm", help="glm (closed-form gradients), ghost or vmap (TorchModel)")
    sub.add_argument("--one-run", action="store_true", help="one training run with every record the run uses "
                     "as a canary, each included with probability 1/2 (for models too costly to train many times)")
    sub.add_argument("--confidence", type=float, default=0.95)
    sub.add_argument("--seed", type=int, default=0)
    common(sub)

    sub = commands.add_parser("reproduce", help="reproduce a paper's experiment")
    sub.add_argument("name", help="experiment name, e.g. dp-srm-ijcnn1")
    sub.add_argument("--quick", action="store_true", help="a fast smoke version (2 seeds)")
    sub.add_argument("--seeds", type=int)
    sub.add_argument("--retune", action="store_true", help="re-run the step-size tuning instead of the preset's")
    sub.add_argument("--workers", type=int, help="processes running seeds in parallel (default: one per core)")
    sub.add_argument("--data-dir")
    sub.add_argument("--out")
    common(sub)

    sub = commands.add_parser("tune", help="private hyper-parameter selection: the best of a random number of "
                              "private runs, tuning and training in one guarantee (Papernot & Steinke 2022)")
    sub.add_argument("--algorithm", required=True, help=f"one of: {', '.join(ALGORITHMS)}")
    sub.add_argument("--dataset", help="a registered data set (`dpopt data list`; default adult)")
    own_data(sub)
    sub.add_argument("--model", choices=("logistic", "nonconvex-logistic", "ridge"), default="logistic")
    sub.add_argument("--reg", type=float, default=1e-3, help="regularisation λ")
    sub.add_argument("--epsilon", type=float, required=True, help="total ε of tuning and training")
    sub.add_argument("--delta", type=float, default=1e-5)
    large_delta(sub)
    sub.add_argument("--steps", type=int, default=500, help="steps of every trial")
    sub.add_argument("--batch-size", type=int, default=256)
    sub.add_argument("--sampling", choices=("poisson", "fixed"), default="poisson")
    sub.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                     help="every trial draws one of these values (lr, clip, clip_diff, gamma, obj_clip)")
    sub.add_argument("--range", action="append", default=[], metavar="NAME=LOW,HIGH",
                     help="every trial draws this hyper-parameter log-uniformly in [LOW, HIGH]")
    sub.add_argument("--lr", type=float, default=0.5, help="the step size where it is not tuned")
    sub.add_argument("--clip", type=float, default=1.0, help="the clip norm where it is not tuned")
    sub.add_argument("--clip-diff", type=float, default=0.01, help="DP-SRM's C2 where it is not tuned")
    sub.add_argument("--gamma", type=float, default=0.01, help="DP-SRM's γ where it is not tuned")
    sub.add_argument("--trials-mean", type=float, default=8.0, help="mean number of trials (>= 1)")
    sub.add_argument("--trials-shape", type=float, default=1.0, help="shape η of the truncated negative binomial "
                     "number of trials (1: geometric, 0: logarithmic); inf: Poisson")
    sub.add_argument("--validation-fraction", type=float, default=0.2, help="share of the training file held out "
                     "(fixed public split; with --data, by a public hash of each row, seed 1) to score candidates; "
                     "these records are not protected")
    sub.add_argument("--seed", type=int, help="make the tuning reproducible (its guarantee then rests on the seed "
                     "staying secret); default: secret randomness from the operating system")
    sub.add_argument("--diagnostics", action="store_true", help="also report the number of trials run and the time "
                     "(NOT PRIVATE: they reveal K)")
    sub.add_argument("--data-dir")
    sub.add_argument("--out", help="output directory (default results/tune-<algorithm>-<dataset>)")
    common(sub)

    sub = commands.add_parser("bench", help="every private optimiser on the declared problems, each tuned privately "
                              "with the same budget for tuning and training")
    sub.add_argument("--problem", action="append", help="a declared problem (default: all); repeatable")
    sub.add_argument("--quick", action="store_true", help="the problems' quick settings (CI)")
    sub.add_argument("--variant", help="a block of overrides the problems declare (e.g. main: the compact comparison "
                     "of ./dev run); --quick is --variant quick")
    sub.add_argument("--epsilon", type=float, action="append", help="run at this ε only (repeatable)")
    sub.add_argument("--seeds", type=int, help="seeds per cell instead of the problem's")
    sub.add_argument("--file", help="a problems file (default: the bundled problems.toml)")
    sub.add_argument("--data-dir")
    sub.add_argument("--out", help="output directory (default results/bench, results/bench-quick); finished jobs "
                     "are saved in its runs/ folder, and the same command run again resumes from them")
    sub.add_argument("--workers", type=int, help="processes running the tunings in parallel (default: one per core)")
    sub.add_argument("--seed", type=int, help="make the bench reproducible (every ε then rests on the seed staying "
                     "secret; the outputs do not show it); default: one secret from the operating system per bench, "
                     "kept in --out's runs/ folder for resuming")
    common(sub)

    sub = commands.add_parser("data", help="list, describe or download data sets")
    sub.add_argument("action", choices=("list", "info", "fetch"))
    sub.add_argument("name", nargs="?")
    sub.add_argument("--data-dir")
    common(sub)
    return parser


HANDLERS = {"account": _account, "calibrate": _calibrate, "run": _run, "audit": _audit, "reproduce": _reproduce,
            "data": _data, "tune": _tune, "bench": _bench}


#: Exit code of a ``run`` that diverged.
EXIT_DIVERGED = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpopt`` console script."""
    args = _parser().parse_args(argv)
    try:
        with _warnings_in_one_line():
            result = HANDLERS[args.command](args)
    except _validate.DpoptError as err:
        sys.stderr.write(f"dpopt: error: {err}\n")
        return 2
    except KeyboardInterrupt as err:
        kept = _kept(args, err)
        sys.stderr.write(f"dpopt: interrupted{'; ' + kept if kept else ''}\n")
        return 130
    if result is None:  # a data-parallel rank other than 0 (torchrun): rank 0 prints
        return 0
    print(report.to_json(result) if args.json else _human(args.command, result))
    if args.command == "run" and result["diverged_at"] is not None:
        sys.stderr.write(f"dpopt: error: the run {result['stopped']} (try a smaller --lr); its history, "
                         f"checkpoint and ledger are in {result['out']}\n")
        return EXIT_DIVERGED
    return 0


@contextlib.contextmanager
def _warnings_in_one_line() -> Iterator[None]:
    """dpopt's own warnings (:class:`~dpopt._validate.DpoptWarning`) as one line ``dpopt: warning: …``
    on standard error, every time; other warnings as Python shows them."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", _validate.DpoptWarning)
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *where: Any, **more: Any) -> None:
            if issubclass(category, _validate.DpoptWarning):
                sys.stderr.write(f"dpopt: warning: {message}\n")
            else:
                shown(message, category, *where, **more)

        warnings.showwarning = show
        yield


def _kept(args: argparse.Namespace, interrupt: KeyboardInterrupt) -> str:
    """What an interrupted command kept: its own account (``reproduce``), ``run``'s checkpoint, or
    nothing to say."""
    if str(interrupt):
        return str(interrupt)
    if args.command == "run":
        saved = _out(args) / "checkpoint.pt"
        return (f"the last checkpoint, {saved}, is intact: run the same command again to resume" if saved.exists()
                else "no checkpoint was written yet")
    return ""


def _human(command: str, result: Any) -> str:
    if command == "account" and "explain" in result:
        lines = [f"AClip paper's noise for ε = {result['claimed_epsilon']:g}, δ = {result['delta']:g}, "
                 f"q = {result['sampling_rate']:.4g}, {result['restarts']} × {result['steps_per_stage']} steps "
                 f"(per stage ε̂ = {result['stage_epsilon']:.4g}, δ̂ = {result['stage_delta']:.3g}): "
                 f"σ̂/λ = {result['sigma_over_lambda']:.6g}"]
        lines += [f"  sensitivity {row['sensitivity']}: noise multiplier {row['noise_multiplier']:.6g}, "
                  f"exact ε = {row['epsilon']:.6g} ({result['accountant']}, {result['neighboring_relation']})"
                  for row in result["rows"]]
        return "\n".join(lines)
    if command == "account":
        return (f"ε = {result['epsilon']:.6g} at δ = {result['delta']:g} ({result['accountant']}, "
                f"{result['neighboring_relation']})")
    if command == "calibrate":
        return (f"noise multiplier = {result['noise_multiplier']:.6g} gives ε = {result['epsilon']:.6g} at "
                f"δ = {result['delta']:g} ({result['accountant']}, {result['neighboring_relation']})")
    if command == "tune":
        from .tuning.command import summary

        return summary(result)
    if command == "bench":
        return result["markdown"]
    if command == "reproduce":
        return f"wrote results for {result['experiment']} ({result['seeds']} seeds)"
    if command == "audit":
        details = {key: value for key, value in result.items() if key != "verdict"}
        return f"{report.to_json(details, indent=2)}\n{result['verdict']}"
    return report.to_json(result, indent=2)


if __name__ == "__main__":
    sys.exit(main())
