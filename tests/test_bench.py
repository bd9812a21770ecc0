"""dpopt bench: problems as data, every method tuned privately at the same total ε, the winner."""

from __future__ import annotations

import json
import math
import sys
import warnings

import pytest
import torch
from matplotlib.collections import PathCollection

from dpopt import bench, checkpoint, journal, outputs
from dpopt._validate import DpoptError
from dpopt.algorithms.diff2 import paper_ratios
from dpopt.bench import TIE, problems
from dpopt.bench.tables import markdown, problem_figure
from dpopt.cli import main
from dpopt.tuning import TruncatedNegativeBinomial
from dpopt.tuning.task import builder

TINY = """
[tiny]
task = { kind = "glm", dataset = "adult", model = "logistic", reg = 1e-3 }
delta = 1e-5
validation_fraction = 0.2
epsilons = [0.5, 2.0]
seeds = 2
trials = { mean = 1.5, shape = 1.0 }

[tiny.methods.dp-sgd]
steps = 6
fixed = { batch_size = 256 }
grid = { lr = [0.1, 1.0] }

[tiny.methods.dp-gd]
steps = 3
grid = { lr = [0.1, 1.0] }
"""


#: A problem whose test metric moves with every draw of noise (a continuous regression error on
#: synthetic data, unlike TINY's few steps that may leave both methods at the majority class's error).
NOISY = TINY.replace("[tiny", "[noisy").replace(
    'task = { kind = "glm", dataset = "adult", model = "logistic", reg = 1e-3 }',
    'task = { kind = "heavy-tailed", noise = "student-t", model = "ridge", n = 500, dim = 3, reg = 0.0 }')


#: The issue's suite: each problem's task kind and methods.
#: Beside every DP-SGD: BandMF (bands tuned), DP-SGD with adaptive clipping, DP-AdamBC.
BEYOND = ["dp-bandmf", "dp-sgd-adaptive", "dp-adambc"]
SUITE = {"adult-logistic": ("glm", ["dp-sgd", *BEYOND, "dp-srm", "aclip", "dp-gd"]),
         "ijcnn1-logistic": ("glm", ["dp-sgd", *BEYOND, "dp-srm", "aclip", "dp-gd"]),
         "mnist-cnn": ("classifier", ["dp-sgd", *BEYOND, "dp-srm"]),
         "california-diff2": ("mlp-regression", ["diff2-gd", "dp-gd", "dp-sgd", *BEYOND]),
         "heavy-tailed-regression": ("heavy-tailed", ["aclip", "dp-sgd", *BEYOND, "dp-gd"]),
         "nonsmooth-o2nc": ("truncated-absolute", ["o2nc-first", "dp-sgd", *BEYOND, "dp-gd"])}


def test_the_suite_is_declared_with_full_and_quick_settings():
    full, quick = problems(), problems("quick")
    assert {name: (p.task["kind"], [m.name for m in p.methods]) for name, p in full.items()} == SUITE
    for name, problem in full.items():
        assert problem.epsilons == (0.5, 1.0, 3.0, 8.0) and problem.seeds >= 5, name
        assert quick[name].epsilons == (1.0,) and quick[name].seeds == 2, name
        assert all(q.steps < f.steps for q, f in zip(quick[name].methods, problem.methods)), name
    # a variant's task table overrides single settings: the MNIST quick run uses 1,000 images
    assert quick["mnist-cnn"].task == full["mnist-cnn"].task | {"records": 1000}
    # DIFF2 against DP-GD on P = 10 clients, its noise split as the paper's Proposition 4.1 (T = 20)
    diff2 = full["california-diff2"].methods[0]
    assert diff2.fixed["clients"] == 10 and diff2.fixed["noise_ratios"] == [round(paper_ratios(400, 20)[0], 5), 1.0]
    algorithm = builder("diff2-gd", 1000, diff2.fixed)({"lr": 0.1, "clip_diff": 3.0})
    assert (algorithm.clients.count, algorithm.restart, algorithm.output_rule) == (10, 20, "last")
    assert algorithm.noise_ratios == (0.11471, 1.0)


def test_the_bundled_problems_and_their_quick_settings():
    full, quick = problems()["adult-logistic"], problems("quick")["adult-logistic"]
    assert [m.name for m in full.methods] == ["dp-sgd", *BEYOND, "dp-srm", "aclip", "dp-gd"]
    assert full.epsilons == (0.5, 1.0, 3.0, 8.0) and full.seeds >= 5 and quick.epsilons == (1.0,)
    assert full.trials == TruncatedNegativeBinomial(4.0, 1.0)
    assert [m.steps for m in quick.methods] == [round(0.25 * m.steps) for m in full.methods]
    # ./dev run's compact comparison: the four methods at ε = 1, the full steps, 2 seeds, K ≥ 1 always
    main = problems("main")["adult-logistic"]
    assert main.methods == full.methods and main.epsilons == (1.0,) and main.seeds == 2
    assert main.trials == TruncatedNegativeBinomial(3.0, 3.0) and main.trials.pmf(0) == 0.0
    assert list(problems("main")) == ["adult-logistic"]  # the only problem with a `main` block
    with pytest.raises(DpoptError, match="variant='nightly': no problem of .* declares such a block"):
        problems("nightly")


#: The new methods as the problems declare them: named tables over a registered algorithm.
NEW = TINY.replace("epsilons = [0.5, 2.0]", "epsilons = [1.0]").split("[tiny.methods.dp-gd]")[0] + """
[tiny.methods.dp-bandmf]
steps = 6
fixed = { batch_size = 256 }
grid = { bands = [1, 4], lr = [0.1, 1.0] }

[tiny.methods.dp-sgd-adaptive]
algorithm = "dp-sgd"
steps = 6
fixed = { batch_size = 256, clip_quantile = 0.5 }
grid = { lr = [0.1, 1.0] }

[tiny.methods.dp-adambc]
algorithm = "dp-sgd"
steps = 6
fixed = { batch_size = 256, optimizer = "adambc", adam_gamma = 1e-6 }
grid = { lr = [0.01, 0.1] }
"""


def test_bandmf_adaptive_clipping_and_adambc_are_bench_methods(capsys, tmp_path):
    """A method is named by its table and runs the ``algorithm`` it names: DP-SGD, BandMF with its
    bands tuned privately (a candidate of four bands at the noise the reference's Rényi curve
    dominates), DP-SGD with adaptive clipping, DP-AdamBC, each within the cell's ε."""
    file = tmp_path / "problems.toml"
    file.write_text(NEW)
    (problem,) = problems(path=file).values()
    assert [(m.name, m.algorithm) for m in problem.methods] == [
        ("dp-sgd", "dp-sgd"), ("dp-bandmf", "dp-bandmf"), ("dp-sgd-adaptive", "dp-sgd"), ("dp-adambc", "dp-sgd")]
    assert main(["bench", "--file", str(file), "--json", "--seeds", "1", "--workers", "1", "--out",
                 str(tmp_path / "out")]) == 0
    (result,) = json.loads(capsys.readouterr().out)["problems"]
    assert result["grids"]["dp-bandmf"] == {"bands": [1, 4], "lr": [0.1, 1.0]}
    (cell,) = result["cells"]
    assert set(cell["methods"]) == {"dp-sgd", "dp-bandmf", "dp-sgd-adaptive", "dp-adambc"}
    for entry in cell["methods"].values():
        assert 0.99 <= entry["epsilon_tuning_and_training"] <= 1.0
        assert math.isfinite(entry["test_error"]["mean"])


def test_bench_json_gives_each_cell_its_methods_errors_epsilons_and_winner(capsys, tmp_path):
    """Each cell's methods, errors, ε and winner. Finding: bench.md and bench.json printed every
    tuning's number of trials K (and the wall times that reveal it) by default, though the
    guarantee of repeat-and-select rests on K staying secret: they are written only with
    --diagnostics now, labelled NOT PRIVATE."""
    file = tmp_path / "problems.toml"
    file.write_text(TINY)
    assert main(["bench", "--file", str(file), "--json", "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out)
    (problem,) = result["problems"]
    assert [cell["epsilon"] for cell in problem["cells"]] == [0.5, 2.0]
    for cell in problem["cells"]:
        means = {name: entry["test_error"]["mean"] for name, entry in cell["methods"].items()}
        assert set(means) == {"dp-sgd", "dp-gd"}
        assert all(0.99 * cell["epsilon"] <= entry["epsilon_tuning_and_training"] <= cell["epsilon"]
                   for entry in cell["methods"].values())
        assert all(entry["test_error"]["std"] >= 0 for entry in cell["methods"].values())
        if cell["winner"] is not None:  # (a few steps may leave both at the majority class's error: a tie)
            assert cell["winner"] == min(means, key=means.get) and cell["tied"] == []
            assert 0 <= cell["p_value"] <= 1 and cell["significant"] == (cell["p_value"] < 0.05)
        else:
            assert sorted(cell["tied"]) == sorted(means) and cell["p_value"] is None and not cell["significant"]
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {"bench.json", "bench.md", "tiny.png", "summary.png", "runs"}
    text, stored = (tmp_path / "out" / "bench.md").read_text(), (tmp_path / "out" / "bench.json").read_text()
    assert "diagnostics" not in result and "diagnostics" not in json.loads(stored)  # no K, no wall time
    assert "trials_run" not in stored and "wall_time" not in stored
    assert "| dp-sgd |" in text and "wall time (NOT PRIVATE)" not in text and "trials)" not in text
    assert "Trial counts and wall times are not shown" in text and "`--diagnostics` adds them" in text
    # in words (the quick start showed "TruncatedNegativeBinomial(mean=3.0, shape=3.0)")
    assert "; trials per tuning: truncated negative binomial (mean " in text and "Binomial(" not in text
    # with --diagnostics (one ε, one seed), without --json: shown for a person (the tables and the paths
    # written), the trials run and wall times labelled NOT PRIVATE
    argv = ["bench", "--file", str(file), "--diagnostics", "--epsilon", "2", "--seeds", "1", "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(shown)
    assert "| dp-sgd |" in shown and f"written:\n  {tmp_path / 'out' / 'bench.json'}\n" in shown
    assert "| wall time (NOT PRIVATE) | ε = 2 |" in shown and "Diagnostics (NOT PRIVATE: " in shown
    shown_json = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert shown_json["diagnostics"]["label"].startswith("NOT PRIVATE")
    runs = shown_json["diagnostics"]["runs"]
    assert len(runs) == 2 and all(len(r["trials_run"]) == 1 and r["trials_run"][0] >= 0 for r in runs)


def private_part(result: dict) -> list:
    return result["problems"]


def bench_json(capsys, tmp_path, out: str, *extra: str, workers: str = "1") -> dict:
    """``dpopt bench --json`` on :data:`NOISY`, written to ``tmp_path / out``; the printed result."""
    file = tmp_path / "problems.toml"
    file.write_text(NOISY)
    argv = ["bench", "--file", str(file), "--json", "--workers", workers, "--out", str(tmp_path / out), *extra]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["dpopt", *argv])  # what the outputs show as the command
        assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bench_saves_every_finished_job_and_resumes_from_them(capsys, tmp_path, workers):
    """The shared runner (the one reproduce uses): each tuning job is saved as it finishes, in this
    process or in the workers; the same command run again loads them all (2 ε × 2 methods × 2
    seeds = 8 files) and reports the same private results, and a job whose file is gone is run
    again to the same result: the secret its randomness derives from was drawn from the operating
    system by the first run, and the second run says it resumed with it.

    Finding: that secret was kept in --out/runs, so publishing the output folder published every K,
    candidate and noise draw. It is kept in the state folder now (owner-only, with the --out it
    belongs to); --out holds only the bench's id, and no file under --out holds the secret."""
    first = bench_json(capsys, tmp_path, "out", workers=workers)
    runs = tmp_path / "out" / "runs"
    saved = sorted(runs.glob("*.pt"))
    assert len(saved) == 8
    assert sorted(path.name for path in runs.iterdir() if path.suffix != ".pt") == [bench.BENCH_ID]
    kept = journal.folder() / "bench" / f"{(runs / bench.BENCH_ID).read_text().strip()}.json"
    record = json.loads(kept.read_text())
    assert kept.stat().st_mode & 0o777 == 0o600 and record["out"] == str((tmp_path / "out").resolve())
    hidden = record["secret"]
    assert len(hidden) == 32 and "operating system" in first["randomness"]
    assert not [path for path in (tmp_path / "out").rglob("*") if path.is_file() and (
        hidden.encode() in path.read_bytes() or str(int(hidden, 16)).encode() in path.read_bytes())]
    stamps = {path: path.stat().st_mtime_ns for path in saved}
    saved[0].unlink()
    again = bench_json(capsys, tmp_path, "out", workers=workers)
    assert private_part(again) == private_part(first)
    assert all(path.stat().st_mtime_ns == stamps[path] for path in saved[1:])  # loaded, not rewritten
    assert saved[0].exists()  # the missing job ran again
    assert "resumed with the secret" in again["randomness"] and "resumed" not in first["randomness"]


def forged(value: object, error: float = 0.0123, epsilon: float = 0.05) -> object:
    """``value`` (a saved job) with every result in it rewritten, as a writer of --out did: the test
    error to ``error``, the ε to ``epsilon`` and the planned passes to 0.001."""
    if isinstance(value, dict):
        value = {key: forged(item, error, epsilon) for key, item in value.items()}
        if "test_error" in value:
            value |= {"test_error": error, "epsilon": epsilon, "expected_passes": 0.001}
    return value


def cells_of(result: dict) -> list[dict]:
    return [cell for problem in result["problems"] for cell in problem["cells"]]


def test_a_forged_saved_job_is_refused_and_the_rerun_reports_the_true_result(capsys, tmp_path):
    """Finding: a saved job of --out/runs carried a sha256 but no key, and its ε was trusted as
    written: a writer of --out rewrote a job's ε and test error (digest recomputed) and the rerun of
    the same command reported them. Each saved job is tagged under the user's checkpoint key now:
    the rerun refuses the forged file in one line naming it and how to go on, writes nothing, and
    once it is removed reruns its job to the true result."""
    first = bench_json(capsys, tmp_path, "out")
    path = sorted((tmp_path / "out" / "runs").glob("*.pt"))[0]
    checkpoint.save(path, forged(checkpoint.load(path)))  # the digest recomputed; no key
    written = (tmp_path / "out" / "bench.json").read_bytes()
    argv = ["bench", "--file", str(tmp_path / "problems.toml"), "--json", "--workers", "1", "--out",
            str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpopt: error: saved job: checkpoint={str(path)!r} is not authenticated: it carries no "
                          "tag") and err.endswith(f"; remove {str(path)!r} to run its job again\n")
    assert err.count("\n") == 1 and (tmp_path / "out" / "bench.json").read_bytes() == written
    path.unlink()
    assert private_part(bench_json(capsys, tmp_path, "out")) == private_part(first)


def test_a_jobs_epsilon_is_computed_from_its_plan_never_read_from_its_file(capsys, tmp_path):
    """The ε and the passes a table reports are the plan's (:meth:`bench.Tuning.planned`: the job's
    public settings and the calibration), for a job run or loaded: even a file tagged under the
    user's key, the one writer who can make a job's result, cannot lower a row's ε."""
    first = bench_json(capsys, tmp_path, "out")
    key = journal.key()
    for path in (tmp_path / "out" / "runs").glob("*.pt"):
        checkpoint.save(path, forged(checkpoint.load(path, key)), key)
    again = bench_json(capsys, tmp_path, "out")
    claimed = [{name: (entry["epsilon_tuning_and_training"], entry["expected_passes"])
                for name, entry in cell["methods"].items()} for cell in cells_of(again)]
    assert claimed == [{name: (entry["epsilon_tuning_and_training"], entry["expected_passes"])
                        for name, entry in cell["methods"].items()} for cell in cells_of(first)]
    assert all(0.99 * cell["epsilon"] <= entry["epsilon_tuning_and_training"] <= cell["epsilon"]
               for cell in cells_of(again) for entry in cell["methods"].values())
    assert {entry["test_error"]["mean"] for cell in cells_of(again) for entry in cell["methods"].values()} == {0.0123}


def test_a_bench_resumes_only_its_own_secret(tmp_path):
    """The secret of a bench seeded from the operating system is found again through the id in
    --out/runs, which is not secret: an id copied from another bench's --out (by whoever can write
    this one) is refused, as is an id whose secret is not in this state folder, and a secret an
    earlier dpopt kept in --out; the bench's own id resumes its secret."""
    one, other = tmp_path / "one", tmp_path / "other"
    first = bench.randomness(None, one)
    assert bench.randomness(None, one).secret == first.secret and "resumed" in bench.randomness(None, one).origin
    (other / "runs").mkdir(parents=True)
    (other / "runs" / bench.BENCH_ID).write_bytes((one / "runs" / bench.BENCH_ID).read_bytes())
    with pytest.raises(DpoptError, match=rf"^'.*other/runs/bench.id' names the bench of out='{one}', not of this "
                                         rf"--out \('{other}'\): resuming would draw that bench's randomness again "
                                         r"here; move the folder back, or remove '.*other/runs' \(or use another "
                                         r"--out\) to start the bench over$"):
        bench.randomness(None, other)
    (other / "runs" / bench.BENCH_ID).write_text("0" * 32)
    with pytest.raises(DpoptError, match=r"bench.id' names no bench whose secret is in the state folder"):
        bench.randomness(None, other)
    (other / "runs" / bench.BENCH_ID).unlink()
    (other / "runs" / "secret").write_text("0" * 32)
    with pytest.raises(DpoptError, match=r"^'.*other/runs/secret' is a bench secret an earlier dpopt kept in --out"):
        bench.randomness(None, other)
    assert bench.randomness(7, other).secret == 7  # a seed is the user's: nothing is read or kept


def test_default_benches_draw_secret_randomness_and_a_seed_makes_them_reproducible(capsys, tmp_path):
    """Finding: bench seeded its tunings with the public seeds 0, 1, …, so the number of trials, the
    candidates and every trial's noise could be recomputed, and two default runs gave identical
    tables. Two default runs now differ; two with the same --seed are identical, every output says
    the ε rests on the seed staying secret, and no output shows the seed."""
    a, b = bench_json(capsys, tmp_path, "a", "--diagnostics"), bench_json(capsys, tmp_path, "b")
    assert private_part(a) != private_part(b)
    assert "from the operating system" in a["randomness"]
    c, d = bench_json(capsys, tmp_path, "c", "--seed", "4187209563", "--diagnostics"), bench_json(
        capsys, tmp_path, "d", "--seed", "4187209563")
    assert private_part(c) == private_part(d) != private_part(a)  # (diagnostics change no result)
    assert c["randomness"] == bench.SEEDED and "seed staying secret" in c["randomness"]
    for out in ("c", "d"):
        written = {name: (tmp_path / out / name).read_text() for name in ("bench.json", "bench.md")}
        assert all("4187209563" not in text and "--seed <secret>" in text for text in written.values())
        assert f"Randomness of the tunings: {bench.SEEDED}." in written["bench.md"]
        assert not (tmp_path / out / "runs" / bench.BENCH_ID).exists()  # the user keeps the seed
    for result in (a, c):
        for epsilon in (0.5, 2.0):
            trials = [run["trials_run"] for run in result["diagnostics"]["runs"] if run["epsilon"] == epsilon]
            assert len(trials) == 2  # dp-sgd's and dp-gd's trials (K per seed), drawn apart
    assert outputs.unclassified(json.loads((tmp_path / "c" / "bench.json").read_text())) == []


def test_the_command_the_outputs_show_hides_the_seed():
    assert bench.shown_command(["bench", "--seed", "7", "--quick"]) == "dpopt bench --seed <secret> --quick"
    assert bench.shown_command(["bench", "--seed=7"]) == "dpopt bench --seed=<secret>"


def test_a_jobs_seed_is_derived_from_the_secret_per_seed_slot_and_job():
    """Finding: every method and ε of a seed slot shared one seed, so the rows of a published table
    shared their noise draws (the difference of two rows' releases would be noise-free), while the
    README said publishing the table composes them. Each job now has its own seed: slots, jobs and
    secrets all differ, each 128 bits, and the seed depends on nothing else."""
    one, other = bench.Randomness(1, "x"), bench.Randomness(2, "x")
    jobs = ("adult-logistic/1.0/dp-sgd", "adult-logistic/1.0/dp-gd", "adult-logistic/3.0/dp-sgd")
    seeds = {r.seed(slot, job) for r in (one, other) for slot in (0, 1) for job in jobs}
    assert len(seeds) == 12 and all(0 <= seed < 2**128 for seed in seeds)
    assert one.seed(0, jobs[0]) == bench.Randomness(1, "y").seed(0, jobs[0])


def run_of(error: float) -> dict:
    """A tuning job's result with test metric ``error``."""
    return {"test_error": error}


def cell_of(runs: dict) -> dict:
    """:func:`bench.cell` at ε = 1 of ``runs``, every method planned at ε 0.99 and 1 pass."""
    return bench.cell(1.0, runs, {name: {"epsilon": 0.99, "expected_passes": 1.0} for name in runs})


def test_methods_that_tie_have_no_winner():
    """Finding: on ijcnn1 every method ended at the majority class's error and one was still marked
    the winner. The rule: a mean within a relative TIE of the lowest ties with it; then no method
    wins (no runner-up, no p-value), the methods at the lowest mean are listed, and the tables bold
    nothing and circle nothing."""
    majority = 8712 / 91701  # ijcnn1's majority-class test error
    tied = cell_of({"dp-sgd": [run_of(0.09499), run_of(0.09501)], "dp-srm": [run_of(majority)] * 2,
                    "aclip": [run_of(0.1), run_of(0.3)]})
    assert (tied["winner"], tied["runner_up"], tied["p_value"], tied["significant"]) == (None, None, None, False)
    assert tied["tied"] == ["dp-sgd", "dp-srm"]
    apart = cell_of({"a": [run_of(0.1), run_of(0.11)], "b": [run_of(0.105 * (1 + 2 * TIE))] * 2})
    assert (apart["winner"], apart["runner_up"], apart["tied"]) == ("a", "b", []) and 0 < apart["p_value"] < 1
    within = cell_of({"a": [run_of(0.1)] * 2, "b": [run_of(0.1 * (1 + TIE / 2))] * 2})
    assert within["winner"] is None and within["tied"] == ["a", "b"]
    problem = {"problem": "p", "dataset": "ijcnn1", "model": "logistic", "delta": 1e-5, "seeds": 2, "trials": "T",
               "steps": {}, "grids": {}, "cells": [tied]}
    text = markdown({"problems": [problem]}, "cmd")
    assert "| winner (p vs runner-up) | none: dp-sgd, dp-srm tie (within 0.1%) |" in text and "**" not in text
    figure = problem_figure(problem)
    assert not [c for c in figure.axes[0].collections if isinstance(c, PathCollection)]  # no circled winner


def test_bench_refuses_an_out_that_is_a_file_before_any_work(capsys, tmp_path):
    (tmp_path / "taken").write_text("")
    assert main(["bench", "--quick", "--out", str(tmp_path / "taken")]) == 2
    assert "must be a directory (it is a file)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--problem", "nope"], "problem='nope' must be one of: adult-logistic, ijcnn1-logistic, mnist-cnn"),
    (["--file", "/nonexistent.toml"], "file='/nonexistent.toml' is not a readable problems file"),
    (["--epsilon", "-1"], "epsilon=-1.0 must be > 0"),
    (["--variant", "main", "--problem", "mnist-cnn"], "problem (with variant 'main')='mnist-cnn' must be one of: "
                                                       "adult-logistic"),
])
def test_bench_refuses_bad_input_with_exit_2(capsys, argv, message, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_bench_quick_json_covers_every_problem_with_metrics_epsilons_and_winners(capsys, tmp_path, shared_data_dir):
    """What CI runs: every declared problem at its quick settings, through the CLI."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["bench", "--quick", "--json", "--data-dir", str(shared_data_dir), "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert not [w for w in caught if "Precision loss" in str(w.message)]  # scipy's, where every seed tied
    assert outputs.unclassified(json.loads((tmp_path / "bench.json").read_text())) == []
    assert {p["problem"]: p["task"]["kind"] for p in result["problems"]} == {k: v[0] for k, v in SUITE.items()}
    metrics = {p["problem"]: p["metric"] for p in result["problems"]}
    assert metrics == {"adult-logistic": "test_error", "ijcnn1-logistic": "test_error", "mnist-cnn": "test_error",
                       "california-diff2": "test_loss", "heavy-tailed-regression": "test_mse",
                       "nonsmooth-o2nc": "test_mae"}
    for problem in result["problems"]:
        (cell,) = problem["cells"]
        assert cell["epsilon"] == 1.0 and set(cell["methods"]) == set(SUITE[problem["problem"]][1])
        means = {name: entry["test_error"]["mean"] for name, entry in cell["methods"].items()}
        assert all(math.isfinite(m) and m >= 0 for m in means.values()), (problem["problem"], means)
        if cell["winner"] is None:  # a tie (ijcnn1's short quick runs may all stay at the majority class's error)
            assert min(means, key=means.get) in cell["tied"] and len(cell["tied"]) > 1
        else:
            assert cell["winner"] == min(means, key=means.get) and 0 <= cell["p_value"] <= 1
        for entry in cell["methods"].values():
            assert entry["test_error"]["std"] >= 0 and entry["expected_passes"] > 0
            assert 0.9 <= entry["epsilon_tuning_and_training"] <= 1.0
    # the classifier's error is a rate; DIFF2's planned passes are one per round (every client's shard)
    assert 0 < means_of(result, "mnist-cnn")["dp-sgd"] < 1
    diff2 = next(p for p in result["problems"] if p["problem"] == "california-diff2")
    assert diff2["cells"][0]["methods"]["diff2-gd"]["expected_passes"] == pytest.approx(
        1.5 * diff2["steps"]["diff2-gd"], rel=0.01)


def means_of(result: dict, name: str) -> dict[str, float]:
    problem = next(p for p in result["problems"] if p["problem"] == name)
    return {method: entry["test_error"]["mean"] for method, entry in problem["cells"][0]["methods"].items()}


def test_a_task_holds_out_validation_records_of_the_training_data():
    from dpopt.bench.tasks import build_task
    from dpopt.experiments.o2nc_nonsmooth import synthetic
    from dpopt.tuning.task import split

    task = build_task({"kind": "truncated-absolute", "dim": 8, "n": 1000, "cap": 2.0}, validation_fraction=0.2,
                      data_dir=None)
    X, y, X_test, y_test = (torch.as_tensor(a) for a in synthetic(8, 1000))
    _, _, _, y_val = split(X, y, 0.2)
    assert task.oracle.n == 800 and task.metric == "test_mae" and task.theta0 is None
    zero = torch.zeros(8, dtype=torch.float64)  # at θ = 0 the mean absolute error is mean |y|
    assert task.validation_error(zero) == pytest.approx(float(y_val.abs().mean()), rel=1e-12)
    assert task.test_error(zero) == pytest.approx(float(y_test.abs().mean()), rel=1e-12)


@pytest.mark.parametrize("settings,message", [
    ({"kind": "svm"}, "task kind='svm' must be one of: glm, classifier"),
    ({"kind": "truncated-absolute", "dim": 8, "n": 100}, "missing a required argument: 'cap'"),
    ({"kind": "glm", "dataset": "adult", "model": "logistic", "reg": 0.0, "depth": 3}, "unexpected keyword"),
])
def test_a_task_refuses_unknown_kinds_and_settings(settings, message):
    from dpopt.bench.tasks import build_task

    with pytest.raises(DpoptError, match=message):
        build_task(settings, validation_fraction=0.2, data_dir=None)


def test_the_tables_name_the_metric_and_give_each_methods_cost_the_wall_time_labelled_not_private():
    """From bench.json alone: a problem's own metric, the planned expected passes (public) when the
    result has them, and, when it has diagnostics, the wall time per seed with the trials run,
    labelled NOT PRIVATE; without them, neither."""
    def entry(mean: float, passes: float) -> dict:
        return {"test_mse": {"mean": mean, "std": 0.1}, "epsilon_tuning_and_training": 0.99, "expected_passes": passes}

    cell = {"epsilon": 1.0, "winner": "a", "p_value": 0.01, "significant": True,
            "methods": {"a": entry(2.5, 12.0), "b": entry(3.0, 40.0)}}
    result = {"problems": [{"problem": "p", "dataset": "housing", "model": "ridge", "delta": 1e-5, "seeds": 2,
                            "trials": "T", "steps": {}, "grids": {}, "metric": "test_mse", "cells": [cell]}],
              "diagnostics": {"label": outputs.NOT_PRIVATE, "wall_time_s": 9.0,
                              "runs": [{"problem": "p", "epsilon": 1.0, "algorithm": "a", "wall_time_s": 6.0,
                                        "trials_run": [1, 3]}]}}
    text = markdown(result, "cmd")
    assert "test_mse of the privately selected θ" in text and "| a | **2.5000 (0.1000)** |" in text
    cell["methods"]["b"]["test_mse"] = {"mean": 7.9e26, "std": 1.8e27}  # a diverged method: not 27 digits
    assert "| b | 7.9e+26 (1.8e+27) |" in markdown(result, "cmd")
    assert "| expected passes (planned) | ε = 1 |\n|---|---|\n| a | 12 |\n| b | 40 |" in text
    assert "| wall time (NOT PRIVATE) | ε = 1 |\n|---|---|\n| a | 3.0 s (4 trials) |\n| b | – |" in text
    without = markdown({"problems": result["problems"]}, "cmd")
    assert "wall time (NOT PRIVATE)" not in without and "trials)" not in without
    for method in cell["methods"].values():  # a result without planned passes: no table of them
        del method["expected_passes"]
    assert "expected passes" not in markdown(result, "cmd")



LARGE_DELTA = """
[small]
task = { kind = "heavy-tailed", noise = "student-t", model = "ridge", n = 500, dim = 3, reg = 0.0 }
delta = 0.01
validation_fraction = 0.2
epsilons = [1.0]
seeds = 1
trials = { mean = 1.5, shape = 1.0 }

[small.methods.dp-sgd]
steps = 3
fixed = { batch_size = 50 }
grid = { lr = [0.1] }
"""


def test_bench_refuses_a_delta_of_at_least_one_over_n_unless_the_problem_allows_it(capsys, tmp_path):
    """δ ≥ 1/n is refused before any job runs, naming the problem file's key that accepts it."""
    file = tmp_path / "problems.toml"
    file.write_text(LARGE_DELTA)
    argv = ["bench", "--file", str(file), "--json", "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpopt: error: delta=0.01 must be < 1/n = ") and err.count("\n") == 1
    assert err.endswith("or allow_large_delta = true in problem 'small' of the problems file to accept this "
                        "knowingly\n")
    file.write_text(LARGE_DELTA.replace("delta = 0.01\n", "delta = 0.01\nallow_large_delta = true\n"))
    assert main([*argv, "--out", str(tmp_path / "allowed")]) == 0
    assert json.loads(capsys.readouterr().out)["problems"][0]["delta"] == 0.01
