"""The review's privacy findings, each reproduced: the guarantee a run reports, what it writes,
where its randomness comes from, and the smaller edges (non-private methods at an ε target,
secure noise across ranks, a zero clip, the label split, O2NC's neighbouring relation)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import dpopt
from dpopt import outputs, sampling, train
from dpopt._validate import DpoptError
from dpopt.base import Batch
from dpopt.cli import main
from dpopt.mechanisms import SeededNoise, SystemNoise
from tests.contracts.test_algorithms import CLIENTS, DIM, TABLE, oracle

RUN = ["run", "--dataset", "adult", "--epsilon", "1", "--steps", "20", "--json"]


def cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_dp_agd_reports_its_filters_budget_not_the_spend_so_far(capsys, tmp_path):
    """Finding: `dpopt run --algorithm dp-agd --dataset adult --epsilon 1 --steps 20 --json` printed
    ε = 0.2555, the realised spend. DP-AGD chooses its budgets from the data: only the filter's
    total is a guarantee, at every step."""
    result = cli(capsys, RUN[:1] + ["--algorithm", "dp-agd"] + RUN[1:] + ["--out", str(tmp_path / "agd")])
    assert 0.99 <= result["final"]["epsilon"] <= 1.0
    history = json.loads((tmp_path / "agd" / "history.json").read_text())
    assert all(0.99 <= record["epsilon"] <= 1.0 for record in history["records"])


def test_default_outputs_hold_no_non_private_number(capsys, tmp_path):
    """Finding: the training objective and gradient norm (exact, from the training data) and the
    realised passes were written by default. Now every written field is classified, and the
    diagnostics appear only with --diagnostics, apart and labelled."""
    out = tmp_path / "plain"
    printed = cli(capsys, RUN[:1] + ["--algorithm", "dp-sgd"] + RUN[1:] + ["--out", str(out)])
    written = json.loads((out / "history.json").read_text())
    for payload in (printed, written):
        assert outputs.unclassified(payload) == []
        assert "diagnostics" not in json.dumps(payload) or written["diagnostics"] is None
    assert written["diagnostics"] is None
    assert set(written["final"]) == set(outputs.PRIVATE_METRICS)
    assert "objective" not in (out / "summary.md").read_text()

    out = tmp_path / "diagnosed"
    cli(capsys, RUN[:1] + ["--algorithm", "dp-sgd"] + RUN[1:] + ["--out", str(out), "--diagnostics"])
    written = json.loads((out / "history.json").read_text())
    assert outputs.unclassified(written) == []
    assert written["diagnostics"]["label"] == outputs.NOT_PRIVATE
    assert {"objective", "grad_norm", "passes"} <= set(written["diagnostics"]["final"])
    assert "NOT PRIVATE" in (out / "summary.md").read_text()


def test_the_classifier_refuses_an_unclassified_or_misplaced_field():
    assert outputs.unclassified({"final": {"epsilon": 1.0, "loss_on_train": 0.3}}) == ["final.loss_on_train"]
    assert outputs.unclassified({"final": {"objective": 0.3}}) == ["final.objective"]  # a diagnostic, not apart
    assert outputs.unclassified({"diagnostics": {"final": {"objective": 0.3}}}) == []


def test_o2nc_clip_rate_and_fit_diagnostics_are_opt_in():
    """Finding: O2NC wrote its exact clip count into History.final (ε = ∞ for that field alone)."""
    algo = TABLE["o2nc-first-single"].make(1.0, 1.0)
    plain = dpopt.run(algo, oracle(), steps=30, log_every=30)
    assert "clip_rate" not in plain.final and plain.diagnostics is None
    diagnosed = dpopt.run(algo, oracle(), steps=30, log_every=30, diagnostics=True)
    assert "clip_rate" in diagnosed.diagnostics["final"]
    assert outputs.unclassified(plain.to_dict()) == [] and outputs.unclassified(diagnosed.to_dict()) == []


def test_fit_writes_only_private_numbers_by_default():
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 2))
    X = oracle().X.float()
    y = (oracle().y > 0).float()
    loss = lambda out, target: torch.nn.functional.cross_entropy(out, target.long(), reduction="none")  # noqa: E731
    history = dpopt.fit(model, loss, (X, y), epsilon=2.0, delta=1e-5, epochs=1, batch_size=40)
    assert outputs.unclassified(history.to_dict()) == [] and history.diagnostics is None


def test_default_randomness_is_secret_and_a_seed_makes_it_reproducible(capsys, tmp_path):
    """Finding: run, fit and the CLI defaulted to seed 0, so anyone could rerun the public
    configuration and subtract the noise. Two default runs now draw different noise; two runs
    with the same --seed are identical, and the output says what the guarantee rests on."""
    def theta(name: str, *extra: str) -> list[float]:
        cli(capsys, RUN[:1] + ["--algorithm", "dp-sgd"] + RUN[1:] + ["--out", str(tmp_path / name), *extra])
        written = json.loads((tmp_path / name / "history.json").read_text())
        return written["theta"], written["randomness"]

    (a, origin), (b, _) = theta("a"), theta("b")
    assert a != b and "operating system" in origin
    (c, seeded), (d, _) = theta("c", "--seed", "7"), theta("d", "--seed", "7")
    assert c == d and "seed staying secret" in seeded


def test_a_non_private_method_cannot_meet_an_epsilon_target(capsys):
    """Finding: `dpopt run --algorithm storm --epsilon 1` exited 0 reporting ε = ∞ as a result."""
    assert main(RUN[:1] + ["--algorithm", "storm"] + RUN[1:]) == 2
    assert "algorithm='storm' is not private" in capsys.readouterr().err
    with pytest.raises(DpoptError, match="algorithm='storm' is not private"):
        dpopt.fit(torch.nn.Linear(DIM, 2), lambda o, t: o.sum(1), (oracle().X, oracle().y), algorithm="storm",
                  epsilon=1.0, delta=1e-5, epochs=1)


class Ranked:
    """Stands for a data-parallel oracle (``distributed.Sharded``) without a process group."""

    shares_noise = True

    def __getattr__(self, name: str) -> object:
        return getattr(oracle(), name)


def test_secure_or_discrete_noise_is_refused_across_ranks_in_python_too():
    """Finding: the CLI refused noise='secure' with data-parallel ranks but the Python API did not
    (each rank would add its own draw)."""
    algo = TABLE["dpsgd-poisson"].make(1.0, 1.0)
    with pytest.raises(DpoptError, match="draws independently in every process"):
        dpopt.run(algo, Ranked(), steps=2, noise_source=SystemNoise())
    discrete = dpopt.dp_gd(lr=0.1, clip=1.0, noise_multiplier=1.0, noise=dpopt.mechanisms.DISCRETE)
    with pytest.raises(DpoptError, match="draws independently in every process"):
        dpopt.run(discrete, Ranked(), steps=2)


def test_a_zero_clip_releases_zero_not_nan():
    """Finding: DIFF2's clip C2·‖x_{r−1} − x_{r−2}‖ is 0 when the iterates coincide, and the
    release was NaN. A zero clip now zeroes every record: the release is exactly 0."""
    algo = TABLE["diff2-gd"].make(1.0, 1.0)
    theta = torch.full((DIM,), 0.3, dtype=torch.float64)
    state = algo.init(theta, 5, torch.Generator())._replace(estimate=torch.ones(DIM, dtype=torch.float64))
    sampler = algo.sampler(1, CLIENTS.n)
    new, _ = algo.step(state, Batch(1, sampler.sample(torch.Generator()), sampler), oracle(), SeededNoise(0))
    assert new.estimate.isfinite().all()
    assert torch.equal(new.estimate, state.estimate)  # ṽ_r = 0 (the clipped differences, no noise) + ṽ_{r−1}


def test_the_label_split_is_the_clients_arrangement_not_a_release():
    """Documented behaviour: the guarantee is per client data set as the split gives it. One
    changed label can move the label boundaries, so several shards change: the label split
    simulates a federation, it does not protect a pooled data set that is split by it. The
    i.i.d. split does not look at the data: a changed record changes only its own shard."""
    labels = torch.arange(40) % 4
    iid, label = sampling.Clients(40, 4, seed=1), sampling.Clients(40, 4, split="label", labels=labels, seed=1)
    changed = labels.clone()
    changed[0] = 3
    relabelled = sampling.Clients(40, 4, split="label", labels=changed, seed=1)
    assert sum(not torch.equal(a, b) for a, b in zip(label.shards, relabelled.shards)) > 1
    assert all(torch.equal(a, b) for a, b in zip(iid.shards, sampling.Clients(40, 4, seed=1).shards))
    assert "pooled data set" in sampling.Clients.__doc__


def test_o2nc_is_accounted_under_replace_one_like_the_methods_it_is_compared_with():
    """Finding: O2NC's ε was under replace-special while every method beside it in the reports
    is under replace-one (its calibrated ε = 1 run was ε = 2.13 under replace-one)."""
    algo = dpopt.calibrate(TABLE["o2nc-zeroth-single"].make(1.0, 1.0), epsilon=1.0, delta=1e-5, n=400, steps=30)
    history = dpopt.run(algo, oracle(), steps=30, log_every=30)
    assert history.neighboring_relation == "replace-one"
    assert 0.99 <= history.final["epsilon"] <= 1.0
    assert math.isclose(algo.tree_sensitivity(), 2 * max(algo.clip0 / algo.batch_size0, algo.clip / algo.batch_size))


class Crash(Exception):
    """Stands for the process dying mid-run."""


def test_a_run_without_a_seed_resumes_exactly_from_its_checkpoint(tmp_path, monkeypatch):
    """Without a seed the randomness comes from the operating system, and the checkpoint holds it:
    the interrupted run, resumed by a process whose own draws from the OS differ, ends where the
    uninterrupted run that drew the interrupted run's bytes ends (θ and ε). (An older copy of the
    checkpoint is not resumed once the run has moved on: tests/test_checkpoint.py.)"""
    algo = TABLE["dpsgd-poisson"].make(1.0, 1.0)
    path = tmp_path / "run.pt"
    calls = iter(range(100))

    def crash_after_six(theta: torch.Tensor) -> float:
        if next(calls) == 6:
            raise Crash
        return 0.0

    from_os = train.randomness

    def same_bytes(seed: int | None, source=None):  # what the interrupted and the uninterrupted run draw
        return from_os(1234 if seed is None else seed, source)

    with monkeypatch.context() as patch:
        patch.setattr(train, "randomness", same_bytes)
        with pytest.raises(Crash):
            dpopt.run(algo, oracle(), steps=12, log_every=1, test_error=crash_after_six, checkpoint_path=path,
                      checkpoint_every=3)
        whole = dpopt.run(algo, oracle(), steps=12, log_every=1)
    resumed = dpopt.run(algo, oracle(), steps=12, log_every=1, checkpoint_path=path, checkpoint_every=3)
    assert torch.equal(resumed.theta, whole.theta) and resumed.final["epsilon"] == whole.final["epsilon"]
    fresh = dpopt.run(algo, oracle(), steps=12, log_every=1)
    assert not torch.equal(fresh.theta, resumed.theta)  # a fresh run draws other noise
