"""``reproduce(name)``: run a preset experiment over seeds and write its report.

For each ε and method: take the preset's tuned hyper-parameters (or tune them again with
``retune``), calibrate the noise on the method's planned event, run every seed, and summarise
the final metrics. The method the paper proposes is compared with each private baseline by a
one-sided Welch t-test on final objective and gradient norm. Written under ``out``:
``results.json`` (the machine-readable form documented in the README), ``results.md`` and
figures, all atomically.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .. import _validate, report
from ._runner import Method, Pool, Problem, mean_curve, metrics, one_sided_p, run_seeds, tune


def _module(name: str) -> ModuleType:
    from . import EXPERIMENTS

    _validate.one_of("experiment", name, EXPERIMENTS)
    return EXPERIMENTS[name]


#: ``--quick`` runs 2 seeds of every method for this fraction of its steps (noise calibrated for
#: the shorter run): a smoke test of the whole pipeline, not numbers to compare with the paper.
QUICK_STEPS = 0.25


def reproduce(name: str, *, seeds: int | None = None, quick: bool = False, out: str | Path | None = None,
              data_dir: str | None = None, retune: bool = False, progress: bool = False,
              workers: int | None = None) -> dict[str, Any]:
    """Run experiment ``name`` and write its report under ``out`` (default ``results/<name>``).

    Seeds run in ``workers`` processes (default: one per core)."""
    exp = _module(name)
    n_seeds = _validate.positive_int("seeds", seeds if seeds is not None else (2 if quick else 10))
    workers = _validate.positive_int("workers", workers if workers is not None else os.cpu_count() or 1)
    out_dir = Path(out) if out else Path("results") / name
    problem, facts = exp.problem(data_dir)
    pool = Pool(workers, _problem_of, name, data_dir) if workers > 1 else None
    try:
        payload = _run_all(exp, problem, facts, n_seeds, quick, retune, progress, pool)
    finally:
        if pool is not None:
            pool.close()
    _write(out_dir, payload, exp)
    return {key: value for key, value in payload.items() if key != "_curves"}


def _problem_of(name: str, data_dir: str | None) -> Problem:
    """The experiment's problem alone (built in each worker process)."""
    return _module(name).problem(data_dir)[0]


def _run_all(exp: ModuleType, problem: Problem, facts: dict[str, Any], n_seeds: int, quick: bool, retune: bool,
             progress: bool, pool: Pool | None) -> dict[str, Any]:
    started = time.perf_counter()
    rows, tuning, curves = [], {}, {}
    for epsilon in exp.EPSILONS:
        for method in exp.methods(epsilon):
            if not method.private and any(row["algorithm"] == method.name for row in rows):
                continue  # a non-private reference does not depend on ε: run it once
            params, tuned = _params(method, epsilon if method.private else None, retune, problem, exp, progress, pool)
            if tuned:
                tuning[f"{method.name} ε={epsilon if method.private else None}"] = tuned
            histories = run_seeds(method, params, problem, epsilon=epsilon, delta=exp.DELTA, seeds=range(n_seeds),
                                  log_points=10 if quick else 40, step_fraction=QUICK_STEPS if quick else 1.0,
                                  pool=pool)
            rows.append({"algorithm": method.name, "epsilon": epsilon if method.private else None, "delta": exp.DELTA,
                         "params": params, "metrics": metrics(histories, exp.METRICS),
                         "accountant": histories[0].accountant,
                         "neighboring_relation": histories[0].neighboring_relation,
                         "_final": {m: [h.final[m] for h in histories] for m in ("objective", "grad_norm")}})
            curves[(method.name, rows[-1]["epsilon"])] = histories
            if progress:
                print(f"  {method.name:>8} ε={epsilon}: objective {rows[-1]['metrics']['objective']['mean']:.5f}",
                      flush=True)
    tests = _t_tests(rows, exp.OURS)
    for row in rows:
        del row["_final"]
    return {
        "experiment": exp.NAME, "rows": rows,
        "paper": [_paper_row(row, exp.DELTA) for row in exp.PAPER],
        "seeds": n_seeds, "quick": quick, "facts": facts, "t_tests": tests,
        "grids": {m.name: m.grid for m in exp.methods(exp.EPSILONS[0])},
        "tuning": tuning or exp.TUNING_COST, "wall_time_s": time.perf_counter() - started, "_curves": curves,
    }


def _params(method: Method, epsilon: float | None, retune: bool, problem: Any, exp: ModuleType,
            progress: bool, pool: Pool | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The preset's tuned hyper-parameters for ``epsilon`` (None for a non-private method), or tune."""
    if not retune and epsilon in method.tuned:
        return method.tuned[epsilon], None
    result = tune(method, problem, epsilon=epsilon or exp.EPSILONS[0], delta=exp.DELTA, seeds=exp.TUNING_SEEDS,
                  progress=progress, pool=pool)
    return result["chosen"], result


def _t_tests(rows: list[dict[str, Any]], ours: str) -> list[dict[str, Any]]:
    tests = []
    for row in rows:
        if row["algorithm"] == ours:
            for other in rows:
                if other["epsilon"] == row["epsilon"] and other["algorithm"] != ours:
                    tests.append({"epsilon": row["epsilon"], "ours": ours, "baseline": other["algorithm"], **{
                        f"p_{metric}": one_sided_p(row["_final"][metric], other["_final"][metric])
                        for metric in ("objective", "grad_norm")}})
    return tests


def _paper_row(row: dict[str, Any], delta: float) -> dict[str, Any]:
    def metric(value: Any) -> dict[str, float | None]:
        mean, std = value if isinstance(value, tuple) else (value, None)
        return {"mean": mean, "std": std}

    keys = ("algorithm", "epsilon")
    return {**{key: row[key] for key in keys}, "delta": delta,
            "metrics": {k: metric(v) for k, v in row.items() if k not in keys}}


def _write(out_dir: Path, payload: dict[str, Any], exp: ModuleType) -> None:
    curves = payload["_curves"]
    report.write_json(out_dir / "results.json", {key: value for key, value in payload.items() if key != "_curves"})
    report.write_text(out_dir / "results.md", _markdown(payload, exp))
    for epsilon in exp.EPSILONS:
        panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {"objective": {}, "gradient norm": {}}
        for (method, eps), histories in curves.items():
            if eps in (epsilon, None):
                panels["objective"][method] = mean_curve(histories, "objective")
                panels["gradient norm"][method] = mean_curve(histories, "grad_norm")
        report.curves_figure(out_dir / f"curves_eps{epsilon}.png", panels, xlabel="data passes (epochs)", log_x=True)


def _markdown(payload: dict[str, Any], exp: ModuleType) -> str:
    columns = ["algorithm", "epsilon", "test_error", "objective", "grad_norm", "passes", "cpu_time_s"]
    paper_by_key = {(r["algorithm"], r["epsilon"]): r["metrics"] for r in payload["paper"]}
    table_rows = []
    for row in payload["rows"]:
        paper = paper_by_key.get((row["algorithm"], row["epsilon"]), {})
        table_rows.append({"algorithm": row["algorithm"], "epsilon": row["epsilon"] or "non-private",
                           **{c: row["metrics"][c] for c in columns[2:]},
                           **{f"paper {c}": _paper_cell(paper.get(c)) for c in ("test_error", "grad_norm", "passes")}})
    first = payload["rows"][0]
    lines = [
        f"# {payload['experiment']}", "",
        f"{payload['seeds']} seeds (mean (std)); δ = {first['delta']}; accountant: {first['accountant']}; "
        f"adjacency: {first['neighboring_relation']} (private rows). Wall time {payload['wall_time_s']:.0f} s."
        + (f" **Quick mode: {QUICK_STEPS:.0%} of every method's steps; not comparable with the paper.**"
           if payload["quick"] else ""), "",
        report.markdown_table(table_rows, columns + ["paper test_error", "paper grad_norm", "paper passes"]), "",
        "## One-sided Welch t-tests (ours < baseline), p-values", "",
        report.markdown_table(payload["t_tests"], ["epsilon", "ours", "baseline", "p_objective", "p_grad_norm"]), "",
        "## Notes", "", exp.notes(payload), "",
        "## Tuning", "", f"Grids: `{payload['grids']}`.", "",
        f"Chosen: `{ {r['algorithm'] + ' ε=' + str(r['epsilon']): r['params'] for r in payload['rows']} }`.", "",
        f"Tuning cost (not privacy-accounted): `{_tuning_cost(payload['tuning'])}`.", "",
    ]
    return "\n".join(lines)


def _paper_cell(value: Any) -> Any:
    if value is None:
        return ""
    return value if value["std"] is not None else value["mean"]


def _tuning_cost(tuning: dict[str, Any]) -> dict[str, Any]:
    return {key: value.get("cost", value) if isinstance(value, dict) else value for key, value in tuning.items()}
