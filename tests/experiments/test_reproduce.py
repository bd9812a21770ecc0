"""The reproduction driver: its JSON contract, report files, t-tests, and non-private rows once."""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from dpopt import _validate, experiments, outputs, report
from dpopt.algorithms import DPSGD, Storm, dp_gd
from dpopt.experiments._runner import Method, Problem, mean_curve
from dpopt.train import History
from dpopt.jobs import one_sided_p
from dpopt.jobs.preparation import SYNTHETIC
from dpopt.experiments.preset import Experiment
from dpopt.experiments.reproduce import reproduce
from dpopt.oracles import Logistic
from legibility import problems


def _problem(data_dir: str | None, key: None = None) -> tuple[Problem, dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(500, 4, generator=gen, dtype=torch.float64)
    y = torch.where(X @ torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64) > 0, 1.0, -1.0)
    oracle = Logistic(X[:400], y[:400])
    return Problem(oracle, lambda theta: oracle.error(theta, X[400:], y[400:])), {"n": 400}


def _methods(epsilon: float, key: None = None) -> list[Method]:
    return [
        Method("DP-SGD", lambda n, p: (DPSGD(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=40), 30),
               {"lr": (0.5,)}, {epsilon: {"lr": 0.5}}),
        Method("DP-GD", lambda n, p: (dp_gd(lr=p["lr"], clip=1.0, noise_multiplier=1.0), 10),
               {"lr": (0.01, 1.0)}),  # no preset: tuned on the grid
        Method("SGD", lambda n, p: (Storm(lr=0.5, momentum=1.0, batch_size0=40, batch_size=40), 30), {},
               {None: {}}, private=False),
    ]


def _toy(**changes: Any) -> Experiment:
    return dataclasses.replace(Experiment(
        NAME="toy", EPSILONS=(1.0, 2.0), TUNING_SEEDS=(100,), COMPARISONS=[("DP-SGD", "DP-GD")],
        METRICS=("test_error", "objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s", "epsilon"),
        TABLE_METRICS=("test_error", "objective", "grad_norm", "passes", "cpu_time_s"),
        PAPER_METRICS=("test_error", "grad_norm", "passes"), TEST_METRICS=("objective", "grad_norm"), epochs=0,
        PAPER=[{"algorithm": "DP-SGD", "epsilon": 1.0, "test_error": (0.1, 0.01), "passes": 3}],
        make_problem=lambda key, data_dir: _problem(data_dir, key),
        make_methods=lambda key, epochs, tuned, eps: _methods(eps),
        delta_of=lambda key: 1e-5, describe=lambda payload: "toy notes", preparation=lambda key: SYNTHETIC), **changes)


def _with(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """The toy preset with ``changes``."""
    monkeypatch.setitem(experiments.EXPERIMENTS, "toy", _toy(**changes))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    _with(monkeypatch)
    return "toy"


def test_reproduce_writes_the_documented_json(toy: str, tmp_path: Path) -> None:
    payload = reproduce(toy, seeds=3, out=tmp_path, workers=1)
    written = json.loads((tmp_path / "results.json").read_text(), parse_constant=_refuse)  # strict JSON
    assert written["experiment"] == payload["experiment"] == "toy"
    assert {(row["algorithm"], row["epsilon"]) for row in written["rows"]} == {
        ("DP-SGD", 1.0), ("DP-GD", 1.0), ("SGD", None), ("DP-SGD", 2.0), ("DP-GD", 2.0)}
    for row in written["rows"]:
        # the private metrics apart from the labelled diagnostics (the papers report them)
        assert set(row["metrics"]) == {"test_error", "epsilon"}
        assert set(row["diagnostics"]["metrics"]) == {"objective", "grad_norm", "passes", "cpu_time_s", "wall_time_s"}
        assert row["diagnostics"]["label"].startswith("NOT PRIVATE")
        assert set(row["diagnostics"]["metrics"]["objective"]) == {"mean", "std"}
        if row["epsilon"] is not None:
            assert row["metrics"]["epsilon"]["mean"] <= row["epsilon"]
            assert row["accountant"] in ("pld", "rdp")
    sgd = next(row for row in written["rows"] if row["algorithm"] == "SGD")
    assert sgd["metrics"]["epsilon"] == {"mean": "inf", "std": None}  # ε = ∞; its spread is undefined
    assert written["paper"][0]["metrics"]["test_error"] == {"mean": 0.1, "std": 0.01}
    assert written["paper"][0]["metrics"]["passes"] == {"mean": 3, "std": None}
    # ours against each private baseline at the same ε (not against the non-private reference)
    # the t-tests compare training objectives (non-private), so they sit with the diagnostics
    diagnostics = written["diagnostics"]
    assert written["t_tests"] == [] and diagnostics["label"].startswith("NOT PRIVATE")
    assert {(t["epsilon"], t["baseline"]) for t in diagnostics["t_tests"]} == {(1.0, "DP-GD"), (2.0, "DP-GD")}
    assert diagnostics["tuning"]["DP-GD ε=1.0"]["chosen"] == {"lr": 1.0}  # 0.01 barely moves θ in 10 steps
    assert outputs.unclassified(written) == []
    assert diagnostics["tuning"]["DP-GD ε=1.0"]["label"].startswith("NOT PRIVATE")  # chosen by the training objective
    assert {p.name for p in tmp_path.iterdir()} == {"results.json", "results.md", "curves_eps1.0.png",
                                                   "curves_eps2.0.png", "runs"}
    assert "toy notes" in (tmp_path / "results.md").read_text()
    assert "objective (NOT PRIVATE)" in (tmp_path / "results.md").read_text()


def test_the_report_says_which_rows_this_run_tuned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding: ``dpopt reproduce … --retune`` reported "The preset's values were chosen by … on
    <the preset's date>" for values it had just chosen itself. The rows tuned by the run are named;
    the preset's record is credited with the others only."""
    _with(monkeypatch, TUNED_BY="`dpopt reproduce toy --retune` on 2026-01-01")
    reproduce("toy", seeds=1, out=tmp_path / "tuned", workers=1)
    md = (tmp_path / "tuned" / "results.md").read_text()
    assert ("Tuned by this run: DP-GD ε=1.0, DP-GD ε=2.0. Any other row keeps the preset's values, chosen by "
            "`dpopt reproduce toy --retune` on 2026-01-01.\n") in md
    assert "The preset's values were chosen by" not in md
    _with(monkeypatch, TUNED_BY="`dpopt reproduce toy --retune` on 2026-01-01",
          make_methods=lambda key, epochs, tuned, eps: [m for m in _methods(eps) if m.name != "DP-GD"],
          COMPARISONS=[])
    reproduce("toy", seeds=1, out=tmp_path / "kept", workers=1)
    md = (tmp_path / "kept" / "results.md").read_text()
    assert "The preset's values were chosen by `dpopt reproduce toy --retune` on 2026-01-01.\n" in md
    assert "Tuned by this run" not in md


def test_reproduce_figures_are_legible(toy: str, tmp_path: Path, drawn_figures: dict[str, Any]) -> None:
    """One figure per ε: ε and δ in its title, each method's mean with a band of ± 1 std over the
    seeds, and the rules of legibility.py."""
    reproduce(toy, seeds=2, out=tmp_path, workers=1)
    assert sorted(drawn_figures) == ["curves_eps1.0.png", "curves_eps2.0.png"]
    for epsilon, name in ((1.0, "curves_eps1.0.png"), (2.0, "curves_eps2.0.png")):
        fig = drawn_figures[name]
        assert problems(fig) == []
        title = fig.get_suptitle()
        assert f"ε = {epsilon:g}, δ = 1e-05" in title and "mean over 2 seeds, band ± 1 std" in title
        assert all(len(ax.collections) == len(ax.lines) == 3 for ax in fig.axes)  # DP-SGD, DP-GD, SGD: a band each


def _refuse(token: str) -> None:
    raise AssertionError(f"{token} is not JSON")


def test_one_sided_p() -> None:
    assert one_sided_p([1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 1.9, 2.0]) < 1e-4
    assert one_sided_p([2.0, 2.1, 1.9, 2.0], [1.0, 1.1, 0.9, 1.0]) > 0.9999
    assert one_sided_p([1.0, 1.0], [2.0, 2.0]) == 0.0


def test_one_sided_p_of_a_sample_of_equal_values_is_welchs_test_without_a_warning() -> None:
    """Finding: `dpopt bench` on ijcnn1 printed scipy's "Precision loss occurred in moment calculation"
    warning: a method's seeds all ended at the majority class's error, a sample of equal values whose
    moments scipy's ttest_ind does not find exactly 0. Welch's test is exact there: with the other
    sample's variance alone, t = (mean − m) / (s/√n) on n − 1 degrees of freedom."""
    majority, ours = 8712 / 91701, [0.09499, 0.09501]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = one_sided_p(ours, [majority] * 2)
        assert one_sided_p([majority] * 5, [0.1, 0.2, 0.15]) == pytest.approx(
            stats.t.cdf((majority - 0.15) / (0.05 / 3**0.5), 2), rel=1e-12)
    t = (np.mean(ours) - majority) / (np.std(ours, ddof=1) / 2**0.5)
    assert p == pytest.approx(stats.t.cdf(t, 1), rel=1e-12)


def test_unknown_experiment_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="experiment='nope' must be one of: dp-srm-ijcnn1"):
        reproduce("nope")


@pytest.mark.parametrize("run_cost, order", [(None, ["large", "small"]),
                                             ({"small": 420.0, "large": 160.0}, ["small", "large"])])
def test_the_costliest_problem_is_queued_first_and_reported_in_the_preset_order(
        toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cost: dict[str, float] | None,
        order: list[str]) -> None:
    """Runs are queued costliest problem first: by the problems' declared run costs, else the largest
    (n·d), so a pool's last runs are short (mnist-sota's CNN has fewer parameters than ScatterNet's
    linear layer but a run costs 2.6 times as much); the report keeps the preset's order. With
    declared costs each problem is built just before its runs are queued (the workers run the first
    problem's runs while the next is built: mnist-sota's CNN while the scattering features are
    computed); without, every problem is built first (their sizes order the queue)."""
    driver = sys.modules["dpopt.experiments.reproduce"]
    events: list[str] = []

    def problem(data_dir: str | None, key: str) -> tuple[Problem, dict[str, Any]]:
        made, _ = _problem(data_dir)
        size = {"small": 100, "large": 400}[key]
        gen = torch.Generator().manual_seed(0)
        X = torch.randn(size, 4, generator=gen, dtype=torch.float64)
        events.append(f"build {key}")
        return Problem(Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0)), made.test_error), {"n": size}

    _with(monkeypatch, PROBLEMS=("small", "large"), make_problem=lambda key, data_dir: problem(data_dir, key),
          make_methods=lambda key, epochs, tuned, eps: _methods(eps)[:1], EPSILONS=(1.0,), PAPER=[],
          run_cost_of=lambda key: None if run_cost is None else run_cost[key])
    start = driver.start_rows
    monkeypatch.setattr(driver, "start_rows",
                        lambda *args, key, **kw: events.append(f"queue {key}") or start(*args, key=key, **kw))
    payload = reproduce(toy, seeds=1, out=tmp_path, workers=1)
    assert [event for event in events if event.startswith("queue")] == [f"queue {key}" for key in order]
    if run_cost is None:
        assert events == ["build small", "build large", "queue large", "queue small"]
    else:
        assert events == ["build small", "queue small", "build large", "queue large"]
    assert [row["problem"] for row in payload["rows"]] == ["small", "large"]
    assert [facts["problem"] for facts in payload["facts"]] == ["small", "large"]


def test_a_derived_curve_is_the_mean_of_the_function_over_seeds() -> None:
    """‖∇F‖² curves average the squares (5, 10 here), not square the average (4, 9)."""
    def history(norms: list[float]) -> History:
        records = [{"passes": float(k), "grad_norm": g} for k, g in enumerate(norms)]
        return History(records=records, final={}, theta=torch.zeros(1), delta=1e-5, accountant="pld",
                       neighboring_relation="replace_one", steps_done=2, randomness="seed 0")

    xs, values, spread = mean_curve([history([1.0, 2.0]), history([3.0, 4.0])], "grad_norm_sq")
    assert xs.tolist() == [0.0, 1.0] and values == pytest.approx([5.0, 10.0])
    assert spread == pytest.approx([32**0.5, 72**0.5])  # std (ddof 1) of the squares (1, 9) and (4, 16)
    assert mean_curve([history([1.0, 2.0])], "grad_norm").spread is None  # one seed: no spread
    assert mean_curve([history([1.0, 2.0]), history([3.0, 4.0])], "grad_norm")[1] == pytest.approx([2.0, 3.0])


# ------------------------------------------------------------------ losing no work: --out, resume, progress

#: The toy's runs at seeds=3: DP-GD tuned at ε = 1 and 2 (2 grid points × 1 tuning seed each), then
#: DP-SGD and DP-GD at 2 ε × 3 seeds, SGD once (non-private) × 3 seeds.
TOY_RUNS = 2 * 2 + 2 * 2 * 3 + 3


def _comparable(payload: dict[str, Any]) -> dict[str, Any]:
    """A payload as JSON (NaN as null), without what differs between two identical reproductions (times)."""
    rows = [{**row, "diagnostics": {k: v for k, v in row["diagnostics"]["metrics"].items() if not k.endswith("time_s")}}
            for row in payload["rows"]]
    diagnostics = payload["diagnostics"]
    tuning = {name: {"chosen": value["chosen"], "scores": value["scores"]}
              for name, value in diagnostics["tuning"].items()}
    return json.loads(report.to_json({**payload, "rows": rows, "diagnostics": {**diagnostics, "tuning": tuning,
                                                                                "wall_time_s": None}}))


def _counting_problem(calls: list[int], interrupt_at: int | None = None):
    """The toy problem; every finished run appends to ``calls``; run ``interrupt_at`` is interrupted."""
    def problem(key: None, data_dir: str | None) -> tuple[Problem, dict[str, Any]]:
        made, described = _problem(data_dir)

        def count(theta: torch.Tensor) -> dict[str, float]:
            calls.append(1)
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            return {}

        return Problem(made.oracle, made.test_error, extra_metrics=count), described
    return problem


def test_out_is_checked_before_any_work(toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding: --out was validated only after all the computation."""
    from dpopt import _validate
    from dpopt.cli import main

    calls: list[int] = []
    _with(monkeypatch, make_problem=_counting_problem(calls))
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    with pytest.raises(_validate.DpoptError, match=r"out='.*results.txt' must be a directory \(it is a file\)"):
        reproduce(toy, seeds=1, out=a_file, workers=1)
    assert main(["reproduce", toy, "--seeds", "1", "--workers", "1", "--out", str(a_file / "below")]) == 2
    assert capsys.readouterr().err.startswith(f"dpopt: error: out='{a_file / 'below'}' must be a writable directory")
    assert calls == []  # no run started


def test_the_command_prints_one_json_document_or_a_table_with_the_paths_written(
        toy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpopt.cli import main

    argv = ["reproduce", toy, "--seeds", "2", "--workers", "1", "--out", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["experiment"] == "toy" and printed == json.loads((tmp_path / "results.json").read_text())
    assert main(argv) == 0  # resumed: every run is loaded
    shown = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown)
    header = shown.splitlines()[0].split()
    assert header[:3] == ["algorithm", "target", "ε"] and "test_error" in header
    assert f"written:\n  {tmp_path / 'results.json'}\n  {tmp_path / 'results.md'}\n" in shown


def test_an_interrupted_reproduction_resumes_to_the_same_results(toy: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: an interrupt lost every finished run. Each run is saved as it finishes; the same
    command resumes, runs only what is missing, and gives the uninterrupted results."""
    calls: list[int] = []
    _with(monkeypatch, make_problem=_counting_problem(calls, interrupt_at=7))
    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt) as interrupt:
        reproduce(toy, seeds=3, out=out, workers=1)
    assert str(interrupt.value) == (f"6 of the 7 runs started are saved in {out / 'runs'}; run the same command "
                                    "again to resume (saved runs are loaded, not run again); no report was written")
    assert len(list((out / "runs").glob("*.pt"))) == 6 and not (out / "results.json").exists()
    calls.clear()
    _with(monkeypatch, make_problem=_counting_problem(calls))
    resumed = reproduce(toy, seeds=3, out=out, workers=1)
    assert len(calls) == TOY_RUNS - 6  # the saved runs were not run again
    assert len(list((out / "runs").glob("*.pt"))) == TOY_RUNS
    whole = reproduce(toy, seeds=3, out=tmp_path / "whole", workers=1)
    assert _comparable(resumed) == _comparable(whole)
    calls.clear()
    again = reproduce(toy, seeds=3, out=out, workers=1)  # everything saved: nothing runs
    assert calls == [] and _comparable(again) == _comparable(whole)


def test_a_progress_bar_counts_every_run(toy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: no progress bar over the runs of a reproduction (on a terminal: a bar; else lines,
    tests/test_cli_newcomer.py)."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    reproduce(toy, seeds=3, out=tmp_path, workers=1, progress=True)
    bar = capsys.readouterr().err
    assert "runs: 100%" in bar and f"{TOY_RUNS}/{TOY_RUNS}" in bar
    reproduce(toy, seeds=3, out=tmp_path, workers=1, progress=True)  # resumed: every run is loaded
    assert f"{TOY_RUNS} loaded from {tmp_path / 'runs'}" in capsys.readouterr().err


def test_a_diverged_seed_leaves_a_gap_in_the_mean_curve() -> None:
    """A run that stopped early (diverged) has fewer records: the mean is NaN where it has none."""
    def history(values: list[float]) -> History:
        records = [{"passes": float(k + 1), "objective": v} for k, v in enumerate(values)]
        return History(records=records, final={}, theta=torch.zeros(1), delta=1e-5, accountant="pld",
                       neighboring_relation="replace_one", steps_done=len(values), randomness="seed 0")

    xs, values, _ = mean_curve([history([1.0, 2.0, 3.0]), history([3.0])], "objective")
    assert xs.tolist() == [1.0, 2.0, 3.0]
    assert values[0] == 2.0 and np.isnan(values[1:]).all()


def test_results_json_classifies_every_field(toy: str, tmp_path: Path) -> None:
    """Every field of results.json is private or sits, labelled, under "diagnostics"; a training-data
    fact, a t-test on a training objective or the tuning record outside it is refused."""
    reproduce(toy, seeds=2, out=tmp_path, workers=1)
    written = json.loads((tmp_path / "results.json").read_text())
    assert outputs.unclassified(written) == []
    assert outputs.unclassified(written | {"facts": [{"n": 400, "goldstein_start": 0.3}]}) \
        == ["facts[].goldstein_start"]
    assert outputs.unclassified(written | {"t_tests": [{"p_objective": 0.1}]}) == ["t_tests[].p_objective"]
    assert outputs.unclassified(written | {"tuning": written["diagnostics"]["tuning"]}) == ["tuning"]
    assert outputs.unclassified(written | {"wall_time_s": 3.0}) == ["wall_time_s"]


def test_every_fact_a_preset_states_is_classified() -> None:
    """The facts dicts of every preset (read from the source, so no preset is left out; annotated or
    not) name only classified facts: public ones, or training-data ones that go to the diagnostics."""
    import ast

    classified = outputs.PUBLIC_FACTS | outputs.DIAGNOSTIC_FACTS | outputs.PUBLIC_BY_NAME
    found = set()
    for module in Path(experiments.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            if any(getattr(t, "id", None) == "facts" for t in targets) and isinstance(node.value, ast.Dict):
                found |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    assert len(found) > 15 and found <= classified, sorted(found - classified)


def test_results_say_where_the_randomness_came_from_and_label_a_preparation_that_reads_the_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drawn_figures: dict[str, Any]) -> None:
    """Findings: results.json had no randomness field, though every run uses a published seed; and a
    problem prepared from statistics of its data (as the DIFF2 presets follow their paper) was shown
    without a label. Now results.json, results.md and the figure titles say both."""
    from dpopt.data.tabular import prepared
    from dpopt.jobs.preparation import LABEL, NotPrivate

    paper = NotPrivate("a paper's standardisation", prepared)
    _with(monkeypatch, PROBLEMS=("public", "standardised"), EPSILONS=(1.0,), PAPER=[],
          preparation=lambda key: paper if key == "standardised" else SYNTHETIC,
          make_problem=lambda key, data_dir: _problem(data_dir),
          make_methods=lambda key, epochs, tuned, eps: _methods(eps)[:1])
    reproduce("toy", seeds=2, out=tmp_path, workers=1)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["randomness"].startswith("published seeds: the runs of every row use seeds 0 to 1, and a tuning "
                                            "run here seeds 100;") and "not a guarantee" in written["randomness"]
    facts = {fact["problem"]: fact["preparation"] for fact in written["facts"]}
    assert facts == {"public": "none: synthetic data drawn from a public distribution with a fixed seed",
                     "standardised": f"{LABEL}: a paper's standardisation, computed from the data without noise; one "
                                     "record moves every other, so no ε shown for this problem is a guarantee"}
    assert outputs.unclassified(written) == []
    text = (tmp_path / "results.md").read_text()
    assert f"Randomness: {written['randomness']}." in text
    assert f"**Data preparation of `standardised`: {facts['standardised']}.**" in text
    assert f"Data preparation of `public`: {facts['public']}." in text
    titles = {name: fig.get_suptitle() for name, fig in drawn_figures.items()}
    assert f"{LABEL}: no ε here is a guarantee" in titles["curves_standardised_eps1.0.png"]
    assert LABEL not in titles["curves_public_eps1.0.png"]
    assert problems(drawn_figures["curves_standardised_eps1.0.png"]) == []  # the longer title still fits


def test_the_majority_class_error_is_a_statistic_of_the_test_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: dp-srm-ijcnn1's majority_class_test_error, classified as a public fact, was computed
    with the majority class of the training labels. It is now the best constant classifier's error
    on the test set, 1 − (its most frequent label's share): a function of the test labels alone."""
    from dpopt.data import Dataset
    from dpopt.experiments import dp_srm_ijcnn1

    def ijcnn1(train_labels: list[float]) -> Dataset:
        y_test = np.array([-1.0] * 7 + [1.0] * 3)
        return Dataset("ijcnn1", "binary", np.ones((4, 22)), np.array(train_labels), np.ones((10, 22)), y_test, "toy")

    errors = []
    for train_labels in ([1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, -1.0, 1.0]):  # training majorities +1 and −1
        monkeypatch.setattr(dp_srm_ijcnn1, "load", lambda name, data_dir, labels=train_labels: ijcnn1(labels))
        errors.append(dp_srm_ijcnn1.problem(None, None)[1]["majority_class_test_error"])
    assert errors == [pytest.approx(0.3), pytest.approx(0.3)]


def test_only_runs_the_rows_matching_a_pattern_and_says_so(toy: str, tmp_path: Path) -> None:
    """``only``: the rows whose method/ε match one of the shell patterns, stated in results.json
    and results.md; a pattern matching nothing is refused with the rows there are."""
    payload = reproduce(toy, seeds=1, out=tmp_path, workers=1, only=("DP-SGD/2.0", "SGD/*"))
    assert {(row["algorithm"], row["epsilon"]) for row in payload["rows"]} == {("DP-SGD", 2.0), ("SGD", None)}
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["only"] == ["DP-SGD/2.0", "SGD/*"] and outputs.unclassified(written) == []
    assert "**Only the rows matching `DP-SGD/2.0`, `SGD/*`.**" in (tmp_path / "results.md").read_text()
    assert reproduce(toy, seeds=1, out=tmp_path / "all", workers=1)["only"] == []
    with pytest.raises(_validate.DpoptError, match=r"only=\['DP-SGD/3.0'\] matches no row; the rows are: DP-SGD/1.0, "
                                                   r"DP-GD/1.0, SGD/non-private, DP-SGD/2.0, DP-GD/2.0"):
        reproduce(toy, seeds=1, out=tmp_path / "none", workers=1, only=("DP-SGD/3.0",))


def test_only_matching_no_row_is_refused_before_any_problem_is_built_or_file_written(
        toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: ``reproduce mnist-sota --only nomatch`` built every problem (606 s, five feature files
    of ~950 MB), then said "0 of the 0 runs started are saved". The patterns are checked first, and a
    pattern naming rows reads only their problems."""
    built: list[None] = []
    _with(monkeypatch, make_problem=lambda key, data_dir: built.append(key) or _problem(data_dir, key))
    out = tmp_path / "out"
    with pytest.raises(_validate.DpoptError, match=r"only=\['nomatch'\] matches no row"):
        reproduce(toy, seeds=1, out=out, workers=1, only=("nomatch",))
    assert built == [] and not out.exists()


def test_the_command_takes_only_patterns(toy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpopt.cli import main

    argv = ["reproduce", toy, "--seeds", "1", "--workers", "1", "--out", str(tmp_path), "--json"]
    assert main([*argv, "--only", "DP-GD/*", "--only", "SGD/non-private"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["only"] == ["DP-GD/*", "SGD/non-private"]
    assert sorted((row["algorithm"], row["epsilon"]) for row in printed["rows"]) == [
        ("DP-GD", 1.0), ("DP-GD", 2.0), ("SGD", None)]
    assert main([*argv, "--only", "Adam/*"]) == 2
    assert "dpopt: error: only=['Adam/*'] matches no row" in capsys.readouterr().err
