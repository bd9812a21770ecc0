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

Privacy (docs/algorithms.md §3): record level, for each client's data set, replace-one. Replacing one
record of D_p moves S_r by at most 2C (a record lives in one shard), and C_{2,r} depends only on
released iterates, so each round is a Gaussian mechanism of multiplier z1 (restart) or z2 with
respect to every D_p: events ⌈R/T⌉ × Gaussian(z1) and R − ⌈R/T⌉ × Gaussian(z2), in round order.
ṽ_{r−1} and the iterates are earlier releases (post-processing). The noise is drawn **once, by
the server** (``backend.is_server``), on the sum the clients sent it; clients see only x_r.

Clients are a view over one oracle: the algorithm holds the public partition (``clients``) and
asks the oracle for the per-record gradients of the records of the clients this process hosts
(``backend.hosted``: all of them with :class:`~dpopt.distributed.Local`); ``backend.rows``
routes their clipped sum to the server (:class:`~dpopt.distributed.TorchDistributed`: a gather
to rank 0) and ``backend.broadcast`` sends x_r back with the event of the server's release
(every process's ledger records the events the server's mechanism returned).

DIFF2-BVR-L-SGD is DIFF2 with a :class:`LocalSteps` routine (``local=``): the server's round is
the same mechanism; the routine adds the client's local releases, each through the Gaussian
mechanism, whose events the step returns beside the server's.

Output rule "uniform" (the paper): x_{r̂−1} with r̂ uniform on [R], drawn before training;
"last": x_R.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import dp_accounting as dpa
import torch
from torch import Tensor

from .. import _validate, clipping, mechanisms, sampling
from ..accounting import PlanMismatch
from ..base import Batch, NoiseSource, Oracle, Rows
from ..distributed import Local
from ._common import OUTPUT_RULES, Output, output_init, output_track, output_value

if TYPE_CHECKING:
    from .params import DIFF2Params


class DIFF2State(NamedTuple):
    theta: Tensor       # x_{r−1}
    prev: Tensor        # x_{r−2} (= x_{r−1} before the first round)
    estimate: Tensor    # ṽ_{r−1}
    theta_out: Tensor   # x^out_{r−1}: x_{r−1} (GD) or the routine's random local iterate (BVR)
    out: Output


@dataclass(frozen=True)
class LocalSteps:
    """The BVR-L-SGD routine (the paper's Algorithm 4): after the server step
    x_1 = x_{r−1} − η ṽ_r, client p_r = (1 + r mod P) (0-based: r mod P) runs K − 1 local steps
    k = 2 … K on batches I_k of ``batch`` = b records drawn without replacement from its shard:

        v_k = (Σ_{z∈I_k} clip(∇ℓ(x_{k−1}, z) − ∇ℓ(x_{k−2}, z), C3·‖x_{k−1} − x_{k−2}‖)
               + N(0, (z3·2C3‖x_{k−1} − x_{k−2}‖)² I)) / b + ṽ_{k−1},    x_k = x_{k−1} − η v_k

    (x_0 = x_{r−1}, ṽ_1 = ṽ_r), and returns x_r = x_K and x^out_r = x_{k̂−1}, k̂ uniform on [K].
    ``steps`` is K, ``clip`` is C3 (z3 is DIFF2's ``noise_multiplier3``).

    Each local step is ``SampledWithoutReplacement(m, b, Gaussian(z3))`` for D_{p_r} only (its
    sensitivity w.r.t. other clients' data is 0). Client p runs local steps in the rounds with
    r mod P = p, so after r rounds the most any client has run is ⌈r/P⌉ routines, and all
    clients share the server's releases: the ledger records the local events (K − 1 of them)
    only in the rounds that raise that maximum (t mod P = 0), so it always holds the privacy of
    the most exposed client (max over p of each client's composition, exactly); in the other
    rounds the local releases are run but not recorded, as they cost that client no more than
    the recorded ones (the step checks that each equals the planned local event). The local
    steps are accounted by RDP (sampling without replacement).
    """

    steps: int = 2
    batch: int = 1
    clip: float = 1.0

    def __post_init__(self) -> None:
        _validate.positive_int("local_steps", self.steps)
        _validate.positive_int("local_batch", self.batch)
        _validate.positive("clip_local", self.clip, allow_inf=True)

    def sampler(self, clients: sampling.Clients) -> sampling.FixedSize:
        return sampling.FixedSize(clients.size, self.batch)

    def counted(self, t: int, clients: sampling.Clients) -> bool:
        """Whether round t + 1's local releases raise the most any client has spent."""
        return t % clients.count == 0 and self.steps > 1


@dataclass(frozen=True)
class DIFF2:
    """DIFF2-GD, or DIFF2-BVR-L-SGD with ``local``. Keyword-only hyper-parameters: step size
    ``lr`` (η), ``clip`` (C1), ``clip_diff`` (C2, scaled each round by ‖x_{r−1} − x_{r−2}‖),
    ``restart`` (T), ``noise_multiplier1``/``noise_multiplier2`` (z1, z2: noise std / sensitivity
    of the round's clipped sum), ``clients`` (the partition), ``output_rule`` ("uniform" or
    "last"), ``local`` (:class:`LocalSteps`, the BVR routine; None: the GD routine) with its
    ``noise_multiplier3`` (z3), ``noise_ratios`` (z1 : z2 [: z3], fixed while
    :func:`~dpopt.accounting.calibrate` scales them jointly; :func:`paper_ratios` gives the
    paper's split) and ``backend`` (where clients and server run; not a hyper-parameter: it does
    not change the trajectory, so it is left out of the repr and of checkpoint fingerprints)."""

    lr: float
    clip: float
    clip_diff: float
    restart: int
    noise_multiplier1: float
    noise_multiplier2: float
    clients: sampling.Clients
    output_rule: str = "uniform"
    local: LocalSteps | None = None
    noise_multiplier3: float | None = None
    noise_ratios: tuple[float, ...] | None = None
    backend: Any = dataclasses.field(default_factory=Local, repr=False, compare=False)

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
        if (self.local is None) != (self.noise_multiplier3 is None):
            raise _validate.DpoptError(f"noise_multiplier3={self.noise_multiplier3!r} goes with local={self.local!r}: "
                                       "set both (DIFF2-BVR-L-SGD) or neither (DIFF2-GD)")
        if self.local is not None and self.noise_multiplier3 is not None:  # (both or neither: checked above)
            _validate.non_negative("noise_multiplier3", self.noise_multiplier3)
            _validate.positive_int("local_batch", self.local.batch, maximum=self.clients.size,
                                   maximum_name="the clients' shard size")
            if not self.backend.is_local:
                raise _validate.DpoptError("DIFF2-BVR-L-SGD runs only with the Local() backend (the local noise would "
                                           "be drawn by the client, which the distributed backend does not implement)")
        ratios = self.noise_ratios if self.noise_ratios is not None else (1.0,) * len(self.NOISE_FIELDS)
        if len(ratios) != len(self.NOISE_FIELDS) or not all(isinstance(r, float | int) and 0 < r < math.inf
                                                             for r in ratios):
            raise _validate.DpoptError(f"noise_ratios={ratios!r} must be {len(self.NOISE_FIELDS)} finite numbers > 0, "
                                       f"one per field {self.NOISE_FIELDS}")
        object.__setattr__(self, "noise_ratios", tuple(float(r) for r in ratios))

    @property
    def NOISE_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 (the name every algorithm uses)
        return ("noise_multiplier1", "noise_multiplier2") + (("noise_multiplier3",) if self.local else ())

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

    def estimate(self, state: DIFF2State, t: int, oracle: Oracle,
                 source: NoiseSource) -> tuple[Tensor, dpa.DpEvent]:
        """ṽ_r on the server (zeros elsewhere: a client never sees it) and the event of the
        server's release (the Gaussian mechanism's; a client gets it with x_r)."""
        indices = self.clients.records(self.backend.hosted(self.clients.count))
        if self.restarts(t):
            rows, clip, carried = self._rows(oracle, state.theta, indices), self.clip, None
            z = self.noise_multiplier1
        else:
            rows = self._rows(oracle, state.theta, indices) - self._rows(oracle, state.prev, indices)
            clip, carried = _scaled_clip(self.clip_diff, state.theta - state.prev), state.estimate
            z = self.noise_multiplier2
        clipped, _ = clipping.clip_sum([clipping.Term(1.0, self.backend.rows(rows), clip)], self.relation())
        if not self.backend.is_server:
            return torch.zeros_like(state.theta), dpa.GaussianDpEvent(z)  # replaced by the server's
        noised, event = mechanisms.gaussian(clipped, z, source)
        estimate = noised / self.clients.expected_size
        return (estimate if carried is None else estimate + carried), event

    @staticmethod
    def _rows(oracle: Oracle, theta: Tensor, indices: Tensor) -> Rows:
        if len(indices) == 0:  # the server hosts no client
            return clipping.Dense(theta.new_zeros(0, len(theta)))
        return oracle.per_record(theta, indices)

    def local_steps(self, state: DIFF2State, estimate: Tensor, t: int, oracle: Oracle,
                    source: NoiseSource) -> tuple[Tensor, Tensor, list[dpa.DpEvent]]:
        """The routine after the server's estimate: (x_r, x^out_r, the local releases' events
        that round t + 1 records). GD: x_r = x_{r−1} − η ṽ_r, no release."""
        theta = state.theta - self.lr * estimate
        if self.local is None or self.local.steps == 1:  # no local step (and no draw of k̂)
            return theta, theta, []
        local, z3 = self.local, self.noise_multiplier3
        assert z3 is not None  # set with local (checked in __post_init__)
        shard = self.clients.shards[(t + 1) % self.clients.count]
        sampler = local.sampler(self.clients)
        pick = int(torch.randint(local.steps, (1,), generator=source.generator))  # k̂ − 1
        before, direction, chosen, events = state.theta, estimate, state.theta, []
        for k in range(1, local.steps):
            indices = shard[sampler.sample(source.generator)]
            rows = oracle.per_record(theta, indices) - oracle.per_record(before, indices)
            clipped, _ = clipping.clip_sum([clipping.Term(1.0, rows, _scaled_clip(local.clip, theta - before))],
                                           sampler.relation)
            noised, event = mechanisms.gaussian(clipped, z3, source)
            events.append(sampler.wrap(event))
            direction = noised / sampler.expected_size + direction
            if k == pick:
                chosen = theta
            before, theta = theta, theta - self.lr * direction
        if local.counted(t, self.clients):
            return theta, chosen, events
        planned = self._local_event()
        if any(event != planned for event in events):  # uncounted only because it equals the counted ones
            raise PlanMismatch(f"a local release of round {t + 1} returned {events}, not the planned {planned}: "
                               "the most exposed client's ledger no longer bounds this client's")
        return theta, chosen, []

    def _local_event(self) -> dpa.DpEvent:
        """One local step's planned event: ``SampledWithoutReplacement(m, b, Gaussian(z3))``."""
        assert self.local is not None  # called only with local steps
        return self.local.sampler(self.clients).wrap(dpa.GaussianDpEvent(self.noise_multiplier3))

    def step(self, state: DIFF2State, batch: Batch, oracle: Oracle,
             source: NoiseSource) -> tuple[DIFF2State, dpa.DpEvent]:
        estimate, event = self.estimate(state, batch.t, oracle, source)
        out = output_track(state.out, batch.t, state.theta_out)
        theta, theta_out, local_events = self.local_steps(state, estimate, batch.t, oracle, source)
        theta, event = self.backend.broadcast(theta, event)
        round_event = event if not local_events else dpa.ComposedDpEvent([event, *local_events])
        return DIFF2State(theta, state.theta, estimate, theta_out, out), round_event

    def output(self, state: DIFF2State) -> Tensor:
        return output_value(state.out, state.theta)

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        """Round r = t + 1: ``Gaussian(z1)`` on restart rounds, else ``Gaussian(z2)``; with local
        steps, K − 1 × ``SampledWithoutReplacement(m, b, Gaussian(z3))`` in the rounds that raise
        the most exposed client's count (:meth:`LocalSteps.counted`)."""
        self.sampler(0, n)
        rounds: list[dpa.DpEvent] = []
        for t in range(steps):
            rounds.append(dpa.GaussianDpEvent(self.noise_multiplier1 if self.restarts(t) else self.noise_multiplier2))
            if self.local is not None and self.local.counted(t, self.clients):
                rounds.append(dpa.SelfComposedDpEvent(self._local_event(), self.local.steps - 1))
        return dpa.ComposedDpEvent(rounds)


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
    """C·‖x_{k−1} − x_{k−2}‖ (∞ stays ∞ even for a zero move: the non-private method).

    A zero move (x_{k−1} = x_{k−2}) or one that is not finite (the iterates diverged) gives a
    clip of 0: every clipped vector is exactly 0 (:func:`~dpopt.clipping.clip_weights`), the
    sensitivity and the noise are 0, and the release is exactly 0, which does not depend on the
    data (the round is still accounted as planned)."""
    if math.isinf(clip):
        return math.inf
    norm = float(move.norm())
    return clip * norm if math.isfinite(norm) else 0.0


def _diff2(params: DIFF2Params, local: bool = False) -> DIFF2:
    split = sampling.Clients(params.n, params.clients)
    steps = LocalSteps(params.local_steps, min(params.batch_size, split.size), params.clip_diff) if local else None
    return DIFF2(lr=params.lr, clip=params.clip, clip_diff=params.clip_diff, restart=params.restart,
                 noise_multiplier1=1.0, noise_multiplier2=1.0, clients=split, output_rule=params.output_rule,
                 noise_ratios=params.noise_ratios,
                 backend=Local() if params.backend is None else params.backend,
                 local=steps, noise_multiplier3=1.0 if local else None)


def gd_from_params(params: DIFF2Params) -> DIFF2:
    """``diff2-gd`` by name: C1 = ``clip``, C2 = ``clip_diff``, T = ``restart``, P = ``clients`` (an
    i.i.d. equal split, seed 0), ``backend``, ``output_rule``, ``noise_ratios``."""
    return _diff2(params)


def bvr_from_params(params: DIFF2Params) -> DIFF2:
    """``diff2-bvr`` by name: as ``diff2-gd``, with K = ``local_steps`` local steps on batches of
    ``batch_size`` (at most a shard) clipped at C3 = ``clip_diff``."""
    return _diff2(params, local=True)
