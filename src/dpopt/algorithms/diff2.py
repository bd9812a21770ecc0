"""DIFF2: differentially private optimisation via gradient differences (Murata & Suzuki 2023),
with the GD routine (DIFF2-GD) and the BVR-L-SGD routine (DIFF2-BVR-L-SGD).

P clients hold equal shards D_p of m = n_min records (:class:`dpopt.sampling.Clients`); a
trusted server. Round r = 1 … R (step t = r − 1):

    restart ((r−1) mod T = 0):  S_r = Σ_p Σ_{z∈D_p} clip(∇ℓ(x_{r−1}, z), C1),
                                ṽ_r = (S_r + N(0, (z1·2C1)² I)) / (mP)
    otherwise:                  C_{2,r} = C2·‖x_{r−1} − x_{r−2}‖,
                                S_r = Σ_p Σ_{z∈D_p} clip(∇ℓ(x_{r−1}, z) − ∇ℓ(x_{r−2}, z), C_{2,r}),
                                ṽ_r = (S_r + N(0, (z2·2C_{2,r})² I)) / (mP) + ṽ_{r−1}
    GD routine:                 x_r = x_{r−1} − η ṽ_r        (T = 1 is DP-GD exactly)

S_r/(mP) is the paper's (1/P) Σ_p ClippedMean(D_p, C); the paper's σ relates to the noise
multipliers here by σ_i·C = z_i·2C/(mP), i.e. z_i = σ_i·n_min·P/2.

Privacy (ALGORITHMS.md §3): record level, for each client's data set, replace-one. Replacing one
record of D_p moves S_r by at most 2C (a record lives in one shard), and C_{2,r} depends only on
released iterates, so each round is a Gaussian mechanism of multiplier z1 (restart) or z2 with
respect to every D_p: events ⌈R/T⌉ × Gaussian(z1) and R − ⌈R/T⌉ × Gaussian(z2), in round order.
ṽ_{r−1} and the iterates are earlier releases (post-processing). The noise is drawn **once, by
the server** (``backend.is_server``), on the sum the clients sent it; clients see only x_r.

Clients are a view over one oracle: the algorithm holds the public partition (``clients``) and
asks the oracle for the per-record gradients of the records of the clients this process hosts
(``backend.hosted``: all of them with :class:`~dpopt.distributed.Local`); ``backend.rows``
routes their clipped sum to the server (:class:`~dpopt.distributed.TorchDistributed`: a gather
to rank 0) and ``backend.broadcast`` sends x_r back.

Output rule "uniform" (the paper): x_{r̂−1} with r̂ uniform on [R], drawn before training;
"last": x_R.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..clipping import PerRecord
from ..distributed import Local
from ..oracles import Oracle
from ._common import OUTPUT_RULES, Batch, Output, output_init, output_track, output_value


class DIFF2State(NamedTuple):
    theta: Tensor       # x_{r−1}
    prev: Tensor        # x_{r−2} (= x_{r−1} before the first round)
    estimate: Tensor    # ṽ_{r−1}
    theta_out: Tensor   # x^out_{r−1}: x_{r−1} (GD) or the routine's random local iterate (BVR)
    out: Output


@dataclass(frozen=True)
class DIFF2:
    """DIFF2-GD. Keyword-only hyper-parameters: step size ``lr`` (η), ``clip`` (C1),
    ``clip_diff`` (C2, scaled each round by ‖x_{r−1} − x_{r−2}‖), ``restart`` (T),
    ``noise_multiplier1``/``noise_multiplier2`` (z1, z2: noise std / sensitivity of the round's
    clipped sum), ``clients`` (the partition), ``output_rule`` ("uniform" or "last"),
    ``noise_ratios`` (z1 : z2, fixed while :func:`~dpopt.accounting.calibrate` scales them
    jointly; :func:`paper_ratios` gives the paper's split) and
    ``backend`` (where clients and server run; not a hyper-parameter: it does not change the
    trajectory, so it is left out of the repr and of checkpoint fingerprints)."""

    lr: float
    clip: float
    clip_diff: float
    restart: int
    noise_multiplier1: float
    noise_multiplier2: float
    clients: sampling.Clients
    output_rule: str = "uniform"
    noise_ratios: tuple[float, ...] = (1.0, 1.0)
    backend: Any = dataclasses.field(default_factory=Local, repr=False, compare=False)

    NOISE_FIELDS: ClassVar[tuple[str, ...]] = ("noise_multiplier1", "noise_multiplier2")

    def __post_init__(self) -> None:
        _validate.positive("lr", self.lr)
        _validate.positive("clip", self.clip, allow_inf=True)
        _validate.positive("clip_diff", self.clip_diff, allow_inf=True)
        _validate.positive_int("restart", self.restart)
        _validate.non_negative("noise_multiplier1", self.noise_multiplier1)
        _validate.non_negative("noise_multiplier2", self.noise_multiplier2)
        if not isinstance(self.clients, sampling.Clients):
            raise _validate.DpoptError(f"clients={self.clients!r} must be a dpopt.sampling.Clients partition")
        _validate.one_of("output_rule", self.output_rule, OUTPUT_RULES)
        ratios = self.noise_ratios
        if len(ratios) != len(self.NOISE_FIELDS) or not all(isinstance(r, float | int) and 0 < r < math.inf
                                                             for r in ratios):
            raise _validate.DpoptError(f"noise_ratios={ratios!r} must be {len(self.NOISE_FIELDS)} finite numbers > 0, "
                                       f"one per field {self.NOISE_FIELDS}")

    def relation(self) -> dpa.NeighboringRelation:
        return self.clients.relation

    def sampler(self, t: int, n: int) -> sampling.Clients:
        if n != self.clients.n:
            raise _validate.DpoptError(f"n={n} must equal the n={self.clients.n} the clients were split from")
        return self.clients

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> DIFF2State:
        return DIFF2State(theta0.clone(), theta0.clone(), torch.zeros_like(theta0), theta0.clone(),
                          output_init(self.output_rule, theta0, steps, gen))

    def restarts(self, t: int) -> bool:
        """Whether round r = t + 1 restarts the estimator ((r − 1) mod T = 0)."""
        return t % self.restart == 0

    def round_event(self, t: int) -> dpa.DpEvent:
        """The server's release in round t + 1."""
        return dpa.GaussianDpEvent(self.noise_multiplier1 if self.restarts(t) else self.noise_multiplier2)

    def estimate(self, state: DIFF2State, t: int, oracle: Oracle, gen: torch.Generator) -> Tensor:
        """ṽ_r on the server (zeros elsewhere: a client never sees it)."""
        indices = self.clients.records(self.backend.hosted(self.clients.count))
        if self.restarts(t):
            rows, clip, carried = self._rows(oracle, state.theta, indices), self.clip, None
        else:
            rows = self._rows(oracle, state.theta, indices) - self._rows(oracle, state.prev, indices)
            clip, carried = _scaled_clip(self.clip_diff, state.theta - state.prev), state.estimate
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, self.backend.rows(rows), clip)], self.relation())
        if not self.backend.is_server:
            return torch.zeros_like(state.theta)
        z = self.noise_multiplier1 if self.restarts(t) else self.noise_multiplier2
        noised, _ = mechanisms.gaussian(clipped, z, gen)
        estimate = noised / self.clients.expected_size
        return estimate if carried is None else estimate + carried

    @staticmethod
    def _rows(oracle: Oracle, theta: Tensor, indices: Tensor) -> PerRecord:
        if len(indices) == 0:  # the server hosts no client
            return clipping.Dense(theta.new_zeros(0, len(theta)))
        return oracle.per_record(theta, indices)

    def routine(self, state: DIFF2State, estimate: Tensor, t: int, oracle: Oracle,
                gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """GD routine: x_r = x_{r−1} − η ṽ_r; returns (x_r, x^out_r = x_r)."""
        theta = state.theta - self.lr * estimate
        return theta, theta

    def step(self, state: DIFF2State, batch: Batch, oracle: Oracle,
             gen: torch.Generator) -> tuple[DIFF2State, dpa.DpEvent]:
        estimate = self.estimate(state, batch.t, oracle, gen)
        out = output_track(state.out, batch.t, state.theta_out)
        theta, theta_out = self.routine(state, estimate, batch.t, oracle, gen)
        theta = self.backend.broadcast(theta)
        return DIFF2State(theta, state.theta, estimate, theta_out, out), self.event(batch.t)

    def event(self, t: int) -> dpa.DpEvent:
        """Everything round t + 1 spends."""
        return self.round_event(t)

    def output(self, state: DIFF2State) -> Tensor:
        return output_value(state.out, state.theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        self.sampler(0, n)
        return dpa.ComposedDpEvent([self.event(t) for t in range(steps)])


def paper_ratios(rounds: int, restart: int, u: float = 1.25) -> tuple[float, float]:
    """z1 : z2 of the paper's Proposition 4.1 (σ1² ∝ u⌈R/T⌉, σ2² ∝ u/(u−1)·(R − ⌈R/T⌉)):
    z1/z2 = √((u − 1)⌈R/T⌉ / (R − ⌈R/T⌉)), i.e. the restart rounds get 1/u of the RDP budget
    (the paper's experiments: u = 1.25). (1, 1) when every round restarts (T = 1)."""
    _validate.positive_int("rounds", rounds)
    _validate.positive_int("restart", restart)
    if not u > 1:
        raise _validate.DpoptError(f"u={u!r} must be > 1")
    restarts = -(-rounds // restart)
    if restarts == rounds:
        return (1.0, 1.0)
    return (math.sqrt((u - 1) * restarts / (rounds - restarts)), 1.0)


def _scaled_clip(clip: float, move: Tensor) -> float:
    """C·‖x_{k−1} − x_{k−2}‖ (∞ stays ∞ even for a zero move: the non-private method). A move that
    is not finite (the iterates diverged) gives 0: nothing more is released about the data."""
    if math.isinf(clip):
        return math.inf
    norm = float(move.norm())
    return clip * norm if math.isfinite(norm) else 0.0


@dataclass(frozen=True)
class DIFF2BVR(DIFF2):
    """DIFF2-BVR-L-SGD: DIFF2 with the BVR-L-SGD routine (the paper's Algorithm 4).

    Round r: x_1 = x_{r−1} − η ṽ_r; client p_r = (1 + r mod P) (0-based: r mod P) runs K − 1
    local steps k = 2 … K on batches I_k of ``local_batch`` = b records drawn without
    replacement from its shard:

        v_k = (Σ_{z∈I_k} clip(∇ℓ(x_{k−1}, z) − ∇ℓ(x_{k−2}, z), C3·‖x_{k−1} − x_{k−2}‖)
               + N(0, (z3·2C3‖x_{k−1} − x_{k−2}‖)² I)) / b + ṽ_{k−1},    x_k = x_{k−1} − η v_k

    (x_0 = x_{r−1}, ṽ_1 = ṽ_r), and returns x_r = x_K and x^out_r = x_{k̂−1}, k̂ uniform on [K].
    Each local step is ``SampledWithoutReplacement(m, b, Gaussian(z3))`` for D_{p_r} only (its
    sensitivity w.r.t. other clients' data is 0). Client p runs local steps in the rounds with
    r mod P = p, so after r rounds the most any client has run is ⌈r/P⌉ routines, and all
    clients share the server's releases: the ledger records the local events (K − 1 of them)
    in the rounds that raise that maximum (t mod P = 0), so it always holds the privacy of the
    most exposed client (max over p of each client's composition, exactly). The local steps
    are accounted by RDP (sampling without replacement).

    Only with the :class:`~dpopt.distributed.Local` backend (the local noise would be drawn by
    the client, which the distributed backend does not implement yet).
    """

    local_steps: int = 2
    local_batch: int = 1
    clip_local: float = 1.0
    noise_multiplier3: float = 1.0
    noise_ratios: tuple[float, ...] = (1.0, 1.0, 1.0)

    NOISE_FIELDS: ClassVar[tuple[str, ...]] = ("noise_multiplier1", "noise_multiplier2", "noise_multiplier3")

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate.positive_int("local_steps", self.local_steps)
        _validate.positive_int("local_batch", self.local_batch, maximum=self.clients.size,
                               maximum_name="the clients' shard size")
        _validate.positive("clip_local", self.clip_local, allow_inf=True)
        _validate.non_negative("noise_multiplier3", self.noise_multiplier3)
        if not self.backend.is_local:
            raise _validate.DpoptError("DIFF2-BVR-L-SGD runs only with the Local() backend")

    def local_sampler(self) -> sampling.FixedSize:
        return sampling.FixedSize(self.clients.size, self.local_batch)

    def event(self, t: int) -> dpa.DpEvent:
        if t % self.clients.count != 0 or self.local_steps == 1:
            return self.round_event(t)
        local = self.local_sampler().wrap(dpa.GaussianDpEvent(self.noise_multiplier3))
        return dpa.ComposedDpEvent([self.round_event(t), dpa.SelfComposedDpEvent(local, self.local_steps - 1)])

    def routine(self, state: DIFF2State, estimate: Tensor, t: int, oracle: Oracle,
                gen: torch.Generator) -> tuple[Tensor, Tensor]:
        if self.local_steps == 1:  # no local step: the GD routine (and no draw of k̂)
            return super().routine(state, estimate, t, oracle, gen)
        shard = self.clients.shards[(t + 1) % self.clients.count]
        sampler = self.local_sampler()
        pick = int(torch.randint(self.local_steps, (1,), generator=gen))  # k̂ − 1
        before, theta, local = state.theta, state.theta - self.lr * estimate, estimate
        chosen = before if pick == 0 else None
        for k in range(1, self.local_steps):
            indices = shard[sampler.sample(gen)]
            rows = oracle.per_record(theta, indices) - oracle.per_record(before, indices)
            clip = _scaled_clip(self.clip_local, theta - before)
            clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, clip)], sampler.relation)
            noised, _ = mechanisms.gaussian(clipped, self.noise_multiplier3, gen)
            local = noised / sampler.expected_size + local
            if k == pick:
                chosen = theta
            before, theta = theta, theta - self.lr * local
        return theta, chosen
