"""``reproduce(name)``: run a preset experiment over seeds and write its report.

For each problem (data set and model), ε and method: take the preset's tuned hyper-parameters
(or tune them again with ``retune``), calibrate the noise on the method's planned event, run
every seed, and summarise the final metrics. The preset's pairs of methods (``COMPARISONS``) are
compared by one-sided Welch t-tests on the preset's test metrics. Written under ``out``:
``results.json`` (the machine-readable form documented in docs/cli.md), ``results.md`` and
figures, all atomically; and ``runs/``, every finished run, saved as it completes, so that an
interrupted reproduction resumes where it stopped (the same command loads the saved runs instead
of running them again, with the same results; runs saved by other code are not reused).

Randomness: the runs use the published seeds 0, 1, … (and the tunings theirs), so that anyone can
rerun them; the report says so (:data:`PUBLISHED`): an ε here is what a method's mechanism spends,
not a guarantee for these runs. Data preparation: each problem's, as its preset declares it
(:mod:`dpopt.jobs.preparation`), is stated in results.json's facts and results.md, and a
preparation that reads the data is labelled NOT PRIVATE there and in the figures' titles.

A preset is an :class:`~dpopt.experiments.preset.Experiment` (its fields are documented there).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import cast

from tqdm import tqdm

from .. import _validate, atomic, outputs, report
from ..json_types import JsonObject, JsonValue
from ..report import Curve
from ..train import History
from ..jobs import Pool, Saved, made_for, one_sided_p, running, source_digest
from ._runner import Method, Params, Problem, explore_grid, mean_curve, metrics, start_rows
from .declared import PaperEntry
from .payload import ClassifiedRow, PaperRow, Payload, ProblemKey, Results, Row, TTest, Tuned
from ..jobs.preparation import LABEL, described, is_public
from .preset import Experiment


def _preset(name: str) -> Experiment:
    from . import EXPERIMENTS

    _validate.one_of("experiment", name, EXPERIMENTS)
    return EXPERIMENTS[name]


#: Axis labels of the logged quantities curves can be drawn against (``CURVES`` values ``(metric, x)``).
X_LABELS = {"passes": "data passes (epochs)", "expected_passes": "expected data passes (epochs)",
            "wall_time_s": "training wall time (s)"}

#: ``--quick`` runs 2 seeds of every method for this fraction of its steps (noise calibrated for
#: the shorter run): a smoke test of the whole pipeline, not numbers to compare with the paper.
QUICK_STEPS = 0.25
#: Where a reproduction's randomness comes from (results.json's ``randomness``).
PUBLISHED = ("published seeds: the runs of every row use seeds 0 to {last}, and a tuning run here seeds {tuning}; "
             "anyone can recompute every run's batches and noise, so each ε is what the method's mechanism spends, "
             "not a guarantee for these published runs (a reproduction, not a private release)")


def reproduce(name: str, *, seeds: int | None = None, quick: bool = False, out: str | Path | None = None,
              data_dir: str | None = None, retune: bool = False, progress: bool = False,
              workers: int | None = None, only: Sequence[str] = ()) -> Results:
    """Run experiment ``name`` and write its report under ``out`` (default ``results/<name>``).

    Seeds run in ``workers`` processes (default: one per core); their number defaults to the
    preset's ``SEEDS`` (10 if it has none), 2 under ``quick``. ``out`` is checked (a writable
    folder) before any work; every finished run is saved in ``out/runs`` as it completes, and runs
    saved there are loaded, not run again. ``progress``: a bar over the runs, with an ETA.
    Interrupted (KeyboardInterrupt), it stops its workers and raises KeyboardInterrupt saying how
    many runs are saved and how to resume. ``only``: run just the rows whose ``problem/method/ε``
    matches one of these shell patterns (e.g. ``scatternet:mnist/DP-SGD/3.0``; :func:`selected`),
    all rows if empty; results.json and results.md state the patterns."""
    exp = _preset(name)
    n_seeds = _validate.positive_int("seeds", seeds if seeds is not None else
                                     (2 if quick else exp.SEEDS))
    workers = _validate.positive_int("workers", workers if workers is not None else os.cpu_count() or 1)
    jobs = selected(_jobs(exp, exp.problems(quick)), tuple(only))  # before any data is read or file written
    with made_for(Path(out) if out else Path("results") / name) as out_dir:
        pool = Pool(workers, _problem_of, name, data_dir, saved=Saved.of(out_dir, f"{name} {source_digest()}"),
                    progress=progress)
        with running(pool):
            payload = _run_all(exp, jobs, data_dir, n_seeds, quick, retune, progress, pool, tuple(only))
        _write(out_dir, payload, exp)
    return _classified(payload)


def _problem_of(name: str, data_dir: str | None, key: ProblemKey) -> Problem:
    """The experiment's problem ``key`` alone (built in each worker process)."""
    return _preset(name).problem(data_dir, key)[0]


def _jobs(exp: Experiment, keys: tuple[ProblemKey, ...]) -> list[tuple[ProblemKey, Method, float]]:
    """(problem key, method, ε) of every row, in the preset's order of problems, ε and methods; a
    non-private method once per problem (it does not depend on ε). Known without reading any data."""
    jobs, seen = [], set()
    for key in keys:
        for epsilon in exp.EPSILONS:
            for method in exp.methods(epsilon, key):
                if method.private or (key, method.name) not in seen:
                    jobs.append((key, method, epsilon))
                seen.add((key, method.name))
    return jobs


def selected(jobs: list[tuple[ProblemKey, Method, float]],
             only: tuple[str, ...]) -> list[tuple[ProblemKey, Method, float]]:
    """The jobs whose ``problem/method/ε`` (``method/ε`` in a preset of one problem; ε
    ``non-private`` for a non-private method) matches one of the shell patterns ``only`` (``*``,
    ``?``, ``[…]``; all jobs if empty); a DpoptError listing the rows if none does."""
    names = [f"{'' if key is None else f'{key}/'}{method.name}/{epsilon if method.private else 'non-private'}"
             for key, method, epsilon in jobs]
    chosen = [job for job, name in zip(jobs, names) if not only or any(fnmatchcase(name, p) for p in only)]
    if not chosen:
        raise _validate.DpoptError(f"only={list(only)!r} matches no row; the rows are: {', '.join(names)}")
    return chosen


def _built(exp: Experiment, keys: tuple[ProblemKey, ...],
           data_dir: str | None) -> Iterator[tuple[ProblemKey, tuple[Problem, JsonObject]]]:
    """The problems ``keys``, each with its facts, in the order their runs are queued: costliest
    first, so the workers' last runs are short ones (a stable order: the preset's among equals).
    Where every problem declares a run's cost before its data are read (:meth:`Experiment.run_cost`),
    each is built just before its runs are queued, so the workers run the first problems' runs while
    the next are built (mnist-sota: the CNN's runs while the scattering features are computed); else
    all are built first and ordered by records × dimensions (:attr:`Problem.queue_weight`)."""
    declared = {key: exp.run_cost(key) for key in keys}
    if all(cost is not None for cost in declared.values()):
        for key in sorted(keys, key=lambda key: -cast(float, declared[key])):
            yield key, exp.problem(data_dir, key)
        return
    built = {key: exp.problem(data_dir, key) for key in keys}
    for key in sorted(keys, key=lambda key: -built[key][0].queue_weight):
        yield key, built.pop(key)


def _run_all(exp: Experiment, jobs: list[tuple[ProblemKey, Method, float]], data_dir: str | None, n_seeds: int,
             quick: bool, retune: bool, progress: bool, pool: Pool, only: tuple[str, ...] = ()) -> Payload:
    """Run ``jobs`` (:func:`selected`), building only the problems they need, the costliest problems'
    runs queued first (:func:`_built`)."""
    started = time.perf_counter()
    rows: list[Row] = []
    tuning: dict[str, Tuned] = {}
    curves: dict[tuple[ProblemKey, str, float | None], list[History]] = {}
    chosen: dict[tuple[ProblemKey, str], Params] = {}  # with TUNE_EPSILON: one tuning per method
    test_metrics = exp.TEST_METRICS
    log_points = 10 if quick else exp.LOG_POINTS
    # every run is queued before any is awaited: the workers stay busy to the end
    started_runs: list[tuple[ProblemKey, str, float | None, float, Params, Callable[[], list[History]]]] = []
    keys = tuple(key for key in exp.problems(quick) if any(job[0] == key for job in jobs))
    stated: dict[ProblemKey, JsonObject] = {}
    pool.expect(sum(1 if method.deterministic else n_seeds for _, method, _ in jobs))
    for key, (problem, given) in _built(exp, keys, data_dir):
        stated[key] = given | {"preparation": described(exp.preparation(key))}
        delta, queued = exp.delta(key), []
        for _, method, epsilon in (job for job in jobs if job[0] == key):  # the preset's order
            params, tuned = _params(method, epsilon if method.private else None, retune, problem, exp, progress,
                                    pool, key, delta, chosen)
            if tuned:
                tuning[f"{'' if key is None else f'{key} '}{method.name} "
                       f"ε={epsilon if method.private else None}"] = tuned
            queued.append((method, params, epsilon))
        waits = start_rows(queued, problem, delta=delta, seeds=range(n_seeds), log_points=log_points,
                           step_fraction=QUICK_STEPS if quick else 1.0, pool=pool, key=key)
        for (method, params, epsilon), wait in zip(queued, waits, strict=True):  # (rows of one run share it)
            started_runs.append((key, method.name, epsilon if method.private else None, delta, params, wait))
        del problem  # its runs are queued, and the workers build their own (mnist-sota's views: 4.8 GB a process)
    stated = {key: stated[key] for key in keys}  # reported in the preset's order
    started_runs.sort(key=lambda run: keys.index(run[0]))  # (a stable sort)
    for key, name, row_epsilon, delta, params, wait in started_runs:  # row_epsilon: None for a non-private method
        histories = wait()
        rows.append({"problem": key, "algorithm": name, "epsilon": row_epsilon, "seeds": len(histories),
                     "delta": delta, "params": params, "metrics": metrics(histories, exp.METRICS),
                     "accountant": histories[0].accountant,
                     "neighboring_relation": histories[0].neighboring_relation,
                     "_final": {m: [h.final[m] for h in histories] for m in test_metrics}})
        curves[(key, name, row_epsilon)] = histories
        if progress:
            tqdm.write(f"  {key or ''} {name:>8} ε={row_epsilon}: training objective (NOT PRIVATE) "
                       f"{rows[-1]['metrics']['objective']['mean']:.5f}", file=sys.stderr)
    tests = _t_tests(rows, exp.COMPARISONS, test_metrics)
    for row in rows:
        del row["_final"]
    facts: JsonObject = {str(key): value for key, value in stated.items()}
    if not exp.keyed:
        for row in rows:
            del row["problem"]
        facts = stated[None]
    return {
        "experiment": exp.NAME, "rows": rows,
        "randomness": PUBLISHED.format(last=n_seeds - 1, tuning=", ".join(map(str, exp.TUNING_SEEDS))),
        "paper": [_paper_row(row, exp.delta) for row in exp.PAPER],
        "seeds": n_seeds, "quick": quick, "log_points": log_points, "facts": facts, "t_tests": tests,
        "only": list(only),
        "grids": {m.name: m.grid for m in exp.methods(exp.EPSILONS[0], exp.problems(quick)[0])},
        "tuning": tuning or exp.TUNING_COST, "wall_time_s": time.perf_counter() - started, "_curves": curves,
    }


def _params(method: Method, epsilon: float | None, retune: bool, problem: Problem, exp: Experiment,
            progress: bool, pool: Pool, key: ProblemKey, delta: float,
            chosen: dict[tuple[ProblemKey, str], Params]) -> tuple[Params, Tuned | None]:
    """The preset's tuned hyper-parameters for ``epsilon`` (None for a non-private method), or tune.

    A method with an empty grid is never tuned (its one point is its setting). A preset with
    ``TUNE_EPSILON`` tunes each method once, at that ε, and uses the choice at every ε."""
    if epsilon in method.tuned and (not retune or not method.grid):
        return method.tuned[epsilon], None
    at = exp.TUNE_EPSILON
    if at is not None and (key, method.name) in chosen:
        return chosen[(key, method.name)], None
    result = (method.tuner or explore_grid)(method, problem, epsilon=at or epsilon or exp.EPSILONS[0], delta=delta,
                                            seeds=exp.TUNING_SEEDS, progress=progress, pool=pool, key=key)
    chosen[(key, method.name)] = result["chosen"]
    return result["chosen"], result


def _t_tests(rows: Sequence[Row], pairs: Sequence[tuple[str, str]], test_metrics: Sequence[str]) -> list[TTest]:
    """One-sided Welch tests of mean(ours) < mean(baseline), per problem and ε, for each pair."""
    by_key = {(row.get("problem"), row["algorithm"], row["epsilon"]): row for row in rows}
    tests: list[TTest] = []
    for (key, name, epsilon), row in by_key.items():
        for ours, baseline in pairs:
            other = by_key.get((key, baseline, epsilon))
            if name == ours and other is not None:
                tests.append({**({"problem": key} if key is not None else {}), "epsilon": epsilon, "ours": ours,
                              "baseline": baseline, **{
                                  f"p_{metric}": one_sided_p(row["_final"][metric], other["_final"][metric])
                                  for metric in test_metrics}})
    return tests


def _paper_row(row: PaperEntry, delta_of: Callable[[ProblemKey], float]) -> PaperRow:
    """A row of the paper's table (:meth:`~dpopt.experiments.declared.Declared.paper`) with its
    problem's δ, each metric as its mean and std (None where the paper gives none)."""
    def metric(value: JsonValue | tuple[JsonValue, ...]) -> dict[str, JsonValue]:
        mean, std = value if isinstance(value, tuple) else (value, None)
        return {"mean": mean, "std": std}

    problem, algorithm, epsilon = row.get("problem"), row["algorithm"], row["epsilon"]
    if not (isinstance(problem, str | None) and isinstance(algorithm, str)
            and (epsilon is None or isinstance(epsilon, int | float))):
        raise _validate.DpoptError(f"paper row {row!r}: problem and algorithm must be names, epsilon a number")
    metrics = {k: metric(v) for k, v in row.items() if k not in ("problem", "algorithm", "epsilon")}
    if problem is None:
        return {"algorithm": algorithm, "epsilon": epsilon, "delta": delta_of(None), "metrics": metrics}
    return {"problem": problem, "algorithm": algorithm, "epsilon": epsilon, "delta": delta_of(problem),
            "metrics": metrics}


def _write(out_dir: Path, payload: Payload, exp: Experiment) -> None:
    curves = payload["_curves"]
    report.write_json(out_dir / "results.json", _classified(payload))
    atomic.write_text(out_dir / "results.md", _markdown(payload, exp))
    exp.figures(out_dir, payload)  # a preset's own figures beside the curves
    shown = {_titled(title, spec): (spec, "passes") if isinstance(spec, str) else spec  # a metric, or (metric, x)
             for title, spec in exp.CURVES.items()}
    for key in exp.problems(payload["quick"]):
        for epsilon in exp.EPSILONS:
            panels: dict[str, dict[str, Curve]] = {title: {} for title in shown}
            for (problem, method, eps), histories in curves.items():
                if problem == key and eps in (epsilon, None):
                    for title, (metric, x) in shown.items():
                        panels[title][method] = mean_curve(histories, metric, x)
            if not any(panels.values()):
                continue  # no method runs at this ε on this problem
            name = f"curves_eps{epsilon}.png" if key is None else f"curves_{key.replace(':', '-')}_eps{epsilon}.png"
            unlabelled = is_public(exp.preparation(key))
            deltas = {row["delta"] for row in payload["rows"]
                      if row.get("problem") == key and row["epsilon"] == epsilon}
            report.curves_figure(out_dir / name, panels, log_x=True,
                                 xlabel={title: X_LABELS[x] for title, (_, x) in shown.items()},
                                 title=f"{exp.NAME}{f' {key}' if key is not None else ''}: private methods at ε = "
                                       f"{epsilon:g}, δ = {', '.join(f'{d:g}' for d in sorted(deltas))} (non-private "
                                       f"ones: ε = ∞)\nmean over {payload['seeds']} seeds, band ± 1 std"
                                       + ("" if unlabelled else f"\n{LABEL}: no ε here is a guarantee")
                                       + (f"\n{exp.FIGURE_NOTE}" if exp.FIGURE_NOTE else ""))


def _classified(payload: Payload) -> Results:
    """results.json, every field classified (:mod:`dpopt.outputs`): the private results, and apart
    under ``"diagnostics"`` (labelled) each row's non-private metrics, the facts and t-tests computed
    from training-data metrics, the non-private tuning and the wall time."""
    rows: list[ClassifiedRow] = []
    for row in payload["rows"]:
        private, diagnostic = outputs.split(row["metrics"])
        rows.append({**row, "metrics": private, "diagnostics": {"label": outputs.NOT_PRIVATE, "metrics": diagnostic}})
    facts = _by_problem(payload["facts"])
    public_facts = [{k: v for k, v in f.items() if k not in outputs.DIAGNOSTIC_FACTS} for f in facts]
    training_facts = [{k: v for k, v in f.items() if k == "problem" or k in outputs.DIAGNOSTIC_FACTS} for f in facts]
    tests = [_split_test(test) for test in payload["t_tests"]]
    return {
        "experiment": payload["experiment"], "randomness": payload["randomness"], "paper": payload["paper"],
        "seeds": payload["seeds"], "quick": payload["quick"], "log_points": payload["log_points"],
        "grids": payload["grids"], "only": payload["only"], "rows": rows, "facts": public_facts,
        "t_tests": [private for private, _ in tests if _tested(private)],
        "diagnostics": {"label": outputs.NOT_PRIVATE, "facts": [f for f in training_facts if len(f) > 1],
                        "t_tests": [diagnostic for _, diagnostic in tests if _tested(diagnostic)],
                        "tuning": payload["tuning"],
                        "wall_time_s": payload["wall_time_s"]}}


def _by_problem(facts: JsonObject) -> list[JsonObject]:
    """A preset's facts as a list of records, ``problem`` naming the problem where there are several."""
    if facts and all(isinstance(value, dict) and key not in outputs.PUBLIC_BY_NAME for key, value in facts.items()):
        return [{"problem": key, **value} for key, value in facts.items() if isinstance(value, dict)]
    return [facts]


def _tested(test: Mapping[str, object]) -> bool:
    return any(key.startswith("p_") for key in test)


def _split_test(test: TTest) -> tuple[TTest, TTest]:
    """A t-test row's p-values on private metrics, and those on non-private ones (with the row's keys)."""
    keys = {k: v for k, v in test.items() if not k.startswith("p_")}
    private = {k: v for k, v in test.items() if k.startswith("p_") and outputs.is_private(k.removeprefix("p_"))}
    return keys | private, keys | {k: v for k, v in test.items() if k.startswith("p_") and k not in private}


def _titled(title: str, spec: str | tuple[str, str]) -> str:
    """A figure panel's title, labelled when the metric it shows is not private."""
    metric = spec if isinstance(spec, str) else spec[0]
    return title if outputs.is_private(metric) else f"{title} (NOT PRIVATE)"


def _markdown(payload: Payload, exp: Experiment) -> str:
    keyed = payload["rows"] and "problem" in payload["rows"][0]
    table_metrics, paper_metrics, test_metrics = list(exp.TABLE_METRICS), list(exp.PAPER_METRICS), exp.TEST_METRICS
    head = (["problem"] if keyed else []) + ["algorithm", "epsilon"]
    # the ledger's ε beside the target
    shown = {c: f"spent {c}" if c in head else outputs.shown(c) for c in table_metrics}
    paper_by_key = {(r.get("problem"), r["algorithm"], r["epsilon"]): r["metrics"] for r in payload["paper"]}
    table_rows = []
    for row in payload["rows"]:
        paper = paper_by_key.get((row.get("problem"), row["algorithm"], row["epsilon"]), {})
        table_rows.append({**{c: row.get(c) for c in head}, "epsilon": row["epsilon"] or "non-private",
                           "seeds": row["seeds"], **{shown[c]: row["metrics"][c] for c in table_metrics},
                           **{f"paper {c}": _paper_cell(paper.get(c)) for c in paper_metrics}})
    first = payload["rows"][0]
    chosen = [{"row": (f"{r.get('problem')} " if keyed else "") + f"{r['algorithm']} "
               + ("non-private" if r["epsilon"] is None else f"ε={r['epsilon']}"),
               "hyper-parameters": report.assignments(r["params"]) or "none"} for r in payload["rows"]]
    lines = [
        f"# {payload['experiment']}", "",
        f"{payload['seeds']} seeds (mean (std)); δ = {_deltas(payload['rows'])}; accountant: {first['accountant']}; "
        f"adjacency: {first['neighboring_relation']} (private rows). Wall time {payload['wall_time_s']:.0f} s."
        + (f" **Quick mode: {QUICK_STEPS:.0%} of every method's steps; not comparable with the paper.**"
           if payload["quick"] else "")
        + (f" **Only the rows matching {', '.join(f'`{p}`' for p in payload['only'])}.**" if payload["only"] else ""),
        "",
        f"Randomness: {payload['randomness']}.", "",
        *_preparation_lines(exp, payload["quick"]),
        report.markdown_table(table_rows,
                              head + ["seeds"] + list(shown.values()) + [f"paper {c}" for c in paper_metrics]),
        "", "`seeds`: runs behind the row (1 for a method whose runs do not depend on the seed).", "",
        "## One-sided Welch t-tests (ours < baseline), p-values", "",
        report.markdown_table([row | {f"p_{outputs.shown(m)}": row[f"p_{m}"] for m in test_metrics}
                               for row in payload["t_tests"]],
                              (["problem"] if keyed else []) + ["epsilon", "ours", "baseline"]
                              + [f"p_{outputs.shown(m)}" for m in test_metrics]), "",
        f"Columns marked (NOT PRIVATE): {outputs.NOT_PRIVATE}; the papers report them.", "",
        "## Notes", "", exp.notes(payload), "",
        "## Tuning", "", "Grids:", "", *_bullets(payload["grids"]), "",
        "Chosen (NOT PRIVATE where tuned here: selected on training-data objectives):", "",
        report.markdown_table(chosen, ["row", "hyper-parameters"]), "",
        *_tuned_by(exp, payload["tuning"]),
        "Tuning cost (NOT PRIVATE tuning: its privacy cost is not in the ε above):", "",
        *_bullets(_tuning_cost(payload["tuning"])), "",
    ]
    return "\n".join(lines)


def _preparation_lines(exp: Experiment, quick: bool) -> list[str]:
    """How each problem's data were prepared, in bold where it is NOT PRIVATE."""
    lines = []
    for key in exp.problems(quick):
        preparation = exp.preparation(key)
        text = f"Data preparation{f' of `{key}`' if key is not None else ''}: {described(preparation)}."
        lines += [text if is_public(preparation) else f"**{text}**", ""]
    return lines


def _deltas(rows: Sequence[Row]) -> str:
    """The δ of the rows: one value, or one per problem."""
    per = {row.get("problem"): row["delta"] for row in rows}
    if len(set(per.values())) == 1:
        return f"{rows[0]['delta']:g}"
    return ", ".join(f"{delta:.3g} ({problem})" for problem, delta in per.items())


def _paper_cell(value: Mapping[str, JsonValue] | None) -> JsonValue | Mapping[str, JsonValue]:
    if value is None:
        return ""
    return value if value["std"] is not None else value["mean"]


def _bullets(mapping: Mapping[str, object]) -> list[str]:
    """One markdown bullet per entry, ``key: value`` (:func:`_readable`); "none" for an empty mapping."""
    return [f"* {key}: {_readable(value)}" for key, value in mapping.items()] or ["* none"]


def _readable(value: object) -> str:
    """A value of results.json for a person: a mapping as ``name = value, …`` (:func:`dpopt.report.assignments`;
    "none" if empty), a list as ``{a, b}`` (a grid's values), a number to four significant digits."""
    if isinstance(value, Mapping):
        return report.assignments({key: _readable(item) for key, item in value.items()}) or "none"
    if isinstance(value, list | tuple):
        return "{" + ", ".join(_readable(item) for item in value) + "}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _tuned_by(exp: Experiment, tuning: Mapping[str, object]) -> list[str]:
    """Who chose the rows' hyper-parameters: this run for the rows it tuned (``tuning``'s entries
    with a choice), the preset's recorded tuning (``TUNED_BY``) for the others."""
    here = [key for key, value in tuning.items() if isinstance(value, dict) and "chosen" in value]
    if here:
        others = f" Any other row keeps the preset's values, chosen by {exp.TUNED_BY}." if exp.TUNED_BY else ""
        return [f"Tuned by this run: {', '.join(here)}.{others}", ""]
    return [f"The preset's values were chosen by {exp.TUNED_BY}.", ""] if exp.TUNED_BY else []


def _tuning_cost(tuning: Mapping[str, object]) -> dict[str, object]:
    return {key: value.get("cost", value) if isinstance(value, dict) else value for key, value in tuning.items()}
