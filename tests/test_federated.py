"""DIFF2 on the TorchDistributed backend (2 and 3 gloo processes on 127.0.0.1) against Local().

* The same seed gives the same trajectory (≤ 1e−6 relative; only float summation order differs).
* The server adds the noise once: x_r(z) − x_r(0) on the same round is the Local() difference,
  −η·z·2C·ξ/(mP), whatever the number of processes (K − 1 client draws would scale its variance
  by K − 1).
* A client process that dies makes the server stop within the process group's timeout with a
  clear error; its last checkpoint (with the ledger) is intact and a Local() run resumes it.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import dpopt
from dpopt import train
from dpopt.accounting import Ledger
from dpopt.base import Batch
from dpopt.distributed import HOST, Local, TorchDistributed, launch
from dpopt.sampling import Clients
from dpopt.mechanisms import SeededNoise
from test_distributed import glm  # the same n = 400, d = 5 data (tests/ is on sys.path)

N, DIM, SEED, STEPS, CLIENTS = 400, 5, 3, 12, 5  # glm()'s n and d; P = 5: ranks host 5, or 3 + 2 clients
TIMEOUT = 5  # seconds


def diff2(backend: Any, z: float = 1.0) -> dpopt.DIFF2:
    return dpopt.DIFF2(lr=0.5, clip=1.0, clip_diff=2.0, restart=4, noise_multiplier1=z, noise_multiplier2=z,
                       clients=Clients(N, CLIENTS), backend=backend)


def trajectory(backend: Any) -> dict[str, Any]:
    """θ^1 … θ^T of dpopt.run's loop (train.step), the ledger, and one first round at z and at 0."""
    algorithm = diff2(backend)
    sample_gen, noise_gen, _ = train.randomness(SEED)
    state = algorithm.init(torch.zeros(DIM, dtype=torch.float64), STEPS, sample_gen)
    ledger, thetas = Ledger(algorithm.relation()), []
    for t in range(STEPS):
        state, _ = train.step(algorithm, glm(), state, t, ledger, sample_gen, noise_gen)
        thetas.append(state.theta.clone())
    first = []
    for z in (2.5, 0.0):
        algo = diff2(backend, z)
        start = algo.init(torch.full((DIM,), 0.1, dtype=torch.float64), 1, torch.Generator())
        batch = Batch(0, algo.clients.sample(torch.Generator()), algo.clients)
        first.append(algo.step(start, batch, glm(), SeededNoise(9))[0].theta)
    return {"thetas": torch.stack(thetas), "event": ledger.event(), "noise": first[0] - first[1]}


def federated_worker() -> dict[int, dict[str, Any]]:
    """Each rank's trajectory with 3 processes, and with 2 (ranks 0 and 1 as a subgroup)."""
    torch.set_num_threads(1)
    results = {3: trajectory(TorchDistributed())}
    pair = dist.new_group([0, 1])  # (every rank must take part in making a group)
    if dist.get_rank() < 2:
        results[2] = trajectory(TorchDistributed(pair))
    return results


@pytest.fixture(scope="module")
def local() -> dict[str, Any]:
    return trajectory(Local())


@pytest.fixture(scope="module")
def ranks() -> list[dict[int, dict[str, Any]]]:
    return launch(federated_worker, 3)  # one launch (starting processes costs seconds)


@pytest.mark.parametrize("nproc", [2, 3])
def test_torch_backend_gives_the_local_trajectory_and_noise_once(local, ranks, nproc):
    for result in [rank[nproc] for rank in ranks[:nproc]]:  # every rank holds the server's x_r
        relative = (result["thetas"] - local["thetas"]).norm(dim=1) / local["thetas"].norm(dim=1)
        assert float(relative.max()) <= 1e-6
        assert result["event"] == local["event"]
        assert torch.allclose(result["noise"], local["noise"], rtol=1e-9, atol=0)
    xi = torch.randn(DIM, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    size = N // CLIENTS * CLIENTS
    assert torch.allclose(local["noise"], -0.5 * 2.5 * 2 * 1.0 * xi / size, rtol=1e-9, atol=0)
    assert float(local["thetas"][-1].norm()) > 0.1  # the run went somewhere


def _dying_rank(rank: int, port: int, folder: str) -> None:
    """Rank 1 (the only client rank) exits abruptly in round 7; rank 0 runs dpopt.run with
    checkpoints every 3 rounds and records the error it stops with, and when."""
    torch.set_num_threads(1)
    store = dist.TCPStore(HOST, port, None, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=TIMEOUT))
    oracle = glm()
    if rank == 1:
        calls = []

        def per_record(theta, indices):
            calls.append(1)
            if len(calls) > 12:  # rounds 1 and 5 ask once, the others twice: round 7
                os._exit(3)
            return type(oracle).per_record(oracle, theta, indices)

        oracle.per_record = per_record
    try:
        dpopt.run(diff2(TorchDistributed()), oracle, steps=STEPS, seed=SEED, log_every=1,
                  checkpoint_path=Path(folder, "run.ckpt") if rank == 0 else None, checkpoint_every=3)
        Path(folder, f"done-{rank}").write_text("finished")
    except dpopt._validate.DpoptError as err:
        Path(folder, f"error-{rank}").write_text(f"{time.monotonic()}\n{err}")
    # A process group whose peer died cannot be torn down cleanly: gloo's threads can call
    # std::terminate during interpreter shutdown (SIGABRT, seen under load). What this process had
    # to say is on disk, so leave without the teardown.
    os._exit(0)


def test_a_dead_client_stops_the_server_with_a_clear_error_and_the_checkpoint_resumes(tmp_path):
    store = dist.TCPStore(HOST, 0, None, is_master=True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_dying_rank, args=(rank, store.port, str(tmp_path))) for rank in (0, 1)]
    for process in processes:
        process.start()
    processes[1].join(60)
    died = time.monotonic()
    processes[0].join(60)
    assert processes[1].exitcode == 3 and processes[0].exitcode == 0
    when, message = Path(tmp_path, "error-0").read_text().split("\n", 1)
    assert float(when) - died < TIMEOUT  # within the process group's timeout
    assert "rank 0: gather failed, a process of the run died or stopped answering" in message
    assert not Path(tmp_path, "done-0").exists()
    saved = dpopt.checkpoint.load(Path(tmp_path, "run.ckpt"))
    assert saved.step == 6 and Ledger.from_state(saved.ledger).steps == 6
    resumed = dpopt.run(diff2(Local()), glm(), steps=STEPS, seed=SEED, log_every=1,
                        checkpoint_path=Path(tmp_path, "run.ckpt"), checkpoint_every=3)
    whole = dpopt.run(diff2(Local()), glm(), steps=STEPS, seed=SEED, log_every=1)
    assert torch.allclose(resumed.theta, whole.theta, rtol=1e-6, atol=0)
    assert resumed.final["epsilon"] == whole.final["epsilon"]


# ------------------------------------------------------------------------------ the command line

RUN = ["run", "--algorithm", "diff2-gd", "--dataset", "california_housing", "--model", "mlp", "--epsilon", "3",
       "--steps", "6", "--restart", "3", "--clip-diff", "3", "--seed", "2", "--json"]


def test_cli_torch_backend_gives_the_local_run(tmp_path, capfd, shared_data_dir):
    from dpopt.cli import main

    common = [*RUN, "--data-dir", str(shared_data_dir)]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    local = json.loads(capfd.readouterr().out)
    assert main([*common, "--backend", "torch", "--nproc", "2", "--out", str(tmp_path / "torch")]) == 0
    torch_run = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert torch_run["final"]["epsilon"] == local["final"]["epsilon"] <= 3
    assert torch_run["final"]["test_error"] == pytest.approx(local["final"]["test_error"], rel=1e-9)
    thetas = [torch.tensor(json.loads((tmp_path / which / "history.json").read_text())["theta"])
              for which in ("local", "torch")]
    assert float((thetas[1] - thetas[0]).norm() / thetas[0].norm()) <= 1e-6


def test_cli_torch_backend_errors_are_one_line(tmp_path, capsys):
    from dpopt.cli import main

    assert main([*RUN, "--backend", "torch", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "dpopt: error: nproc=1 must be >= 2 with backend='torch' (rank 0 is the server)\n"
    assert main([*RUN[:2], "dp-sgd", *RUN[3:], "--backend", "torch", "--nproc", "2", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("dpopt: error: backend='torch' runs the federated algorithms")
    assert main([*RUN, "--backend", "mpi", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "dpopt: error: backend='mpi' must be one of: local, torch\n"
