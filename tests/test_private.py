"""``dpopt.Private``: the private gradient in the user's own loop, with the user's optimizer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import dpopt
from dpopt import accounting
from dpopt._validate import DpoptError
from dpopt.accounting import canonical
from dpopt.algorithms.by_name import build, steps_for_epochs
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


@pytest.mark.parametrize("algorithm", ["dp-sgd", "dp-srm", "dp-gd", "rrpsgd", "aclip"])
def test_sgd_on_the_private_gradient_is_the_run(algorithm):
    """torch.optim.SGD(lr=η) on g̃_t takes exactly the steps dpopt.run takes with the same seed
    (float64 module): the release comes from the same code path, the optimizer is θ − η g̃."""
    X, y = data()
    net = model(torch.float64)
    options = {"clip_diff": 0.5, "gamma": 0.3} if algorithm == "dp-srm" else {}
    private = dpopt.Private(net, loss, (X, y), algorithm=algorithm, epsilon=2.0, delta=DELTA, steps=12,
                            batch_size=40, lr=0.3, seed=5, **options)
    sgd = torch.optim.SGD(net.parameters(), lr=0.3)
    for _ in private:
        private.backward()
        sgd.step()
    oracle = TorchModel(model(torch.float64), loss, X, y)
    history = dpopt.run(private.algorithm, oracle, steps=12, seed=5, delta=DELTA, theta0=oracle.flat_params())
    assert torch.allclose(private.output(), history.theta, rtol=0, atol=1e-12)
    assert private.epsilon() == pytest.approx(history.final["epsilon"], rel=1e-12)


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
    with pytest.raises(DpoptError, match="belongs to another run: its algorithm is"):
        other.resume(tmp_path / "run.ckpt")


def test_bad_arguments_are_named():
    X, y = data()
    with pytest.raises(DpoptError, match="give exactly one of them"):
        dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=DELTA, steps=3, epochs=1.0)
    with pytest.raises(DpoptError, match="train_data is a DataLoader: pass its dataset"):
        dpopt.Private(model(), loss, torch.utils.data.DataLoader(TensorDataset(X, y)), epsilon=1.0, delta=DELTA,
                      steps=3)
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


def test_delta_of_at_least_one_over_n_is_refused_unless_allowed_and_a_huge_epsilon_warns():
    """δ ≥ 1/n (here 1/200) is refused by default; ε > 100 is calibrated to, with a warning."""
    X, y = data()
    with pytest.raises(DpoptError, match=r"^delta=0.005 must be < 1/n = 0.005 for n=200 records: .* or "
                                         r"allow_large_delta=True to accept this knowingly$"):
        dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=0.005, steps=3, batch_size=40)
    private = dpopt.Private(model(), loss, (X, y), epsilon=1.0, delta=0.005, steps=3, batch_size=40,
                            allow_large_delta=True)
    assert private.delta == 0.005
    with pytest.warns(dpopt._validate.DpoptWarning, match=r"^epsilon=1e\+06 is above 100: "):
        dpopt.Private(model(), loss, (X, y), epsilon=1e6, delta=DELTA, steps=3, batch_size=40)
