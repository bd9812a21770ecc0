"""Diverged runs stop: a non-finite θ (or objective, where it is computed) ends the run at that
step with the history, the checkpoint and the ledger of every step taken; ``dpopt run`` then
exits with code 3 and one line, having written strict JSON and a figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import dpopt
from dpopt import checkpoint, train
from dpopt.accounting import Ledger
from dpopt.cli import EXIT_DIVERGED, main

STEPS = 300


def ridge() -> dpopt.oracles.Ridge:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(200, 4, generator=gen, dtype=torch.float64)
    return dpopt.oracles.Ridge(X, X[:, 0].clone())


def gradient_descent() -> dpopt.Storm:
    """Full-batch gradient descent with a step 100 times too long: F grows geometrically."""
    return dpopt.Storm(lr=100.0, momentum=1.0, batch_size0=200, batch_size=200, sampling=dpopt.sampling.FixedSize)


def first_non_finite_step(algorithm: dpopt.Storm) -> int:
    """The step after which θ first has a non-finite entry (the run's loop, replayed)."""
    sample_gen, noise_gen, _ = train.randomness(0)
    state = algorithm.init(torch.zeros(4, dtype=torch.float64), STEPS, sample_gen)
    ledger = Ledger(algorithm.relation())
    for t in range(STEPS):
        state, _ = train.step(algorithm, ridge(), state, t, ledger, sample_gen, noise_gen)
        if not torch.isfinite(state.theta).all():
            return t + 1
    raise AssertionError("θ stayed finite")


def test_a_non_finite_theta_stops_the_run_and_keeps_its_ledger(tmp_path: Path) -> None:
    """θ is checked after every step, not only where it is logged."""
    path = tmp_path / "checkpoint.pt"
    settings = {"steps": STEPS, "seed": 0, "log_every": 50, "train_metrics": False, "checkpoint_path": path,
                "checkpoint_every": 1}
    history = dpopt.run(gradient_descent(), ridge(), **settings)
    at = first_non_finite_step(gradient_descent())
    assert 100 < at < STEPS and at % 50  # between two log points
    assert history.diverged_at == history.steps_done == at
    assert history.stopped == f"diverged at step {at}: θ has non-finite entries"
    assert [r["step"] for r in history.records] == [50, 100, at]  # the step it diverged at is logged
    saved = checkpoint.load(path)
    assert saved.step == at and saved.progress.diverged_at == at
    assert Ledger.from_state(saved.ledger).steps == at  # every step taken is accounted
    resumed = dpopt.run(gradient_descent(), ridge(), **settings)  # resuming a diverged run takes no step
    assert resumed.diverged_at == resumed.steps_done == at and resumed.stopped == history.stopped
    assert Ledger.from_state(checkpoint.load(path).ledger).steps == at


def test_the_non_private_objective_does_not_decide_when_to_stop() -> None:
    """Only θ, which is released, decides divergence: the training objective is a non-private
    diagnostic (and computed only when asked for), so a stop on it would release something about
    the data. Here F overflows at step 100 while θ is still finite; the run stops when θ does."""
    history = dpopt.run(gradient_descent(), ridge(), steps=STEPS, seed=0, log_every=50, diagnostics=True)
    assert history.diagnostics["records"][1]["objective"] == math.inf  # at step 100
    assert history.diverged_at == first_non_finite_step(gradient_descent()) > 100
    assert history.stopped.endswith("θ has non-finite entries")


def _strict(text: str) -> object:
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_findings_diff2_run_no_longer_turns_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  shared_data_dir: Path) -> None:
    """Finding: this run ended with every θ entry NaN (a zero clip C2·‖x_{r−1} − x_{r−2}‖ gave NaN
    clip weights), wrote NaN tokens, then exited 1 with a matplotlib OverflowError traceback. The
    zero clip now releases 0: θ stays finite (the test loss overflows, written as null)."""
    code = main(["run", "--algorithm", "diff2-gd", "--dataset", "california_housing", "--model", "mlp",
                 "--epsilon", "1", "--steps", "60", "--lr", "1e6", "--data-dir", str(shared_data_dir),
                 "--out", str(tmp_path), "--seed", "0", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and _strict(out)["diverged_at"] is None
    history = _strict((tmp_path / "history.json").read_text())
    assert all(math.isfinite(value) for value in history["theta"])
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_diverged_cli_run_exits_3_with_strict_json_and_its_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step of 1e308 times AClip's noised mean overflows θ at the first step."""
    code = main(["run", "--algorithm", "aclip", "--dataset", "adult", "--epsilon", "1", "--steps", "10",
                 "--lr", "1e308", "--seed", "0", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert code == EXIT_DIVERGED == 3
    summary = _strict(out)
    at = summary["diverged_at"]
    assert 1 <= at < 10 and summary["steps_done"] == at
    assert err == (f"dpopt: error: the run diverged at step {at}: θ has non-finite entries (try a smaller --lr); "
                   f"its history, checkpoint and ledger are in {tmp_path}\n")
    history = _strict((tmp_path / "history.json").read_text())
    assert history["diverged_at"] == at and history["stopped"] == summary["stopped"]
    assert history["records"][-1]["step"] == at
    saved = checkpoint.load(tmp_path / "checkpoint.pt")
    assert saved.step == at and Ledger.from_state(saved.ledger).steps == at
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "summary.md").exists()


@pytest.mark.parametrize("entries, finite", [
    ([0.0, -1.5, 2.0], True),
    ([1e308, 1e308, -1e308], True),   # the sum overflows to ∞, yet every entry is finite
    ([1.0, math.nan, 2.0], False),
    ([1.0, math.inf, -math.inf], False),  # ∞ − ∞: a NaN sum
    ([-math.inf], False),
])
@pytest.mark.parametrize("padding", [0, train.SMALL_THETA])  # a small θ (summed as a list) and a larger one
def test_the_divergence_check_is_exact_even_where_the_sum_overflows(entries: list[float], finite: bool,
                                                                    padding: int) -> None:
    """``all_finite`` answers from one sum where it can; an overflowing sum of finite entries must
    not be read as divergence (the mutant ``isfinite(sum)`` alone fails the second case)."""
    theta = torch.tensor(entries + [0.0] * padding, dtype=torch.float64)
    assert (theta.numel() <= train.SMALL_THETA) == (padding == 0)
    assert train.all_finite(theta) is finite
    assert finite == bool(torch.isfinite(theta).all())
