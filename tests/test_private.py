"""``dpopt.Private``: the private gradient in the user's own loop, with the user's optimizer."""

from __future__ import annotations

import dataclasses
import math
import os
import random
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import dpopt
from dpopt import accounting, checkpoint, journal
from dpopt._validate import DpoptError
from dpopt.accounting import canonical
from dpopt.algorithms.registry import build
from dpopt.plan import steps_for_epochs
from dpopt.oracles import TorchModel

N, DELTA = 200, 1e-5


def data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(n, 6, generator=gen)
    y = (X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 1.0, -1.0]) > 0).long()
    return X, y


def model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(dtype)


def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


class Counting(Dataset):
    """A map-style dataset that records which indices were read."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y, self.read = X, y, []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.read.append(i)
        return self.X[i], self.y[i]


@pytest.mark.parametrize(("algorithm", "options"), [
    ("dp-sgd", {}), ("dp-srm", {"clip_diff": 0.5, "gamma": 0.3}), ("dp-gd", {}), ("rrpsgd", {}), ("aclip", {}),
    ("dp-bandmf", {"bands": 4}), ("dp-sgd", {"clip_quantile": 0.5, "count_noise": 5.0})],
    ids=["dp-sgd", "dp-srm", "dp-gd", "rrpsgd", "aclip", "bands", "clip_quantile"])
def test_sgd_on_the_private_gradient_is_the_run(algorithm, options):
    """torch.optim.SGD(lr=η) on g̃_t takes exactly the steps dpopt.run takes with the same seed
    (float64 module): the release comes from the same code path, the optimizer is θ − η g̃ (banded
    noise's key and ring, adaptive clipping's C_t travel in the state); the ledger is the plan's."""
    X, y = data()
    net = model(torch.float64)
    private = dpopt.Private(net, loss, (X, y), algorithm=algorithm, epsilon=2.0, delta=DELTA, steps=12,
                            batch_size=40, lr=0.3, seed=5, **options)
    sgd = torch.optim.SGD(net.parameters(), lr=0.3)
    for _ in private:
        private.backward()
        sgd.step()
    oracle = TorchModel(model(torch.float64), loss, X, y)
    history = dpopt.run(private.algorithm, oracle, steps=12, seed=5, delta=DELTA, theta0=oracle.flat_params())
    assert torch.allclose(private.output(), history.theta, rtol=0, atol=1e-12)
    assert canonical(private.ledger.event()) == canonical(private.plan.run_event)
    assert private.epsilon() == pytest.approx(history.final["epsilon"], rel=1e-12) and private.epsilon() <= 2.0


def test_dpopt_optim_adambc_on_the_private_gradient_is_the_adambc_run():
    """``dpopt.optim.AdamBC`` reads Φ_t from the ``Private`` object and takes exactly the steps of the
    ``AdamBC`` wrapper under ``dpopt.run`` (float64 module): one update, two ways to run it."""
    X, y = data()
    net = model(torch.float64)
    private = dpopt.Private(net, loss, (X, y), algorithm="dp-sgd", epsilon=2.0, delta=DELTA, steps=12, batch_size=40,
                            seed=5)
    adam = dpopt.optim.AdamBC(net.parameters(), private, lr=0.05)
    with pytest.raises(DpoptError, match="no private gradient yet"):
        private.noise_variance()
    for _ in private:
        private.backward()
        adam.step()
    oracle = TorchModel(model(torch.float64), loss, X, y)
    wrapped = dpopt.algorithms.AdamBC(private.algorithm, lr=0.05)
    history = dpopt.run(wrapped, oracle, steps=12, seed=5, delta=DELTA, theta0=oracle.flat_params())
    assert torch.allclose(private.output(), history.theta, rtol=0, atol=1e-12)
    assert private.noise_variance() == (private.algorithm.noise_multiplier * 1.0 / 40) ** 2


def mean_loss(net: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(loss(net(X), y).mean())


@pytest.mark.parametrize(("algorithm", "options", "optimizer"), [
    ("dp-bandmf", {}, "sgd"), ("dp-sgd", {"clip_quantile": 0.5, "count_noise": 5.0}, "sgd"), ("dp-sgd", {}, "adambc")])
def test_private_with_the_new_options_trains_a_small_module(algorithm, options, optimizer):
    """60 steps at ε = 8 (float32 module): the training loss falls by a third from the initial 0.81
    (NOT PRIVATE, measured here for the test only). DP-AdamBC at lr = 0.01 with the floor γ = 1e-6
    (at the paper's 1e-8 the corrected second moment of the noise-only coordinates hits the floor
    and their steps blow up: the floor is a hyper-parameter)."""
    X, y = data()
    net = model()
    before = mean_loss(net, X, y)
    private = dpopt.Private(net, loss, (X, y), algorithm=algorithm, epsilon=8.0, delta=DELTA, steps=60, batch_size=40,
                            seed=1, **options)
    step = (dpopt.optim.AdamBC(net.parameters(), private, lr=0.01, gamma=1e-6) if optimizer == "adambc"
            else torch.optim.SGD(net.parameters(), lr=0.5))
    for _ in private:
        private.backward()
        step.step()
    assert mean_loss(net, X, y) < 2 / 3 * before and private.epsilon() <= 8.0


def test_noise_variance_is_refused_for_an_algorithm_that_does_not_state_it():
    X, y = data()
    private = dpopt.Private(model(), loss, (X, y), algorithm="dp-srm", epsilon=2.0, delta=DELTA, steps=3,
                            batch_size=40, clip_diff=0.5, gamma=0.3)
    with pytest.raises(DpoptError, match="does not state the noise variance of its private gradient"):
        private.noise_variance()


class AcceptingClosure(dpopt.optim.AdamBC):
    """The mutant: ``dpopt.optim.AdamBC`` before its fix, which ran torch's closure and then stepped
    on whatever the closure left in ``.grad``."""

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        if closure is not None:
            with torch.enable_grad():
                closure()
        return super().step()


def after_a_closure_step(optimizer: type[dpopt.optim.AdamBC]) -> tuple[str, bool, bool]:
    """After one ``private.backward()``, ``optimizer.step(closure)`` with torch's usual closure (zero
    the gradients, the loss over the whole training set, ``loss.backward()``): the error it raised
    ("" if none), whether θ stayed where it was, and whether θ is exactly where one AdamBC step on
    the exact, un-noised gradient takes it (measured on a copy of the module)."""
    X, y = data()
    X = X.double()
    net = model(torch.float64)
    private = dpopt.Private(net, loss, (X, y), algorithm="dp-sgd", epsilon=2.0, delta=DELTA, steps=3, batch_size=40,
                            seed=5)
    adam = optimizer(net.parameters(), private, lr=0.05)

    def closure() -> float:
        adam.zero_grad()
        exact = loss(net(X), y).mean()
        exact.backward()
        return float(exact.detach())

    private.backward()
    exact_net = model(torch.float64)
    exact_net.load_state_dict(net.state_dict())
    loss(exact_net(X), y).mean().backward()
    dpopt.optim.AdamBC(exact_net.parameters(), private, lr=0.05).step()
    before = [p.detach().clone() for p in net.parameters()]
    try:
        adam.step(closure)
        error = ""
    except DpoptError as refused:
        error = str(refused)
    after = list(net.parameters())
    return (error, all(torch.equal(a, b) for a, b in zip(after, before)),
            all(torch.equal(a, b) for a, b in zip(after, exact_net.parameters())))


def test_adambc_refuses_a_closure_catches_a_step_on_the_exact_gradient():
    """torch's closure recomputes the loss and writes its exact gradient into ``.grad``: AdamBC
    refuses it (one line naming the argument) and θ does not move; the mutant that runs the closure
    moves θ by exactly an AdamBC step on the un-noised gradient, with ε reporting the calibrated
    value. Without a closure the step is the private one (it moves θ)."""
    error, unmoved, exact = after_a_closure_step(dpopt.optim.AdamBC)
    assert error == ("closure=closure: dpopt.optim.AdamBC.step takes no closure (it would write the exact, un-noised "
                     "gradient into .grad, which no epsilon covers): call private.backward(), then optimizer.step()")
    assert unmoved and not exact
    assert after_a_closure_step(AcceptingClosure) == ("", False, True)
    X, y = data()
    X = X.double()
    net = model(torch.float64)
    private = dpopt.Private(net, loss, (X, y), algorithm="dp-sgd", epsilon=2.0, delta=DELTA, steps=1, batch_size=40,
                            seed=5)
    start = [p.detach().clone() for p in net.parameters()]
    private.backward()
    dpopt.optim.AdamBC(net.parameters(), private, lr=0.05).step()
    assert not any(torch.equal(a, b) for a, b in zip(net.parameters(), start))


def test_adam_trains_the_mnist_cnn_to_the_planned_epsilon(shared_data_dir):
    """Contract: the ledger after an Adam-driven run equals the planned event, the guarantee is the
    target ε, and the CNN learns (a 1,000-record MNIST subset, 2 epochs)."""
    from dpopt.data import load
    from dpopt.models import make_model

    mnist = load("mnist", shared_data_dir)
    X, y = (torch.as_tensor(mnist.X_train[:1000], dtype=torch.float32),
            torch.as_tensor(mnist.y_train[:1000]).long())
    X_test, y_test = (torch.as_tensor(mnist.X_test[:1000], dtype=torch.float32),
                      torch.as_tensor(mnist.y_test[:1000]).long())
    net = make_model("mnist-cnn", seed=0)
    private = dpopt.Private(net, loss, TensorDataset(X, y), epsilon=8.0, delta=DELTA, epochs=2, batch_size=100,
                            clip=1.0, seed=0)
    adam = torch.optim.Adam(net.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.StepLR(adam, step_size=15, gamma=0.5)
    for _ in private:
        private.backward()
        adam.step()
        schedule.step()
    planned = private.algorithm.planned_event(1000, private.steps)
    assert private.steps == 20 and private.t == 20
    assert private.ledger.event() == canonical(planned)
    assert 0.99 * 8.0 <= private.epsilon() <= 8.0
    with torch.no_grad():
        error = float((net(X_test).argmax(1) != y_test).float().mean())
    assert error < 0.5  # 10 classes: chance is 0.9


@dataclasses.dataclass(frozen=True)
class HalfNoiseEvents(dpopt.DPSGD):
    """Mutant: a step that records the event of half its noise multiplier."""

    def step(self, state, batch, oracle, source):
        state, event = super().step(state, batch, oracle, source)
        return state, batch.sampler.wrap(dpopt.mechanisms.CONTINUOUS.event(self.noise_multiplier / 2))


def test_a_step_that_records_another_event_is_caught():
    X, y = data()
    algo = build("dp-sgd", n=N, batch_size=40)
    mutant = HalfNoiseEvents(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)})
    private = dpopt.Private(model(), loss, (X, y), algorithm=mutant, epsilon=2.0, delta=DELTA, steps=5, seed=0)
    for _ in private:
        private.backward()
    assert private.ledger.event() != canonical(private.algorithm.planned_event(N, 5))
    with pytest.raises(accounting.PlanMismatch):
        private.epsilon()


def test_only_the_batch_is_read_from_a_lazy_dataset():
    X, y = data()
    counting = Counting(X, y)
    private = dpopt.Private(model(), loss, counting, epsilon=2.0, delta=DELTA, steps=3, batch_size=20, seed=0)
    counting.read.clear()
    private.backward()
    assert 0 < len(counting.read) <= 60  # Poisson, expected 20 of 200
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in private.module.parameters())


def test_no_step_beyond_the_plan_and_no_mixing():
    X, y = data()
    private = dpopt.Private(model(), loss, (X, y), epsilon=2.0, delta=DELTA, steps=2, batch_size=20, seed=0)
    private.backward()
    with pytest.raises(DpoptError, match="backward\\(\\) and step\\(\\) cannot be mixed"):
        private.step()
    private.backward()
    with pytest.raises(DpoptError, match="the 2 planned steps are done"):
        private.backward()
    idle = dpopt.Private(model(), loss, (X, y), epsilon=2.0, delta=DELTA, steps=2, batch_size=20, seed=0)
    with pytest.raises(DpoptError, match="step=0 was not taken"):
        for _ in idle:
            pass


def test_o2nc_has_no_gradient_for_an_optimizer_but_steps_on_its_own():
    X, y = data()
    private = dpopt.Private(model(), loss, (X, y), algorithm="o2nc-first", epsilon=2.0, delta=DELTA, steps=12,
                            batch_size=10, seed=0, window=4, directions=2)
    with pytest.raises(DpoptError, match="algorithm=O2NC has no private gradient for an optimizer of your own"):
        private.backward()
    for _ in private:
        private.step()
    assert 0.99 * 2.0 <= private.epsilon() <= 2.0


def test_a_saved_run_resumes_exactly(tmp_path):
    X, y = data()

    def started() -> tuple[dpopt.Private, torch.optim.Optimizer]:
        net = model()
        return (dpopt.Private(net, loss, (X, y), epsilon=2.0, delta=DELTA, steps=6, batch_size=20, seed=1),
                torch.optim.SGD(net.parameters(), lr=0.2))

    whole, sgd = started()
    for _ in whole:
        whole.backward()
        sgd.step()
    first, sgd = started()
    for t in first:
        if t == 3:
            break
        first.backward()
        sgd.step()
    first.save(tmp_path / "run.ckpt")
    second, sgd = started()
    second.resume(tmp_path / "run.ckpt")
    assert second.t == 3
    for _ in second:
        second.backward()
        sgd.step()
    assert torch.equal(second.output(), whole.output())
    assert second.ledger.event() == whole.ledger.event()
    other = dpopt.Private(model(), loss, (X, y), epsilon=3.0, delta=DELTA, steps=6, batch_size=20, seed=1)
    with pytest.raises(DpoptError, match="belongs to another run: its algorithm.noise_multiplier is"):
        other.resume(tmp_path / "run.ckpt")


# ----------------------------------------------- a checkpoint's noise is never released twice (issue 28, finding 2)

CLIP = 1.0


def started(seed: int | None = None) -> tuple[dpopt.Private, torch.optim.Optimizer]:
    """A DP-GD run of 6 steps (full batches: a release's only randomness is its noise) and its optimizer."""
    net = model(torch.float64)
    private = dpopt.Private(net, loss, data(), algorithm="dp-gd", epsilon=1.0, delta=DELTA, steps=6, clip=CLIP,
                            seed=seed)
    return private, torch.optim.SGD(net.parameters(), lr=0.2)


def advance(private: dpopt.Private, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        private.backward()
        optimizer.step()


def release(private: dpopt.Private) -> torch.Tensor:
    """The next release g̃_t, flat, taken at the module's parameters."""
    private.backward()
    return torch.cat([p.grad.reshape(-1) for p in private.module.parameters()])


def saved_and_continued(path: Path) -> torch.Tensor:
    """An unseeded run saved to ``path`` after 3 steps; the release its own continuation makes next."""
    original, sgd = started()
    advance(original, sgd, 3)
    original.save(path)
    return release(original)


def refusal(resume) -> str | None:
    """The message of the DpoptError ``resume()`` raises; None if it resumes."""
    try:
        resume()
    except DpoptError as err:
        return str(err)
    return None


def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float, str | None]:
    """The reproduction: an unseeded run saved after 3 steps and continued; its checkpoint resumed
    (at the saved θ, where the continuation stands) and then resumed again. Returns ‖g̃ − g̃'‖ of
    the two next releases, the norm below which that difference of independent noises falls with
    probability < 1e-10, and the second resume's refusal. The operating system's bytes come from
    a fixed stream: the test is deterministic."""
    monkeypatch.setattr(os, "urandom", random.Random(0).randbytes)
    path = tmp_path / "run.ckpt"
    continued = saved_and_continued(path)
    resumed, _ = started()
    resumed.resume(path)
    again = release(resumed)
    # Same θ, same (full) batch: g̃ − g̃' = (ξ − ξ')/n, ξ, ξ' ~ N(0, (z·2C)² I_d) (replace-one: Δ = 2C);
    # ‖·‖² / (2 (z·2C/n)²) ~ χ²_d, below d/4 with probability ≤ (e^{3/4}/4)^{d/2} < 1e-10 (d = 74, Chernoff)
    std, d = resumed.algorithm.noise_multiplier * 2 * CLIP / N, again.numel()
    return float((again - continued).norm()), math.sqrt(2 * d / 4) * std, refusal(lambda: started()[0].resume(path))


def test_a_checkpoint_resumes_once_and_an_unseeded_resume_draws_fresh_noise(tmp_path, monkeypatch):
    """Finding 2: two resumes of one checkpoint released the saved run's noise again, at θ the
    user's optimizer chose (their releases differed by exactly the unnoised difference of the
    clipped sums). Now the resumed release's noise is new, and a second resume is refused."""
    difference, below, second = fork(tmp_path, monkeypatch)
    assert difference > below > 0
    assert second.startswith(f"checkpoint={str(tmp_path / 'run.ckpt')!r} holds step 3 of run ")
    assert second.endswith(", which was already resumed once: resuming it again would fork the run (two "
                           "continuations of one state, each counting only its own ε); it was not used. Continue "
                           "from the resumed run's latest checkpoint, or start a new run")


def test_the_fork_test_catches_the_resume_that_replays_the_saved_noise(tmp_path, monkeypatch):
    """The mutant: the resume before the fix (the saved generators restored, any number of
    times). The resumed release repeats the continuation's bit for bit, and so would release the
    unnoised difference at another θ: the test above fails on it."""
    monkeypatch.setattr(journal, "resume", lambda *args, **kwargs: None)

    def replayed(self: dpopt.Private) -> None:
        saved = checkpoint.load(tmp_path / "run.ckpt")
        self.stepper.sample_gen.set_state(saved.sample_gen)
        self.stepper.source.generator.set_state(saved.noise_gen)

    monkeypatch.setattr(dpopt.Private, "_redraw", replayed)
    difference, below, second = fork(tmp_path, monkeypatch)
    assert difference == 0.0 and second is None


@pytest.mark.parametrize("mutant", [False, True])
def test_an_older_checkpoint_of_a_private_run_is_refused(tmp_path, monkeypatch, mutant):
    """A checkpoint older than one its run already wrote is a rewind: refused, naming its step;
    the latest resumes (a seeded run: with the saved generators). The mutant without the journal
    check resumes the older one."""
    if mutant:
        monkeypatch.setattr(journal, "resume", lambda *args, **kwargs: None)
    private, sgd = started(seed=1)
    for t in (2, 4):
        advance(private, sgd, 2)
        private.save(tmp_path / f"step{t}.ckpt")
    older = refusal(lambda: started(seed=1)[0].resume(tmp_path / "step2.ckpt"))
    if mutant:
        assert older is None
        return
    assert older.startswith(f"checkpoint={str(tmp_path / 'step2.ckpt')!r} holds step 2 of run ")
    assert older.endswith(", which already checkpointed or resumed step 4: resuming it would rewind the run (the data "
                          "would pass through more noised steps than its ε counts); it was not used. Resume the run's "
                          "latest checkpoint, or start a new run in another --out")
    latest = started(seed=1)[0]
    latest.resume(tmp_path / "step4.ckpt")
    assert latest.t == 4 and torch.equal(release(latest), release(private))  # seeded: the saved generators


def test_an_edited_private_checkpoint_is_refused(tmp_path):
    """Finding 8 for dpopt.Private: a checkpoint whose step and ledger were rewound together, its
    digest recomputed, is refused: its tag (HMAC under the user's key) no longer verifies."""
    private, sgd = started(seed=1)
    advance(private, sgd, 4)
    path = tmp_path / "run.ckpt"
    private.save(path)
    saved = checkpoint.load(path)
    (event, count), = saved.ledger["runs"]
    saved.ledger["runs"] = [(event, 1)]
    saved = dataclasses.replace(saved, step=1)
    for key, reason in [(None, "it carries no tag"), (journal.Key(bytes(32), Path("elsewhere")), "its tag does not "
                                                                                               "verify under")]:
        checkpoint.save(path, saved, key)
        with pytest.raises(DpoptError, match=f"^checkpoint='.*run.ckpt' is not authenticated: {reason}"):
            started(seed=1)[0].resume(path)


def test_bad_arguments_are_named():
    X, y = data()
    with pytest.raises(DpoptError, match="give exactly one of them"):
        dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=DELTA, steps=3, epochs=1.0)
    with pytest.raises(DpoptError, match="train_data is a DataLoader: pass its dataset .* or pass the DataLoader to "
                                         "dpopt.Private or dpopt.fit"):
        TorchModel(model(), loss, torch.utils.data.DataLoader(TensorDataset(X, y)))  # Private takes one: its own tests
    with pytest.raises(DpoptError, match="algorithm='dp-sgd' by name needs an epsilon"):
        dpopt.Private(model(), loss, (X, y), epsilon=None, delta=DELTA, steps=3)
    with pytest.raises(DpoptError, match="algorithm='storm' is not private"):
        dpopt.Private(model(), loss, (X, y), algorithm="storm", epsilon=1.0, delta=DELTA, steps=3)


def test_fit_takes_train_metrics_and_measures_nothing_by_default():
    X, y = data()
    history = dpopt.fit(model(), loss, (X, y), epsilon=2.0, delta=DELTA, epochs=2, batch_size=40, seed=0,
                        train_metrics=False)
    assert history.diagnostics is None
    assert [r["step"] for r in history.records] == [5, 10]  # one log point per epoch
    history = dpopt.fit(model(), loss, (X, y), epsilon=2.0, delta=DELTA, epochs=1, batch_size=40, seed=0,
                        diagnostics=True, train_metrics=False)
    assert history.diagnostics["final"]["objective"] != history.diagnostics["final"]["objective"]  # NaN: not asked


def test_fit_diagnostics_are_on_a_bounded_sample():
    """objective with diagnostic_sample=k is the mean loss of k evenly spread records."""
    X, y = data()
    history = dpopt.fit(model(), loss, (X, y), epsilon=2.0, delta=DELTA, epochs=1, batch_size=40, seed=0,
                        diagnostics=True, diagnostic_sample=50)
    oracle = TorchModel(model(), loss, X, y)
    sample = torch.linspace(0, N - 1, 50).round().long()
    assert history.diagnostics["final"]["objective"] == pytest.approx(float(oracle.loss(history.theta, sample)),
                                                                      rel=1e-6)


def test_test_error_is_measured_in_eval_mode():
    """Dropout is off while the test error is measured, and the module's mode is restored."""
    X, y = data()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.9), nn.Linear(8, 2))
    a = dpopt.fit(net, loss, (X, y), epsilon=2.0, delta=DELTA, epochs=1, batch_size=40, seed=0, test_data=(X, y))
    assert net.training
    net.eval()
    oracle = TorchModel(net, loss, X, y)
    assert a.final["test_error"] == oracle.error(a.theta, X, y)
    assert steps_for_epochs(build("dp-sgd", n=N, batch_size=40), N, 1) == 5


def test_a_lazy_dataset_gives_the_tensors_results_in_chunks():
    """Full passes (loss, gradient) and a DP-GD run over a lazy dataset read it chunk by chunk and
    equal those over the same records as tensors."""
    X, y = data()
    lazy = TorchModel(model(), loss, Counting(X, y), microbatch_size=64)
    dense = TorchModel(model(), loss, X, y, microbatch_size=64)
    theta = dense.flat_params().double()
    assert float(lazy.loss(theta)) == pytest.approx(float(dense.loss(theta)), rel=1e-6)
    assert torch.allclose(lazy.gradient(theta), dense.gradient(theta), atol=1e-6)
    assert lazy.data_digest != TorchModel(model(), loss, Counting(X, 1 - y)).data_digest
    a = dpopt.Private(model(), loss, Counting(X, y), algorithm="dp-gd", epsilon=2.0, delta=DELTA, steps=3, seed=0)
    b = dpopt.Private(model(), loss, (X, y), algorithm="dp-gd", epsilon=2.0, delta=DELTA, steps=3, seed=0)
    for _ in a:
        a.step()
    for _ in b:
        b.step()
    assert torch.allclose(a.output(), b.output(), atol=1e-6)


def test_a_checkpoint_resumed_with_another_loss_is_refused(tmp_path):
    """A seeded checkpoint resumed with another loss (or module) of the same size would replay its
    noise at other gradients: the same fork as two resumes at different θ. The module's structure
    and the loss's code are among the settings a checkpoint must match."""
    private, sgd = started(seed=1)
    advance(private, sgd, 2)
    private.save(tmp_path / "run.ckpt")
    net = model(torch.float64)
    doubled = dpopt.Private(net, lambda out, y: 2 * loss(out, y), data(), algorithm="dp-gd", epsilon=1.0, delta=DELTA,
                            steps=6, clip=CLIP, seed=1)
    message = refusal(lambda: doubled.resume(tmp_path / "run.ckpt"))
    assert message is not None and "model" in message, message
    assert refusal(lambda: started(seed=1)[0].resume(tmp_path / "run.ckpt")) is None


def test_delta_of_at_least_one_over_n_is_refused_unless_allowed_and_a_huge_epsilon_warns():
    """δ ≥ 1/n (here 1/200) is refused by default; ε > 100 is calibrated to, with a warning."""
    X, y = data()
    with pytest.raises(DpoptError, match=r"^delta=0.005 must be < 1/n = 0.005 for n=200 records: .* or "
                                         r"allow_large_delta=True \(--allow-large-delta\) to accept this knowingly$"):
        dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=0.005, steps=3, batch_size=40)
    private = dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=0.005, steps=3, batch_size=40,
                            allow_large_delta=True)
    assert private.delta == 0.005
    with pytest.warns(dpopt._validate.DpoptWarning, match=r"^epsilon=1e\+06 is above 100: "):
        dpopt.Private(model(), loss, (X, y), epsilon=1e6, delta=DELTA, steps=3, batch_size=40)
