"""Federated backends of DIFF2: where the clients and their server run, and how the clients' clipped
sum reaches the server.

:class:`Local`: clients and server in one process (the default). :class:`TorchDistributed`: rank 0
of a ``torch.distributed`` group is the server (the trusted party: it alone adds the noise, once per
round), the other ranks host the clients; a client's clipped sum goes to rank 0 only, and nothing
but the released x comes back. :func:`backend` picks one by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import dp_accounting as dpa
import torch
import torch.distributed as dist
from torch import Tensor

from .._validate import DpoptError
from ..base import PerRecord
from .group import collective


class Local:
    """Federated clients and their server in one process (the default backend of DIFF2).

    The interface every backend offers a federated algorithm: ``hosted(P)``, the clients this
    process computes for; ``rows(local)``, per-record vectors whose weighted sum reaches the
    server only (:func:`~dpopt.clipping.clip_sum` makes the Bounded sum there); ``is_server``,
    whether this process adds the noise; ``broadcast(x, event)``, the server's x and the event
    of the release it made, on every process (each process's ledger holds the server's events).
    """

    is_local = True
    is_server = True

    def hosted(self, clients: int) -> range:
        return range(clients)

    def rows(self, local: PerRecord) -> PerRecord:
        return local

    def broadcast(self, x: Tensor, event: dpa.GaussianDpEvent) -> tuple[Tensor, dpa.GaussianDpEvent]:
        return x, event


class TorchDistributed:
    """Federated clients on ``torch.distributed``: rank 0 is the server, ranks 1 … K − 1 host
    the clients (client p on rank 1 + p mod (K − 1), so several per rank when P > K − 1).

    A round: each client rank sums its clients' clipped vectors (records of clients it hosts
    only) and **gathers** the sum to rank 0 (point-to-point to the root: no rank receives
    another rank's message; never an all-reduce); rank 0 adds the sums in rank order, adds the
    noise once, updates x and broadcasts it. Nothing but x reaches a client. A gather or
    broadcast that fails (a process died, or none answered within the process group's
    timeout) raises a :class:`~dpopt._validate.DpoptError` saying so.
    """

    is_local = False

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    @property
    def is_server(self) -> bool:
        return dist.get_rank(self.group) == 0

    def hosted(self, clients: int) -> range:
        world, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        if world < 2:
            raise DpoptError(f"nproc={world} must be >= 2 for the torch backend (rank 0 is the server)")
        return range(0) if me == 0 else range(me - 1, clients, world - 1)

    def rows(self, local: PerRecord) -> PerRecord:
        return ToServer(local, self)

    def to_server(self, local: Tensor) -> Tensor:
        """Σ over client ranks of ``local`` on the server (rank order); zeros on a client."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self.group))] if self.is_server else None
        collective(dist.gather, local, parts, dst=dist.get_global_rank(self.group, 0) if self.group else 0,
                   group=self.group)
        if parts is None:
            return torch.zeros_like(local)
        total = parts[1].clone()
        for part in parts[2:]:
            total += part
        return total

    def broadcast(self, x: Tensor, event: dpa.GaussianDpEvent) -> tuple[Tensor, dpa.GaussianDpEvent]:
        """The server's x and its release's ``GaussianDpEvent`` on every rank, in one message (x
        in float64 with the noise multiplier appended; a client's own ``event`` is ignored)."""
        packed = torch.cat([x.double().reshape(-1), x.new_tensor([event.noise_multiplier], dtype=torch.float64)])
        collective(dist.broadcast, packed, src=dist.get_global_rank(self.group, 0) if self.group else 0,
                   group=self.group)
        return packed[:-1].to(x.dtype).reshape(x.shape), dpa.GaussianDpEvent(float(packed[-1]))


@dataclass(frozen=True)
class ToServer:
    """A :class:`~dpopt.base.PerRecord` of a client rank whose weighted sum goes to the server."""

    local: PerRecord
    backend: TorchDistributed

    def norms(self) -> Tensor:
        return self.local.norms()

    def weighted_sum(self, weights: Tensor) -> Tensor:
        return self.backend.to_server(self.local.weighted_sum(weights))


def backend(name: str) -> Local | TorchDistributed:
    """The backend named ``name``: "local" or "torch"."""
    if name not in ("local", "torch"):
        raise DpoptError(f"backend={name!r} must be one of: local, torch")
    return Local() if name == "local" else TorchDistributed()
