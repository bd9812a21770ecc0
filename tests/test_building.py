"""Models and algorithms built by name in one place (:mod:`dpopt.building`): every name of
:data:`dpopt.names.MODELS` becomes its oracle through ``oracle_for``; the command line offers the
models of that one list; an algorithm that is not private is refused in the same words wherever
it is named; the bench and ``dpopt tune`` tune through one function."""

from __future__ import annotations

import pytest
import torch

import dpopt
from dpopt import building, names
from dpopt._validate import DpoptError
from dpopt.cli import main, parser
from dpopt.models import NETWORKS, mlp
from dpopt.oracles import GLM, TorchModel
from dpopt.tuning import Space, tune
from dpopt.tuning.task import builder, held_out_task, tune_task
from dpopt.tuning.trials import trials_of
from tests.contracts.test_algorithms import DIM, oracle

#: Each model's number of parameters on the inputs of :data:`WIDTHS` (θ's dimension).
DIMENSIONS = {"logistic": 3, "nonconvex-logistic": 3, "ridge": 3, "mlp": 3 * 10 + 10 + 10 + 1, "mnist-cnn": 26010,
              "cnn5": 167642, "cnn6": 550570, "resnet18": 11173962, "scatternet-linear": 39700, "linear": 5 * 10 + 10}
#: The width of each model's input rows (3 features; a 28 × 28 image; 3 × 32 × 32; the scattering features).
WIDTHS = {"mnist-cnn": 784, "cnn5": 3072, "cnn6": 3072, "resnet18": 3072, "scatternet-linear": 3969, "linear": 5}


@pytest.mark.parametrize("name", names.MODELS)
def test_every_model_name_builds_its_oracle(name):
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(4, WIDTHS.get(name, 3), generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0]) if name in names.NETWORKS else torch.tensor([-1.0, 1.0, 1.0, -1.0])
    options = {"inputs": 5} if name == "linear" else {}
    built = building.oracle_for(name, X, y, microbatch_size=2, **options)
    assert isinstance(built, GLM if name in names.GLMS else TorchModel)
    assert (built.n, built.dim) == (4, DIMENSIONS[name])


def test_the_mlp_fits_each_task_with_its_loss_and_metric():
    gen = torch.Generator().manual_seed(1)
    X, y = torch.randn(6, 3, generator=gen, dtype=torch.float64), torch.tensor([-1.0, 1, 1, -1, 1, 1])
    with torch.no_grad():
        out = mlp(3)(X)
    binary = building.oracle_for("mlp", X, y, task="binary")
    theta = binary.flat_params()
    assert float(binary.loss(theta)) == pytest.approx(float(torch.nn.functional.softplus(-y * out).mean()))
    wrong = float(((out > 0) != (y > 0)).double().mean())
    assert building.metric_of("mlp", binary, X, y, task="binary")(theta) == wrong
    regression = building.oracle_for("mlp", X, y)
    assert float(regression.loss(theta)) == pytest.approx(float(((out - y) ** 2).mean()))
    assert building.metric_of("mlp", regression, X, y)(theta) == pytest.approx(float(((out - y) ** 2).mean()))


def _choices(command: str) -> tuple[str, ...]:
    sub = next(action for action in parser()._actions if action.dest == "name").choices[command]
    return tuple(next(action for action in sub._actions if action.dest == "model").choices)


def test_the_command_lines_offer_the_models_of_the_one_list():
    assert _choices("run") == names.TABULAR == ("logistic", "nonconvex-logistic", "ridge", "mlp")
    assert _choices("tune") == tuple(names.GLMS)
    assert set(names.MODELS) == set(names.TABULAR) | set(NETWORKS)


def test_a_non_private_algorithm_is_refused_in_the_same_words_everywhere(capsys, shared_data_dir):
    """Finding: ``dpopt run`` and ``dpopt.fit`` each wrote their own refusal, in other words."""
    with pytest.raises(DpoptError) as refused:
        building.private_entry("storm", 1.0)
    words = str(refused.value)
    assert words == ("algorithm='storm' is not private (ε = ∞) and cannot meet epsilon=1.0: train it with dpopt.run "
                     "as a non-private reference")
    assert main(["run", "--algorithm", "storm", "--dataset", "adult", "--epsilon", "1", "--data-dir",
                 str(shared_data_dir)]) == 2
    assert words in capsys.readouterr().err
    with pytest.raises(DpoptError) as fitted:
        dpopt.fit(torch.nn.Linear(DIM, 2), lambda o, t: o.sum(1), (oracle().X, oracle().y), algorithm="storm",
                  epsilon=1.0, delta=1e-5, epochs=1)
    assert str(fitted.value) == words
    with pytest.raises(DpoptError) as private:  # Private once wrote its own words, without the ε it cannot meet
        dpopt.Private(torch.nn.Linear(DIM, 2), lambda o, t: o.sum(1), (oracle().X, oracle().y), algorithm="storm",
                      epsilon=1.0, delta=1e-5, steps=1)
    assert str(private.value) == words
    assert building.private_entry("dp-sgd").name == "dp-sgd"


def test_tune_task_is_the_private_tuning_of_the_task():
    """The bench's jobs and ``dpopt tune`` call ``tune_task``: the same tuning as
    :func:`dpopt.tuning.tune` given the task's oracle, scores, θ0 and test metric."""
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(300, 3, generator=gen, dtype=torch.float64)
    y = torch.where(X[:, 0] > 0, 1.0, -1.0)
    task = held_out_task(lambda X_, y_: building.oracle_for("logistic", X_, y_, reg=1e-3), X[:250], y[:250],
                         X[250:], y[250:], validation_fraction=0.2)
    fixed, space, trials = {"batch_size": 50, "clip": 1.0}, Space.grid(lr=[0.1, 1.0]), trials_of(2.0, 1.0)
    ours = tune_task(task, "dp-sgd", fixed, space=space, trials=trials, epsilon=2.0, delta=1e-5, steps=10, seed=3)
    direct = tune(builder("dp-sgd", task.oracle.n, fixed), task.oracle, space=space, trials=trials, epsilon=2.0,
                  delta=1e-5, steps=10, score=task.validation_error, seed=3, theta0=task.theta0,
                  test_error=task.test_error)
    assert ours.theta is not None and direct.theta is not None and torch.equal(ours.theta, direct.theta)
    assert ours.final == direct.final and ours.hyperparameters == direct.hyperparameters
