"""The audit drives the distributed backends: data-parallel DP-SGD (``Sharded``) and DIFF2 on
``TorchDistributed`` (server on rank 0, clients on rank 1), each audited from inside two ranks.
Every rank sees the same releases, so every rank computes the same audit; half the claimed noise
is flagged and the honest run is not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from dpopt import audit
from dpopt.audit import bounds, worlds
from dpopt.distributed import TorchDistributed, launch
from tests.test_audit import Case, calibrated, honest, noise_divided_by, planned

SHARDED = Case("dp-sgd", honest, steps=20, n=99, batch=50, runs=4_000, engine=worlds.DataParallel())
#: DIFF2-GD, one restart round, 10 clients of 5 records (the canary in the first client's shard).
FEDERATED = Case("diff2-gd", honest, steps=1, n=49, batch=10, runs=1_000, delta=0.05, bound=bounds.ClopperPearson())


def on_ranks(mutate: Any) -> Any:
    """``mutate`` of DIFF2 on the torch backend, releasing its last iterate."""
    return lambda algo: mutate(dataclasses.replace(algo, backend=TorchDistributed(), output_rule="last"))


def audit_on_rank() -> dict[str, Any]:
    torch.set_num_threads(1)
    found = {}
    for label, mutate in (("honest", honest), ("noise/2", noise_divided_by(2))):
        found[f"sharded {label}"] = audit.audit(
            planned(SHARDED, calibrated(SHARDED, mutate)), name="dp-sgd", runs=SHARDED.runs, engine=SHARDED.engine,
            seed=11).to_dict()
        found[f"diff2 {label}"] = audit.audit(
            planned(FEDERATED, calibrated(FEDERATED, on_ranks(mutate))), name="diff2-gd", runs=FEDERATED.runs,
            bound=FEDERATED.bound, seed=11).to_dict()
    return found


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return launch(audit_on_rank, 2)


@pytest.mark.parametrize("backend", ["sharded", "diff2"])
def test_the_distributed_backends_are_audited(ranks: list[dict[str, Any]], backend: str) -> None:
    for label in ("honest", "noise/2"):
        first, second = ranks[0][f"{backend} {label}"], ranks[1][f"{backend} {label}"]
        assert {**first, "seconds": 0} == {**second, "seconds": 0}  # every rank saw the same releases
    honest_result, broken = ranks[0][f"{backend} honest"], ranks[0][f"{backend} noise/2"]
    assert broken["epsilon_lower_bound"] > broken["claimed_epsilon"], broken
    assert honest_result["epsilon_lower_bound"] <= honest_result["claimed_epsilon"], honest_result
