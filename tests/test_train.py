"""The training loop: checkpoint/resume after SIGKILL, refusal of foreign checkpoints."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch

from dpopt import _validate, checkpoint
from dpopt.accounting import PlanMismatch, epsilon_of
from dpopt.algorithms import DPSGD
from dpopt.oracles import Logistic
from dpopt.train import run

RUN = [sys.executable, "-m", "dpopt.cli", "run", "--algorithm", "dp-srm", "--dataset", "adult", "--epsilon", "1",
       "--steps", "1500", "--batch-size", "64", "--checkpoint-every", "10", "--seed", "0", "--json"]


def _final(out: Path) -> dict:
    return json.loads((out / "history.json").read_text())


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    process = subprocess.Popen(RUN + ["--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoint_file = killed / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint_file.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # let it run on, past a few more checkpoint writes
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed: make it longer"
    assert not (killed / "history.json").exists()
    saved = checkpoint.load(checkpoint_file)
    assert 0 < saved.step < 1500

    resumed = subprocess.run(RUN + ["--out", str(killed)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    whole = tmp_path / "whole"
    uninterrupted = subprocess.run(RUN + ["--out", str(whole)], capture_output=True, text=True, timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    a, b = _final(killed), _final(whole)
    assert a["theta"] == b["theta"]
    assert a["final"]["epsilon"] == b["final"]["epsilon"]
    assert [r["epsilon"] for r in a["records"]] == [r["epsilon"] for r in b["records"]]
    assert a["records"] == b["records"]
    leftovers = [p.name for p in killed.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def _problem() -> Logistic:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(300, 4, generator=gen, dtype=torch.float64)
    y = torch.where(X[:, 0] + 0.3 * torch.randn(300, generator=gen, dtype=torch.float64) > 0, 1.0, -1.0)
    return Logistic(X, y)


def test_resume_refuses_a_different_configuration(tmp_path: Path) -> None:
    oracle, path = _problem(), tmp_path / "ckpt.pt"
    run(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), oracle, steps=20, seed=0,
        checkpoint_path=path, checkpoint_every=5)
    with pytest.raises(_validate.DpoptError, match=r"belongs to another run: its algorithm.lr is 0.5, this run's is "
                                                   r"0.25; resume with the same settings, or use another --out"):
        run(DPSGD(lr=0.25, clip=1.0, noise_multiplier=1.0, batch_size=30), oracle, steps=20, seed=0,
            checkpoint_path=path, checkpoint_every=5)


def test_resume_of_a_finished_run_returns_the_same_result(tmp_path: Path) -> None:
    oracle, path = _problem(), tmp_path / "ckpt.pt"
    algo = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30)
    first = run(algo, oracle, steps=20, seed=3, checkpoint_path=path, checkpoint_every=5)
    again = run(algo, oracle, steps=20, seed=3, checkpoint_path=path, checkpoint_every=5)
    assert torch.equal(first.theta, again.theta)
    assert first.final["epsilon"] == again.final["epsilon"]


def test_unwritable_output_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(_validate.DpoptError, match="must be a writable directory"):
        run(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), _problem(), steps=5, seed=0,
            checkpoint_path=blocker / "sub" / "ckpt.pt", checkpoint_every=1)


def test_max_epsilon_stops_before_the_step_that_would_exceed_it() -> None:
    algo, oracle = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), _problem()
    history = run(algo, oracle, steps=400, seed=0, max_epsilon=2.0)
    assert history.final["epsilon"] <= 2.0
    assert history.stopped == "max_epsilon=2.0 reached"
    next_step = epsilon_of(algo.planned_event(oracle.n, history.steps_done + 1), 1e-5, algo.relation())
    assert next_step > 2.0
    assert 0 < history.steps_done < 400


class LastEventLeftOut(DPSGD):
    """DP-SGD whose last step releases its noised sum but returns no event for it."""

    def step(self, state, batch, oracle, source):
        new, event = super().step(state, batch, oracle, source)
        return new, dpa.NoOpDpEvent() if batch.t == STEPS - 1 else event


STEPS = 20


def test_a_run_whose_last_release_is_not_in_the_ledger_is_refused() -> None:
    """Mutant: the last step's event left out. Every event is the same atom, so the ledger stays a
    prefix of the plan at every step; the end of the run catches it (the finished double entry)."""
    oracle = _problem()
    honest = run(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), oracle, steps=STEPS, seed=0)
    assert honest.steps_done == STEPS
    with pytest.raises(PlanMismatch, match=f"recorded {STEPS - 1} of its plan's {STEPS} events"):
        run(LastEventLeftOut(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), oracle, steps=STEPS, seed=0)


def test_diagnostics_are_opt_in_apart_and_change_nothing_of_the_run() -> None:
    """By default no diagnostic is computed; ``diagnostics=True`` adds them apart, labelled;
    ``train_metrics=False`` skips F and ‖∇F‖ (NaN) among them. The run itself is the same."""
    algo, oracle = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), _problem()
    plain = run(algo, oracle, steps=20, seed=3, log_every=5)
    full = run(algo, oracle, steps=20, seed=3, log_every=5, diagnostics=True)
    bare = run(algo, oracle, steps=20, seed=3, log_every=5, diagnostics=True, train_metrics=False)
    assert torch.equal(full.theta, bare.theta) and torch.equal(full.theta, plain.theta)
    assert plain.diagnostics is None and plain.records == full.records == bare.records
    assert full.diagnostics["label"].startswith("NOT PRIVATE")
    logged = bare.diagnostics["records"] + [bare.diagnostics["final"]]
    assert all(math.isnan(r["objective"]) and math.isnan(r["grad_norm"]) for r in logged)
    assert all(math.isfinite(r["objective"]) for r in full.diagnostics["records"])


def test_log_metrics_are_measured_at_every_log_point_and_the_output_without_changing_the_run() -> None:
    algo, oracle = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), _problem()
    seen = []

    def norm(theta: torch.Tensor) -> dict[str, float]:
        seen.append(theta.clone())
        return {"theta_norm": float(theta.norm())}

    plain = run(algo, oracle, steps=20, seed=3, log_every=5)
    logged = run(algo, oracle, steps=20, seed=3, log_every=5, log_metrics=norm, diagnostics=True)
    assert torch.equal(plain.theta, logged.theta) and len(seen) == 4 + 1  # steps 5, 10, 15, 20 and the output
    assert [r["theta_norm"] for r in logged.diagnostics["records"]] == [float(t.norm()) for t in seen[:4]]
    assert logged.diagnostics["final"]["theta_norm"] == float(plain.theta.norm())


def test_delta_of_at_least_one_over_n_is_refused_unless_allowed() -> None:
    """δ ≥ 1/n admits publishing a record whole with probability δ: dpopt.run refuses it by default."""
    algo, oracle = DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), _problem()
    with pytest.raises(_validate.DpoptError, match=r"^delta=0.01 must be < 1/n = 0.00333 for n=300 records: with "
                                                   r"δ ≥ 1/n, publishing each record whole with probability δ \(about "
                                                   r"nδ = 3 records\) meets the guarantee; give a smaller delta, or "
                                                   r"allow_large_delta=True \(--allow-large-delta\) to accept this "
                                                   r"knowingly$"):
        run(algo, oracle, steps=2, seed=0, delta=0.01)
    run(algo, oracle, steps=2, seed=0, delta=1 / 301)
    assert run(algo, oracle, steps=2, seed=0, delta=0.01, allow_large_delta=True).delta == 0.01


def test_an_accountant_switch_is_warned_and_written() -> None:
    """Finding: a tiny noise (huge ε) switched the accountant from PLD to RDP without a word."""
    oracle = _problem()
    with pytest.warns(_validate.DpoptWarning, match="accountant='pld' was asked for and 'rdp' is used: its privacy "
                                                    "loss distribution would exceed the grid's memory"):
        history = run(DPSGD(lr=0.5, clip=1.0, noise_multiplier=0.002, batch_size=30), oracle, steps=5, seed=0)
    assert history.accountant == "rdp" and history.accountant_note.startswith("accountant='pld' was asked for")
    assert history.to_dict()["accountant_note"] == history.accountant_note
    plain = run(DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=30), oracle, steps=5, seed=0)
    assert plain.accountant == "pld" and plain.accountant_note is None
