"""Data-parallel training: 2 gloo processes on 127.0.0.1 give one process's run.

Every case runs in two ranks (``dpopt.distributed.launch``) on :class:`Sharded` oracles and in
this process on the plain oracle, with the same seed: the θ trajectories agree to 1e−6
(relative; bit for bit where the gradient sums are exact, so that only the noise and the sampling
move θ), the ledgers are the same events with the same ε, and the two ranks agree bit for bit.
All cases share one launch (starting processes costs seconds).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dpopt
from dpopt import train
from dpopt.accounting import Ledger
from dpopt.distributed import Sharded, ShardedRows, launch, resumable

N, DIM, DELTA, SEED, STEPS = 400, 5, 1e-5, 3, 20


@cache
def glm() -> dpopt.oracles.NonconvexLogistic:
    """n = 400, d = 5 logistic data with the nonconvex regulariser (as in the contract tests)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    w = torch.randn(DIM, generator=gen, dtype=torch.float64)
    y = torch.where(X @ w + 0.5 * torch.randn(N, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return dpopt.oracles.NonconvexLogistic(X, y, reg=0.1)


def _bce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), y, reduction="none")


def mlp(engine: str) -> dpopt.oracles.TorchModel:
    """A 5-8-1 tanh network (float64) on the GLM's data, labels in {0, 1}."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    data = glm()
    return dpopt.oracles.TorchModel(net, _bce, data.X, (data.y > 0).double(), engine=engine)


def _linear(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.squeeze(-1) * y


def integer_linear() -> dpopt.oracles.TorchModel:
    """f_i(θ) = y_i⟨x_i, θ⟩ with small integer x_i and y_i = ±1: every per-record gradient y_i·x_i is
    an integer vector whatever θ is, with norm below the clip 10 (weight exactly 1), so a batch's
    clipped sum is exact in float64 in any summation order and the trajectory depends on the noise
    and the sampling alone: two ranks must give one process's θ bit for bit."""
    gen = torch.Generator().manual_seed(1)
    X = torch.randint(-3, 4, (N, DIM), generator=gen).double()
    y = torch.randint(0, 2, (N,), generator=gen).double() * 2 - 1
    net = nn.Linear(DIM, 1, bias=False).double()
    with torch.no_grad():
        net.weight.zero_()
    return dpopt.oracles.TorchModel(net, _linear, X, y, engine="vmap")


def _srm(batch_size: int) -> dpopt.DPSRM:
    return dpopt.DPSRM(lr=0.5, clip=1.0, clip_diff=0.1, gamma=0.3, noise_multiplier0=1.0, noise_multiplier=1.0,
                       batch_size0=2 * batch_size, batch_size=batch_size)


# name: (algorithm, oracle) — made in each process, identically
CASES = {
    "dpsgd-poisson": lambda: (dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40), glm()),
    "dpsrm-poisson": lambda: (_srm(40), glm()),
    "aclip": lambda: (dpopt.AClip(lr=0.5, clip=0.25, noise_multiplier=1.0, batch_size=40), glm()),
    "storm": lambda: (dpopt.Storm(lr=0.5, momentum=0.3, batch_size0=80, batch_size=40), glm()),
    "dpagd": lambda: (dpopt.DPAGD(noise_multiplier=1.0, clip=1.0, obj_clip=2.0, grad_fraction=0.05,
                                  select_fraction=0.05, adapt_every=5), glm()),
    # expected batch 1 of 400: most batches are empty or one record, so a rank's share is often empty
    "dpsgd-tiny-batch": lambda: (dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=1), glm()),
    "dpsrm-tiny-batch": lambda: (_srm(1), glm()),
    "mlp-ghost-dpsrm": lambda: (_srm(40), mlp("ghost")),
    "mlp-vmap-dpsgd": lambda: (dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40), mlp("vmap")),
    # banded noise: every rank draws the same key and the same correlated noise from the shared seed
    "dpsgd-banded": lambda: (dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=1.0, batch_size=40, bands=4), glm()),
    # ... to the bit: sums of integer gradients do not depend on the summation order (EXACT)
    "dpsgd-banded-exact": lambda: (dpopt.DPSGD(lr=0.5, clip=10.0, noise_multiplier=1.0, batch_size=40, bands=4),
                                   integer_linear()),
    # adaptive clipping: each rank counts its share, the counts are all-reduced with the sums
    "dpsgd-quantile": lambda: (dpopt.DPSGD(lr=0.5, clip=0.3, noise_multiplier=1.0, batch_size=40, clip_quantile=0.5,
                                           count_noise=5.0), glm()),
    "mlp-ghost-quantile": lambda: (dpopt.DPSGD(lr=0.5, clip=0.3, noise_multiplier=1.0, batch_size=40,
                                               clip_quantile=0.5, count_noise=5.0), mlp("ghost")),
}


# the cases whose gradient sums are exact: θ equals one process's bit for bit
EXACT = {"dpsgd-banded-exact"}

# ε(δ) at every step costs ~0.1 s a step: the other cases log at the end only
LOG_EVERY_STEP = {"dpsgd-poisson", "dpsrm-poisson"}


class Counting(Sharded):
    """Counts the records this rank computes per-record vectors of, and the batches' sizes."""

    def __init__(self, oracle: Any) -> None:
        super().__init__(oracle)
        self.local, self.total, self.smallest = 0, 0, math.inf

    def per_record(self, theta: torch.Tensor, indices: torch.Tensor) -> ShardedRows:
        rows = super().per_record(theta, indices)
        self.local, self.total = self.local + rows.local_size, self.total + rows.size
        self.smallest = min(self.smallest, rows.size)
        return rows


def run_case(name: str, sharded: bool) -> dict[str, Any]:
    """θ^1 … θ^T and the ledger of ``dpopt.run``'s loop (replayed with ``train.step``), and the
    History of ``dpopt.run`` itself (logged every step for ``LOG_EVERY_STEP``, else at the end)."""
    algorithm, oracle = CASES[name]()
    if sharded:
        oracle = Counting(oracle)
    theta0 = oracle.flat_params() if hasattr(oracle, "flat_params") else torch.zeros(DIM, dtype=torch.float64)
    sample_gen, noise_gen, _ = train.randomness(SEED)
    state = algorithm.init(theta0.double(), STEPS, sample_gen)
    ledger = Ledger(algorithm.relation())
    thetas, clips, keyed = [], [], train.keyed(algorithm)
    for t in range(STEPS):
        state, _ = train.step(algorithm, oracle, state, t, ledger, sample_gen, noise_gen, keyed=keyed)
        thetas.append(state.theta.clone())
        clips.append(getattr(state, "clip", None))
    history = dpopt.run(algorithm, oracle, steps=STEPS, seed=SEED, delta=DELTA, theta0=theta0,
                        log_every=1 if name in LOG_EVERY_STEP else STEPS)
    counts = (oracle.local, oracle.total, oracle.smallest) if sharded else None
    return {"thetas": torch.stack(thetas), "event": ledger.event(), "epsilon": ledger.epsilon(DELTA),
            "history": history, "counts": counts, "clips": clips}


class Stop(Exception):
    """A run stopped half-way."""


def interrupted_then_resumed(folder: str) -> dict[str, Any]:
    """DP-SGD stopped by an error after step 13 (checkpoints every 5 steps), then resumed from
    rank 0's checkpoint by every rank (``resumable``), against one uninterrupted run."""
    algorithm, oracle = CASES["dpsgd-poisson"]()
    failing, calls = Sharded(oracle), []

    def per_record(theta: torch.Tensor, indices: torch.Tensor) -> ShardedRows:
        calls.append(1)
        if len(calls) > 13:  # the same step on every rank, before any collective of it
            raise Stop
        return Sharded.per_record(failing, theta, indices)

    failing.per_record = per_record  # (a subclass would change the run's fingerprint)
    path = Path(folder) / "checkpoint.pt"
    settings = {"steps": STEPS, "seed": SEED, "delta": DELTA, "log_every": 1}
    with pytest.raises(Stop), resumable(path) as own:
        dpopt.run(algorithm, failing, checkpoint_path=own, checkpoint_every=5, **settings)
    written = sorted(p.name for p in Path(folder).iterdir())
    with resumable(path) as own:
        resumed = dpopt.run(algorithm, Sharded(oracle), checkpoint_path=own, checkpoint_every=5, **settings)
    return {"resumed": resumed, "written": written, "whole": dpopt.run(algorithm, Sharded(oracle), **settings)}


def rank_worker(names: list[str], folder: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    return {name: run_case(name, sharded=True) for name in names} | {"resume": interrupted_then_resumed(folder)}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp(min=1e-300)).max())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch(rank_worker, 2, list(CASES), str(tmp_path_factory.mktemp("resume")))


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_one_process_run(ranks: list[dict[str, Any]], name: str) -> None:
    single = run_case(name, sharded=False)
    first, second = ranks[0][name], ranks[1][name]
    # both ranks hold the same iterates, bit for bit (the all-reduced sum and the noise are shared)
    assert torch.equal(first["thetas"], second["thetas"])
    assert torch.equal(first["history"].theta, second["history"].theta)
    # ... which are one process's iterates (up to summation order), every step
    assert _relative(first["thetas"], single["thetas"]) <= 1e-6
    assert _relative(first["history"].theta, single["history"].theta) <= 1e-6
    assert not torch.equal(single["thetas"][0], single["thetas"][-1])  # it moved
    if name in EXACT:  # the same noise and the same batches on every rank as in one process, to the bit
        assert torch.equal(first["thetas"], single["thetas"])
        assert torch.equal(first["history"].theta, single["history"].theta)
    for logged, reference in zip(first["history"].records, single["history"].records, strict=True):
        assert logged["step"] == reference["step"]
        assert logged["epsilon"] == reference["epsilon"]
        assert logged["expected_passes"] == reference["expected_passes"]
    # adaptive clipping: the same clips C_t (the count all-reduced), up to summation order
    if "quantile" in name:
        assert first["clips"] == second["clips"]
        assert first["clips"] == pytest.approx(single["clips"], rel=1e-6) and len(set(single["clips"])) == STEPS
    # the same ledger: the same events (noise once per release, same sampling), the same ε
    for rank in (first, second):
        assert rank["event"] == single["event"]
        assert rank["epsilon"] == single["epsilon"]
        # the claimed guarantee: the ledger's ε, or for DP-AGD's filter its budget (equal up to rounding)
        assert rank["history"].final["epsilon"] == single["history"].final["epsilon"] == pytest.approx(
            rank["epsilon"], rel=1e-12)
    # each rank computed per-record vectors of its share only; the shares partition the batches
    if name != "aclip":  # (AClip asks for gradient sums only)
        (local0, total, smallest), (local1, total1, _) = first["counts"], second["counts"]
        assert total == total1 > 0 and local0 + local1 == total and 0 < local1 < total
        if "tiny" in name:
            assert smallest <= 1  # some step gave rank 1 an empty share


def test_resume_from_rank_zeros_checkpoint(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        got = rank["resume"]
        assert got["written"] == ["checkpoint.pt"]  # rank 1 wrote nothing beside rank 0's
        assert torch.equal(got["resumed"].theta, got["whole"].theta)
        assert got["resumed"].final["epsilon"] == got["whole"].final["epsilon"]
    assert torch.equal(ranks[0]["resume"]["resumed"].theta, ranks[1]["resume"]["resumed"].theta)


def test_sharded_rows_weights_and_differences() -> None:
    """Without a group: the weight conventions and the checks (world of one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        oracle = Sharded(glm())
        theta, indices = torch.full((DIM,), 0.1, dtype=torch.float64), torch.tensor([3, 7, 11])
        rows = oracle.per_record(theta, indices)
        ones = torch.ones(3, dtype=torch.float64)
        assert torch.allclose(rows.weighted_sum(ones), glm().gradient_sum(theta, indices), rtol=1e-12)
        assert torch.allclose(oracle.gradient_sum(theta, None), glm().gradient_sum(theta, None), rtol=1e-12)
        with pytest.raises(ValueError, match="weights of length 2"):
            rows.weighted_sum(ones[:2])
        diff = rows - oracle.per_record(2 * theta, indices)
        assert isinstance(diff, ShardedRows)
        want = (glm().per_record(theta, indices) - glm().per_record(2 * theta, indices)).norms()
        assert torch.allclose(diff.norms(), want, rtol=1e-12)
        with pytest.raises(ValueError, match="same records"):
            rows - oracle.per_record(theta, indices[:2])
        assert oracle.reg == 0.1 and oracle.loss(theta) == glm().loss(theta)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ the command line

RUN = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "20", "--seed", "4", "--json"]


def test_cli_nproc_2_gives_the_nproc_1_run(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``dpopt run --nproc 2`` (through ``main``; capfd also sees the spawned processes' output)."""
    from dpopt.cli import main

    assert main([*RUN, "--out", str(tmp_path / "one")]) == 0
    one = json.loads(capfd.readouterr().out)
    assert main([*RUN, "--nproc", "2", "--out", str(tmp_path / "two")]) == 0
    lines = capfd.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # rank 0's summary, printed once by the launching process
    summary = json.loads(lines[0])
    assert summary["final"]["epsilon"] == one["final"]["epsilon"]
    assert summary["steps_done"] == one["steps_done"] == 20
    histories = [json.loads((tmp_path / which / "history.json").read_text()) for which in ("one", "two")]
    assert histories[1]["processes"] == 2 and histories[0]["processes"] == 1
    thetas = [torch.tensor(history["theta"]) for history in histories]
    assert _relative(thetas[1], thetas[0]) <= 1e-6
    assert [r["epsilon"] for r in histories[1]["records"]] == [r["epsilon"] for r in histories[0]["records"]]
    assert {p.name for p in (tmp_path / "two").iterdir()} == {p.name for p in (tmp_path / "one").iterdir()}


def test_cli_nproc_2_with_bands_gives_the_nproc_1_run(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``dpopt run --algorithm dp-bandmf --bands 4 --nproc 2``: every rank draws the same correlated noise
    and the same cyclic Poisson groups, so θ is the one-process run's (to the summation order of
    the gradient sum across ranks; to the bit where that sum is exact: the dpsgd-banded-exact case
    above), and the ledger is the same."""
    from dpopt.cli import main

    banded = [*RUN, "--algorithm", "dp-bandmf", "--bands", "4"]
    assert main([*banded, "--out", str(tmp_path / "one")]) == 0
    assert main([*banded, "--nproc", "2", "--out", str(tmp_path / "two")]) == 0
    capfd.readouterr()
    histories = [json.loads((tmp_path / which / "history.json").read_text()) for which in ("one", "two")]
    assert histories[1]["processes"] == 2
    thetas = [torch.tensor(history["theta"]) for history in histories]
    assert _relative(thetas[1], thetas[0]) <= 1e-12
    assert [r["epsilon"] for r in histories[1]["records"]] == [r["epsilon"] for r in histories[0]["records"]]
    assert main([*RUN, "--out", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain" / "history.json").read_text())
    assert _relative(torch.tensor(plain["theta"]), thetas[0]) > 1e-3  # the bands changed the run


def test_cli_nproc_2_without_a_seed_says_its_randomness_comes_from_the_operating_system(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Finding: `dpopt run --nproc 2` without --seed wrote "seeded by the user": the secret seed the
    first process draws from the operating system and shares was handed to the run as a seed. It is
    now an OsSeed, which gives the same generators as that number and says where it came from."""
    from dpopt.cli import main

    unseeded = [arg for arg in RUN if arg not in ("--seed", "4")]
    assert main([*unseeded, "--nproc", "2", "--out", str(tmp_path)]) == 0
    capfd.readouterr()
    assert json.loads((tmp_path / "history.json").read_text())["randomness"] == train.FROM_OS
    assert f"randomness: {train.FROM_OS}." in (tmp_path / "summary.md").read_text()
    shared = [train.randomness(seed) for seed in (train.OsSeed(4), 4)]
    assert [origin for _, _, origin in shared] == [train.FROM_OS, train.SEEDED]
    assert torch.equal(shared[0][0].get_state(), shared[1][0].get_state())  # the same generators as the number
    secure = train.randomness(4, dpopt.SystemNoise())[2]  # CSPRNG noise: the batches' origin is said too
    assert secure == f"{train.SYSTEM}; batches sampled from the user's seed, which must stay secret"


def test_cli_nproc_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dpopt.cli import main

    assert main([*RUN, "--nproc", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "dpopt: error: nproc=0 must be >= 1\n"
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun, which starts the processes itself
    assert main([*RUN, "--nproc", "2", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("dpopt: error: nproc=2 needs a process that is not already part of")
