"""``dpopt run``: train one algorithm on one data set at a target ε, here, in ``--nproc``
data-parallel processes, or as one rank of torchrun's group.

The request holds everything checked before any work: the algorithm (by the registry), the data
(:mod:`dpopt.cli.sources`), its hyper-parameters by name (the flags the algorithms' parameter
dataclasses declare for ``run``), and the output folder. The plan (:func:`dpopt.plan.plan_for`) is built once, when the
number of records is known, and checks δ, the steps and n; :func:`dpopt.train.train` runs it.

``--out``: a finished run (its ``history.json``) is never run again nor overwritten; a run
interrupted mid-way resumes from its checkpoint. The lock that keeps two runs off one checkpoint
is :func:`dpopt.train.train`'s (:mod:`dpopt.lock`): this command touches ``--out`` only through
``train`` and then writes its results atomically, so a run refused before training leaves nothing
there.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .. import _validate, atomic, report
from ..algorithms import registry
from ..names import ACCOUNTANTS, TABULAR
from .common import (Command, add_delta, add_knobs, add_seed, algorithm_help, knobs_of, seed_of, Subcommands,
                     subcommand)
from .output import EXIT_DIVERGED, Output, cell
from .sources import Source, TrainingRequest, add_flags

if TYPE_CHECKING:
    from ..data.own import Described
    from ..plan import Plan
    from ..train import History

BACKENDS = ("local", "torch")
S = TypeVar("S")


@dataclass(frozen=True, kw_only=True)
class RunRequest(TrainingRequest):
    """One run of the algorithm (a private one), its noise calibrated to the target, with the
    hyper-parameters ``knobs`` (by name); results in ``out``; ``nproc`` processes
    (``backend`` "torch": a federated algorithm's clients on ranks 1.., the server on rank 0)."""

    knobs: dict[str, object]
    backend: str
    accountant: str
    seed: int | None
    diagnostics: bool
    max_epsilon: float | None
    checkpoint_every: int
    out: Path
    nproc: int
    rank_timeout: float

    @classmethod
    def parse(cls, args: argparse.Namespace) -> RunRequest:
        from .. import distributed
        from ..building import private_entry

        entry = registry.entry(args.algorithm)
        nproc = _validate.positive_int("nproc", args.nproc)
        rank_timeout = _validate.positive("rank_timeout", distributed.RANK_TIMEOUT if args.rank_timeout is None
                                          else args.rank_timeout)
        processes = max(nproc, distributed.world_size())
        if processes > 1 and args.noise != "torch":  # data-parallel ranks must add one shared draw
            raise _validate.DpoptError(f"noise={args.noise!r} draws independently in every process; data-parallel "
                                       f"runs ({processes} processes) need noise='torch' (one draw from the shared "
                                       "seed)")
        _validate.one_of("backend", args.backend, BACKENDS)
        if args.backend == "torch" and not entry.federated:
            raise _validate.DpoptError(f"backend='torch' runs the federated algorithms "
                                       f"({', '.join(registry.REGISTRY.federated)}); "
                                       f"algorithm={args.algorithm!r} is data-parallel with --nproc alone")
        if args.backend == "torch" and nproc == 1 and distributed.world_size() == 1:
            raise _validate.DpoptError("nproc=1 must be >= 2 with backend='torch' (rank 0 is the server)")
        _validate.positive("epsilon", args.epsilon)  # the public settings first: before --out's state is read
        _validate.open_unit("delta", args.delta)
        _validate.positive_int("steps", args.steps)
        if args.max_epsilon is not None:
            _validate.positive("max_epsilon", args.max_epsilon)
        data = Source.parse(args)
        private_entry(args.algorithm, args.epsilon)
        return cls(**cls.given(args, data), knobs=knobs_of(args, "run"), backend=args.backend,
                   accountant=args.accountant, seed=seed_of(args), diagnostics=args.diagnostics,
                   max_epsilon=args.max_epsilon, checkpoint_every=args.checkpoint_every,
                   out=Path(args.out or f"results/run-{args.algorithm}-{data.name}"), nproc=nproc,
                   rank_timeout=rank_timeout)

    @property
    def checkpoint(self) -> Path:
        return self.out / "checkpoint.pt"

    def interrupted(self) -> str:
        return (f"the last checkpoint, {self.checkpoint}, is intact: run the same command again to resume"
                if self.checkpoint.exists() else "no checkpoint was written yet")


def handle(request: RunRequest) -> Output | None:
    """Train here, in ``--nproc`` processes, or as one rank of torchrun's group (an ``--out`` that
    holds a finished run is refused first); rank 0's result (None on the other ranks, which write
    and print nothing)."""
    from .. import distributed, journal

    journal.outside(request.out)  # its checkpoints are tagged under the state folder's key
    unfinished(request)
    if request.nproc > 1 and distributed.world_size() == 1:
        return distributed.launch(in_group, request.nproc, request, rank_timeout=request.rank_timeout)[0]
    return in_group(request)


def in_group(request: RunRequest) -> Output | None:
    """:func:`train_and_write` in the process group torchrun describes, if any (joined here, and
    left at the end)."""
    import torch

    from .. import distributed

    created = distributed.init_from_env(rank_timeout=request.rank_timeout)
    try:
        return train_and_write(request)
    finally:
        if created:
            torch.distributed.destroy_process_group()


def unfinished(request: RunRequest) -> None:
    """Refuse an ``out`` that holds a finished run (``history.json``, written at a run's end): it is
    neither run again nor overwritten (its ε is spent; a new run would start a new ledger). The
    refusal names which of algorithm, data set, model, ε, δ and the settings given on the command
    line (:func:`given_settings`: steps, step size, …) differ from that run's."""
    out = request.out
    if not (out / "history.json").exists():
        return
    if not (out / "checkpoint.pt").exists():
        raise _validate.DpoptError(f"out={str(out)!r} holds the results of a run (history.json) but not its "
                                   "checkpoint.pt, so it cannot be resumed; use another --out for a new run")
    try:
        finished = json.loads((out / "history.json").read_text())
    except (OSError, ValueError):
        finished = {}
    asked = {"algorithm": request.algorithm, "dataset": request.data.name, "model": request.model,
             "epsilon_target": request.epsilon, "delta": request.delta}
    differing = [f"{key} {finished.get(key)!r} there, {value!r} here" for key, value in asked.items()
                 if finished.get(key) != value]
    if isinstance(there := finished.get("params"), dict):  # (a run written before they were kept has none)
        here = given_settings(request)
        differing += [f"{key} {there.get(key, 'default')} there, {here.get(key, 'default')} here"
                      for key in sorted(there.keys() | here.keys()) if there.get(key) != here.get(key)]
    other = f" with other settings ({'; '.join(differing)})" if differing else ""
    raise _validate.DpoptError(f"out={str(out)!r} holds a finished run{other} (history.json): its results are "
                               "there. To start over, use another --out, or remove that folder knowingly: the ε the "
                               "run spent on these data stays spent, and history.json is its record")


def given_settings(request: RunRequest) -> dict[str, object]:
    """The run's settings as the command line gave them (public: the user's choices): the steps,
    the regularisation and every hyper-parameter flag with a value (given, or the command line's
    default; a flag without one takes the algorithm's default); kept in ``history.json`` as
    ``params``."""
    knobs = {name: value if isinstance(value, (bool, int, float)) else str(value)
             for name, value in request.knobs.items() if value is not None}
    return {"steps": request.steps, "reg": request.reg, **knobs}


def train_and_write(request: RunRequest) -> Output | None:
    """Prepare the data, build the oracle and the plan (calibrated once, on the oracle's n), train
    (:func:`dpopt.train.train`: its lock keeps other runs off the checkpoint), and on rank 0 write
    the results."""
    import torch

    from .. import distributed
    from ..building import fits, metric_of, oracle_for
    from ..mechanisms import source_named
    from ..oracles.torch_model import TorchModel
    from ..plan import plan_for
    from ..train import Options, OsSeed, train

    lead = distributed.rank() == 0
    described = request.data.prepared()
    dataset = described.dataset
    fits(request.model, dataset)
    oracle = oracle_for(request.model, torch.as_tensor(dataset.X_train), torch.as_tensor(dataset.y_train),
                        task=dataset.task, classes=described.classes, reg=request.reg)
    test_error = metric_of(request.model, oracle, dataset.X_test, dataset.y_test, task=dataset.task)
    processes = distributed.world_size()
    trained = distributed.Sharded(oracle) if processes > 1 and request.backend == "local" else oracle
    knobs = registry.Knobs.of(oracle.n, **request.knobs, backend=distributed.backend(request.backend))
    plan = plan_for(registry.entry(request.algorithm).build(knobs), n=oracle.n, steps=request.steps,
                    delta=request.delta, epsilon=request.epsilon, accountant=request.accountant,
                    allow_large_delta=request.allow_large_delta)
    seed = request.seed if request.seed is not None or processes == 1 else OsSeed(distributed.shared_secret_seed())
    with distributed.resumable(request.checkpoint) as checkpoint_path:  # rank 0 alone writes out/
        theta0 = oracle.flat_params() if isinstance(oracle, TorchModel) else None  # the network's initialisation
        options = Options(seed=seed, noise_source=source_named(str(request.knobs["noise"])),
                          test_error=test_error if lead else None,
                          checkpoint_path=checkpoint_path, checkpoint_every=request.checkpoint_every if lead else None,
                          max_epsilon=request.max_epsilon, progress=lead and not request.json,
                          diagnostics=request.diagnostics)
        history = train(plan, trained, options, theta0)
    if not lead:
        return None
    return write(request, plan, history, described, processes)


def write(request: RunRequest, plan: Plan[S], history: History, described: Described,
          processes: int) -> Output:
    """``history.json``, ``summary.md`` and ``curves.png`` in ``--out``; what the command shows."""
    dataset = described.dataset
    out = request.out
    payload = {"algorithm": request.algorithm, "dataset": dataset.name, "data_source": dataset.source,
               "model": request.model, "epsilon_target": request.epsilon,
               "hyperparameters": report.settings(plan.algorithm), "params": given_settings(request),
               "processes": processes, "protected_records": described.protected, "test_data": described.test_data,
               **history.to_dict()}
    report.write_json(out / "history.json", payload)
    atomic.write_text(out / "summary.md", summary(request.algorithm, dataset.name, history, described))
    run_figure(out / "curves.png", history, algorithm=request.algorithm, dataset=dataset.name,
               epsilon=request.epsilon,
               test_label="test error (NOT PRIVATE)" if described.test_unprotected else "test error")
    shown = {k: payload[k] for k in ("algorithm", "dataset", "epsilon_target", "final", "delta", "accountant",
                                     "accountant_note", "neighboring_relation", "steps_done", "stopped", "diverged_at",
                                     "randomness", "protected_records", "test_data")} | {"out": str(out)}
    final = history.final
    row = {"algorithm": request.algorithm, "dataset": dataset.name, "ε": final["epsilon"],
           "test error": final["test_error"], "expected passes": final["expected_passes"],
           "steps": history.steps_done}
    lines = [f"δ = {history.delta:g} ({history.accountant}, {history.neighboring_relation}); randomness: "
             f"{history.randomness}", f"protected: {described.protected}; test error on: {described.test_data}"]
    lines += [f"accountant: {history.accountant_note}"] if history.accountant_note else []
    lines += [f"stopped: {history.stopped}"] if history.stopped else []
    if history.diagnostics is not None:  # asked for with --diagnostics: shown, labelled
        diagnosed = history.diagnostics["final"]
        shown["diagnostics"] = {"label": history.diagnostics["label"], "final": diagnosed}
        lines += [f"diagnostics at the output (NOT PRIVATE): "
                  f"{report.assignments({name: cell(value) for name, value in diagnosed.items()})}",
                  history.diagnostics["label"]]
    written = [out / name for name in ("history.json", "summary.md", "curves.png", "checkpoint.pt")]
    if history.diverged_at is None:
        return Output(shown, table=[row], lines=lines, written=written)
    return Output(shown, table=[row], lines=lines, written=written, exit_code=EXIT_DIVERGED,
                  error=f"the run {history.stopped} (try a smaller --lr); its history, checkpoint and ledger are in "
                        f"{out}")


def run_figure(path: Path, history: History, *, algorithm: str, dataset: str, epsilon: float,
               test_label: str = "test error") -> None:
    """``dpopt run``'s figure: the test error (its panel titled ``test_label``) and the ε spent
    against the expected data passes, and the training objective (NOT PRIVATE) if diagnostics were
    asked for; one run, so no spread."""
    passes = [r["expected_passes"] for r in history.records]
    panels: dict[str, dict[str, report.Curve | tuple[list[float], list[float]]]] = {
        test_label: {algorithm: (passes, [r["test_error"] for r in history.records])},
        "ε spent (guarantee)": {algorithm: (passes, [r["epsilon"] for r in history.records])}}
    if history.diagnostics is not None:
        panels["training objective (NOT PRIVATE)"] = {algorithm: (
            passes, [r["objective"] for r in history.diagnostics["records"]])}
    report.curves_figure(path, panels, xlabel="expected data passes",
                         title=f"{algorithm} on {dataset}: one run at target ε = {epsilon:g}, δ = {history.delta:g} "
                               f"({history.accountant})")


def summary(algorithm: str, dataset: str, history: History, described: Described) -> str:
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


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "run", Command(RunRequest.parse, handle),
                     "train one algorithm on one data set at a target ε")
    sub.add_argument("--algorithm", required=True, help=algorithm_help())
    add_flags(sub, "a registered data set (`dpopt data list`; default adult), prepared from the public bounds it "
                   "declares (`dpopt data info NAME`)")
    sub.add_argument("--model", choices=TABULAR, default="logistic", help="mlp: the DIFF2 paper's network (binary: "
                     "one logit and the logistic loss; multiclass: K logits and cross-entropy; regression: squared "
                     "loss)")
    sub.add_argument("--reg", type=float, default=1e-3, help="regularisation λ")
    sub.add_argument("--epsilon", type=float, required=True, help="the target ε of the run")
    add_delta(sub)
    sub.add_argument("--steps", type=int, default=500, help="training steps")
    add_knobs(sub, "run")
    sub.add_argument("--backend", default="local", help="local, or torch: DIFF2's clients on ranks 1..K-1 of "
                     "--nproc K processes (or torchrun's), the server on rank 0")
    sub.add_argument("--accountant", choices=ACCOUNTANTS, default="pld", help="privacy loss distributions "
                     "(tightest) or Rényi DP")
    add_seed(sub, "make the run reproducible (its guarantee then rests on the seed staying secret); default: secret "
             "randomness from the operating system")
    sub.add_argument("--diagnostics", action="store_true", help="also write the training objective, gradient norm, "
                     "realised passes and times, labelled NOT PRIVATE (computed from the training data without noise)")
    sub.add_argument("--max-epsilon", type=float, help="stop before a step that would exceed this ε")
    sub.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (an interrupted run "
                     "resumes from out/)")
    sub.add_argument("--out", help="output directory (default: results/run-<algorithm>-<dataset>)")
    sub.add_argument("--nproc", type=int, default=1, help="data-parallel processes (gloo on 127.0.0.1; the same "
                     "run as one process; under torchrun leave it at 1)")
    sub.add_argument("--rank-timeout", type=float, help="seconds a process of a data-parallel run may stop "
                     "answering before the run is stopped with an error naming it (default: "
                     "dpopt.distributed.RANK_TIMEOUT, 60)")

