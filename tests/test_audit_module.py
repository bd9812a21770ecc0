"""The audit of a user's own module, loss and records (``dpopt.audit.audit_module``), and the
mutants only such an audit can see: each deliberate privacy bug is flagged (its lower bound is
above the claimed ε = 2 at 95 % confidence) and its honest twin is not.

* **A loss that couples records under the ghost engine.** The loss (out − mean(out) − y)²
  (batch-centred targets) reads every record's output. The ghost engine before its fix called
  ``loss_fn`` on the whole batch (:func:`whole_batch_per_record`, the code it ran), so each
  record's "per-record" gradient held the batch mean of the targets: the canary's huge target moves
  every other record's clipped gradient, about 32 times the accounted sensitivity on 32 records.
  The honest twin is the same loss evaluated per record (the vmap engine; the ghost engine once
  fixed, or a refusal of that loss).
* **Padding that leaks across records.** Token records of their own lengths, padded to the
  longest record of the data set (a tokenizer's ``padding="longest"`` over all of it), read by a
  bidirectional ``dpopt.nn.LSTM`` given no ``lengths=``: it runs over the padding, whose length
  the canary (a longer record) sets for every record, so every record's clipped gradient moves
  with it (7 times the accounted 2C on 32 records). Honest twin: the same model given each
  record's length, whose outputs and final states ignore the padding.
* **A replayed-noise fork.** Two resumes of one checkpoint release at different θ with the same
  noise draws (the checkpoint's generator): the difference of the two releases is un-noised.
  Each run is accounted as one release. Honest twin: the second run draws fresh noise.
* **A preparation from un-noised statistics.** Targets divided by max |y| of the data before a
  private run: the canary's target rescales every other record. Honest twin: targets clipped to a
  public bound and divided by it.
* **A tuning with public K.** ``dpopt.tune`` seeded with a public seed (as ``bench`` seeded it with
  0, 1, …): K, the candidates and every trial's noise can be recomputed, and every run of the
  audit is the same run. Honest twin: a secret seed per run. A K that is public while the noise
  stays secret is beyond what an audit can refute at test cost: with a claim of ε = 2 at δ = 0.05
  (geometric K of mean 8, Gaussian trials), the best of k trials for a known k has a true
  ε(0.05) of 0.79 (k = 8), 1.36 (32), 2.06 (128), 2.88 (512), 3.78 (2,048), against 0.43 with K
  secret: refuting it takes thousands of trials in every audited run.

The audits are Gaussian-DP bounds at δ = 1e−5 on the releases (the mechanisms there are
Gaussian), except the tuning's, whose repeat-and-select is not Gaussian-shaped: Clopper–Pearson
on the released θ. Each states its power (``smallest_refutable_epsilon``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import dp_accounting as dpa
import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import TensorDataset

from dpopt import audit
from dpopt._validate import DpoptError
from dpopt.accounting import calibrate
from dpopt.algorithms.registry import build
from dpopt.audit import bounds, worlds
from dpopt.oracles import TorchModel, ghost
from dpopt.tuning.private import tune, tuning_plan
from dpopt.tuning.space import Space
from dpopt.tuning.trials import TruncatedNegativeBinomial
from tests.test_recurrent_lengths import LONG, Reader, Sequences, cross_entropy

TARGET = 2.0
N, D = 32, 4


def records(scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """N records of D features N(0, scale²) with targets Σ_j x_j + noise: none of them at zero."""
    gen = torch.Generator().manual_seed(0)
    X = scale * torch.randn(N, D, generator=gen, dtype=torch.float64)
    return X, X.sum(1) + 0.05 * torch.randn(N, generator=gen, dtype=torch.float64)


def linear() -> nn.Module:
    """The user's module: a linear layer with bias, at a fixed initialisation."""
    module = nn.Linear(D, 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=gen, dtype=torch.float64))
    return module


def squared(out: Tensor, y: Tensor) -> Tensor:
    return (out.squeeze(-1) - y) ** 2


def centred(out: Tensor, y: Tensor) -> Tensor:
    """Batch-centred targets: each record's loss reads the mean output of the batch."""
    out = out.squeeze(-1)
    return (out - out.mean() - y) ** 2


def whole_batch_per_record(self: TorchModel, point: Tensor, indices: Tensor, theta: Tensor) -> ghost.GhostRows:
    """``TorchModel._per_record`` of the ghost engine before the fix: ``loss_fn`` on the whole
    chunk (``self._losses(out, y).sum()``), whose gradient at record i's output is ∂(Σ_j ℓ_j)/∂out_i."""
    assert self.engine == "ghost"
    chunks = self._chunks(indices)
    layers = []
    with torch.enable_grad():
        views = self.layout.views(point.detach().requires_grad_(True))
        for x, y in chunks:
            out, taps = ghost.forward(self.stages, views, x)
            layers.append(ghost.capture(taps, self._losses(out, y).sum()))
    return ghost.GhostRows(tuple(layers), tuple(len(y) for _, y in chunks), self.layout, point.new_empty(0),
                           theta.dtype, theta.device)


# ------------------------------------------------------------------------------------ the worlds


def test_a_user_world_adds_or_replaces_the_canary_as_the_relation_says():
    """Finding: the audit's worlds had the same n on both sides and background records at x = 0.
    Now D is the user's records (none at zero) and D′ adds the canary (add/remove-one: n + 1
    records) or puts it in place of the first record a run uses (replace-one: n records)."""
    X, y = records()
    canary = (torch.full((D,), 3.0, dtype=torch.float64), torch.tensor(-7.0, dtype=torch.float64))
    added = worlds.neighbours(build("dp-sgd", n=N + 1, batch_size=8), X, y, 3, canary)
    assert added.n == N + 1 and added.records(present=False)[0] is X
    inside_X, inside_y = added.records(present=True)
    assert inside_X.shape == (N + 1, D) and torch.equal(inside_X[1:], X) and torch.equal(inside_y[1:], y)
    assert torch.equal(inside_X[0], canary[0]) and inside_y[0] == -7.0
    replaced = worlds.neighbours(build("dp-gd", n=N, batch_size=N), X, y, 3, canary)
    inside_X, inside_y = replaced.records(present=True)
    assert replaced.n == N and inside_X.shape == (N, D)
    assert torch.equal(inside_X[1:], X[1:]) and torch.equal(inside_X[0], canary[0]) and inside_y[0] == -7.0
    assert replaced.seen(torch.arange(6.0)).shape == (1, 6)  # the adversary watches every coordinate


def test_the_default_canary_is_unlike_the_background():
    """Its input lies along the direction the records use least, at the largest input norm; its
    target is far out (floating targets) or the least frequent label (integer targets)."""
    X, y = records()
    X[:, 3] = 0.01 * X[:, 3]  # the records barely use feature 3
    x, target = worlds.default_canary(X, y)
    assert abs(float(x[3])) == pytest.approx(float(X.norm(dim=1).max()), rel=1e-3)
    assert target == -worlds.CANARY_TARGET
    wide = torch.randn(3, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x, _ = worlds.default_canary(wide, torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(wide @ x, torch.zeros(3, dtype=torch.float64), atol=1e-9)  # a direction no record uses
    _, label = worlds.default_canary(X, torch.tensor([0, 2, 2, 1, 0, 2] * 5 + [0, 2]))
    assert label == 1 and label.dtype == torch.int64


def test_audit_module_bad_input_is_named():
    X, y = records()
    with pytest.raises(DpoptError, match="algorithm='dp-gd' by name needs an epsilon"):
        audit.audit_module(linear(), squared, (X, y), algorithm="dp-gd", epsilon=None, steps=1)
    with pytest.raises(DpoptError, match=r"options \['gamma'\] build an algorithm by name"):
        audit.audit_module(linear(), squared, (X, y), algorithm=build("dp-gd", n=N, batch_size=N), epsilon=1.0,
                           steps=1, gamma=0.1)
    with pytest.raises(DpoptError, match="read lazily; the audit needs the records in memory"):
        audit.audit_module(linear(), squared, [(X[i], y[i]) for i in range(N)], epsilon=1.0, steps=1)
    with pytest.raises(DpoptError, match="observed numbers per world exceed 100,000,000"):
        audit.audit_module(nn.Linear(10_000, 1), squared, (torch.randn(4, 10_000), torch.randn(4)), epsilon=1.0,
                           steps=10, runs=1_000, batch_size=2)
    with pytest.raises(DpoptError, match=r"canary shapes \(3,\), \(\) must be those of one record: \(4,\), \(\)"):
        audit.audit_module(linear(), squared, TensorDataset(X, y), epsilon=1.0, steps=1, batch_size=8,
                           canary=(torch.zeros(3), torch.zeros(())))


# ------------------------------------------------------------------- the mutants and their twins


def coupling_audit(engine: str) -> audit.AuditResult:
    """DP-GD at ε = 2 on the batch-centred loss, one step, 400 runs per side."""
    return audit.audit_module(linear(), centred, records(), algorithm="dp-gd", epsilon=TARGET, steps=1, runs=400,
                              engine=engine, lr=1.0)


class Recording:
    """A noise source that keeps what it draws (the checkpoint's generator, run forward)."""

    def __init__(self, source: Any) -> None:
        self.source, self.draws = source, []

    def gaussian(self, like: Tensor, std: float) -> Tensor:
        self.draws.append(self.source.gaussian(like, std))
        return self.draws[-1]


class Replaying:
    """A noise source that gives the recorded draws again (the checkpoint's generator, restored)."""

    def __init__(self, draws: tuple[Tensor, ...]) -> None:
        self.draws = iter(draws)

    def gaussian(self, like: Tensor, std: float) -> Tensor:
        return next(self.draws)


class ForkState(NamedTuple):
    theta: Tensor
    checkpoint: Any              # the state saved before the fork
    draws: tuple[Tensor, ...]    # the noise run a drew after it


@dataclass(frozen=True)
class Forked:
    """Two runs of ``runs`` from one checkpoint: step 0 is run a's release at θ0; step 1 resumes the
    checkpoint at θ0 + ``offset`` (the user's optimizer moved the parameters) and releases with
    the same noise draws (``replay``) or fresh ones. Each run is accounted as its one release."""

    runs: Any
    offset: float
    replay: bool

    def relation(self) -> dpa.NeighboringRelation:
        return self.runs.relation()

    def sampler(self, t: int, n: int) -> Any:
        return self.runs.sampler(t, n)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> ForkState:
        return ForkState(theta0.clone(), self.runs.init(theta0, steps, gen), ())

    def step(self, state: ForkState, batch: Any, oracle: Any, source: Any) -> tuple[ForkState, dpa.DpEvent]:
        if batch.t == 0:
            recording = Recording(source)
            run_a, event = self.runs.step(state.checkpoint, batch, oracle, recording)
            return ForkState(run_a.theta, state.checkpoint, tuple(recording.draws)), event
        resumed = self.runs.moved(state.checkpoint, state.checkpoint.theta + self.offset)
        run_b, event = self.runs.step(resumed, batch, oracle, Replaying(state.draws) if self.replay else source)
        return state._replace(theta=run_b.theta), event

    def output(self, state: ForkState) -> Tensor:
        return state.theta

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return self.runs.planned_event(n, steps)


def fork_audit(replay: bool) -> audit.AuditResult:
    """The two releases of a DP-GD fork at ε = 2 in total, with C = 10 so that a record's clipped
    gradient still depends on θ (the default canary's does not: it is clipped everywhere)."""
    once = calibrate(build("dp-gd", n=N, batch_size=N, lr=1.0, clip=10.0), epsilon=TARGET, delta=1e-5, n=N, steps=2)
    return audit.audit_module(linear(), squared, records(0.3), algorithm=Forked(once, 0.5, replay), epsilon=None,
                              steps=2, runs=400)


def by_largest_target(X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return X, y / y.abs().max()


def by_public_bound(X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return X, y.clamp(-4.0, 4.0) / 4.0


def preparation_audit(prepare: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> audit.AuditResult:
    return audit.audit_module(linear(), squared, records(0.3), algorithm="dp-gd", epsilon=TARGET, steps=1, runs=400,
                              lr=1.0, prepare=prepare)


class TuningState(NamedTuple):
    theta: Tensor
    seed: int  # the tuning's seed, drawn from the run's secret generator


@dataclass(frozen=True)
class Tuning:
    """One step: :func:`dpopt.tune` of ``trial`` (one step, lr from a grid, K ~ ``trials``) at ε
    in total, scored on a public function of θ, seeded with ``public_seed`` in every run, or with
    a secret seed of each run (None)."""

    trial: Any
    trials: Any
    public_seed: int | None

    def relation(self) -> dpa.NeighboringRelation:
        return self.trial.relation()

    def sampler(self, t: int, n: int) -> Any:
        return self.trial.sampler(t, n)

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> TuningState:
        return TuningState(theta0.clone(), int(torch.randint(2 ** 62, (1,), generator=gen)))

    def step(self, state: TuningState, batch: Any, oracle: Any, source: Any) -> tuple[TuningState, dpa.DpEvent]:
        tuned = tune(lambda candidate: dataclasses.replace(self.trial, lr=candidate["lr"]), oracle,
                     space=Space.grid(lr=[0.5, 1.0]), trials=self.trials, epsilon=TARGET, delta=1e-5, steps=1,
                     score=lambda theta: float(theta[0]), theta0=state.theta,
                     seed=state.seed if self.public_seed is None else self.public_seed)
        return state._replace(theta=tuned.theta), self.planned_event(oracle.n, 1)

    def output(self, state: TuningState) -> Tensor:
        return state.theta

    def planned_event(self, n: int, steps: int) -> dpa.DpEvent:
        return tuning_plan(self.trial, trials=self.trials, epsilon=TARGET, delta=1e-5, n=n, steps=1).event


def tuning_audit(public_seed: int | None) -> audit.AuditResult:
    """200 tunings per side (K of mean 2), the adversary sees the released θ."""
    tuning = Tuning(build("dp-gd", n=N, batch_size=N, lr=1.0, clip=1.0), TruncatedNegativeBinomial(2, 1), public_seed)
    return audit.audit_module(linear(), squared, records(0.3), algorithm=tuning, epsilon=None, steps=1, runs=200,
                              threat_model=audit.Final(), bound=bounds.ClopperPearson())


def padded_to_the_longest(X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Every record padded (with token 0) to the longest record of the data set: the columns of
    padding that every record has are cut."""
    return X[:, : int((X != 0).sum(1).max())], y


def padding_audit(lengths: bool) -> audit.AuditResult:
    """DP-GD at ε = 2 with C = 0.01, one step, 400 runs per side, of the length-reading model of
    ``tests/test_recurrent_lengths.py`` (a bidirectional LSTM; given lengths or not) on its 32
    records of 2 to 5 tokens, labelled 0, padded to the longest; the canary is a record of 12
    tokens, labelled 1."""
    sequences = Sequences()
    X = pad_sequence(sequences.tokens, batch_first=True)
    X = torch.cat([X, X.new_zeros(len(X), len(LONG) - X.shape[1])], 1)  # (room for the canary)
    return audit.audit_module(Reader("LSTM", given=lengths, bidirectional=True), cross_entropy,
                              (X, sequences.labels), algorithm="dp-gd", epsilon=TARGET, steps=1, runs=400, lr=1.0,
                              clip=0.01, prepare=padded_to_the_longest, canary=(LONG, torch.tensor(1)))


def whole_batch_coupling(monkeypatch: pytest.MonkeyPatch) -> audit.AuditResult:
    monkeypatch.setattr(TorchModel, "_per_record", whole_batch_per_record)
    return coupling_audit("ghost")


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], audit.AuditResult]] = {
    "coupling loss, whole-batch ghost engine": whole_batch_coupling,
    "padding that leaks across records": lambda monkeypatch: padding_audit(lengths=False),
    "replayed-noise fork": lambda monkeypatch: fork_audit(replay=True),
    "targets divided by max |y|": lambda monkeypatch: preparation_audit(by_largest_target),
    "tuning with a public seed": lambda monkeypatch: tuning_audit(public_seed=0),
}

TWINS = [
    pytest.param(lambda: coupling_audit("vmap"), id="coupling loss, vmap engine"),
    pytest.param(lambda: coupling_audit("ghost"), id="coupling loss, ghost engine"),
    pytest.param(lambda: padding_audit(lengths=True), id="padding ignored: lengths given"),
    pytest.param(lambda: fork_audit(replay=False), id="fork with fresh noise"),
    pytest.param(lambda: preparation_audit(by_public_bound), id="targets clipped to a public bound"),
    pytest.param(lambda: tuning_audit(public_seed=None), id="tuning with a secret seed"),
]


@pytest.mark.parametrize("key", list(MUTANTS))
def test_every_user_setting_mutant_is_flagged(key, monkeypatch):
    result = MUTANTS[key](monkeypatch)
    assert result.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert result.flagged and result.verdict.startswith("REFUTED: claim ε = "), result


@pytest.mark.parametrize("twin", TWINS)
def test_no_honest_twin_is_flagged(twin):
    try:
        result = twin()
    except DpoptError as refused:  # a loss that reads other records may be refused instead
        assert "loss" in str(refused)
        return
    assert result.claimed_epsilon == pytest.approx(TARGET, rel=0.01)
    assert not result.flagged and "not refuted" in result.verdict, result


def test_the_user_setting_audits_state_their_power():
    """400 runs per side, 200 held out: a Gaussian-shaped mechanism of true ε ≥ 3.8 is refuted at
    its median outcome (the coupling bug's bound is ~20)."""
    X, y = records()
    result = audit.audit_module(linear(), squared, (X, y), algorithm="dp-gd", epsilon=TARGET, steps=1, runs=400)
    assert 2.0 < result.smallest_refutable_epsilon < 3.8
    assert result.runs == 400 and result.slots_per_run == 1 and result.engine == "ghost"
