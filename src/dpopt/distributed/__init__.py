"""Runs over several processes: data-parallel training (the same algorithms, the same run) and
federated DIFF2 (clients and a server), and the launcher that starts their processes.

Threat model. The processes of a run trust each other and nobody else. A group that
:func:`launch` starts listens on nothing beyond this machine: its ranks meet through a file in a
private (0700) folder, gloo's sockets are bound to the loopback interface, and the ranks never
outlive the launcher. A seed the run draws itself (:func:`shared_secret_seed`) never leaves the
run's processes. Noise is added once, by the trusted party: in a data-parallel run every rank adds the
same single draw (from one shared secret seed) to the same all-reduced clipped sum, so the release
is the single-process one; in a federated run the server (rank 0) alone adds it, to the sum the
clients sent it, and the clients see only the released x. Every rank's ledger records the same
events and reports the same ε(δ) as one process would. Rank 0 alone writes results and checkpoints
and prints.

The modules (``sharded`` and ``federated`` import ``group``; nothing else of the package imports
another module of it):

* :mod:`~dpopt.distributed.group`: a process inside the group (:func:`world_size`, :func:`rank`),
  collectives that fail with a clear error (:func:`collective`), the checkpoint each rank resumes
  from (:func:`resumable`);
* :mod:`~dpopt.distributed.sharded`: data-parallel training (:class:`Sharded`,
  :class:`ShardedRows`, :func:`shared_secret_seed`), with the privacy argument;
* :mod:`~dpopt.distributed.federated`: DIFF2's backends (:class:`Local`, :class:`TorchDistributed`,
  :class:`ToServer`, :func:`backend`);
* :mod:`~dpopt.distributed.launcher`: forming the group: :func:`launch` (processes on this machine,
  supervised, stopped by signals, with a heartbeat) or :func:`init_from_env` (under torchrun).
"""

from .federated import Local, TorchDistributed, ToServer, backend
from .group import collective, rank, resumable, world_size
from .launcher import GRACE, HOST, LOOPBACK, PR_SET_PDEATHSIG, RANK_TIMEOUT, STOPPING, init_from_env, launch
from .sharded import Sharded, ShardedRows, shared_secret_seed

__all__ = ["GRACE", "HOST", "LOOPBACK", "PR_SET_PDEATHSIG", "RANK_TIMEOUT", "STOPPING", "Local", "Sharded",
           "ShardedRows", "ToServer", "TorchDistributed", "backend", "collective", "init_from_env", "launch", "rank",
           "resumable", "shared_secret_seed", "world_size"]
