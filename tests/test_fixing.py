"""``dpopt.fix``: a copy of a model with what the engines refuse or mishandle replaced, and what
it changed; the engines' refusals name it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpopt
import dpopt.nn as dnn
from dpopt._validate import DpoptError
from dpopt.accounting import canonical
from dpopt.fixing import groups
from dpopt.oracles import TorchModel

F64 = torch.float64


def cross_entropy(out, y):
    return F.cross_entropy(out, y, reduction="none")


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: conv-BN-ReLU-conv-BN, plus the (downsampled) input, ReLU."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = (nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
                           if stride != 1 or inplanes != planes else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """A small torchvision-style ResNet: stem conv-BN-ReLU(inplace)-maxpool, two stages of
    basic blocks (48 and 64 channels), global average pool, Linear."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 48, 3, 1, 1, bias=False), nn.BatchNorm2d(48), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(2))
        self.layer1 = BasicBlock(48, 48)
        self.layer2 = BasicBlock(48, 64, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer2(self.layer1(self.stem(x)))), 1))


def images(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen)


RELU_CHANGE = ("{}: nn.ReLU(inplace=True) → nn.ReLU() (the same values): an in-place layer overwrites the output "
               "the ghost engine keeps")


def batch_norm_change(path: str, channels: int, count: int) -> str:
    return (f"{path}: nn.BatchNorm2d({channels}, eps=1e-05, momentum=0.1, affine=True, bias=True, "
            f"track_running_stats=True) → nn.GroupNorm({count}, {channels}, eps=1e-05, affine=True, bias=True) "
            f"({count} = the largest divisor of {channels} that is at most 32; eps, weight and bias copied, running "
            "statistics dropped): BatchNorm mixes the records of a batch")


def test_a_resnet_with_batch_norm_is_fixed_and_trains_through_private_with_the_ghost_engine():
    torch.manual_seed(0)
    model = ResNet()
    X, y = images()
    with pytest.raises(DpoptError, match=r"module='stem.1' is BatchNorm2d.*dpopt.fix\(model\) returns a copy"):
        dpopt.Private(model, cross_entropy, (X, y), epsilon=4.0, delta=1e-5, steps=1, batch_size=16)
    fixed, changes = dpopt.fix(model)
    assert changes == [batch_norm_change("stem.1", 48, 24), RELU_CHANGE.format("stem.2"),
                       batch_norm_change("layer1.bn1", 48, 24), RELU_CHANGE.format("layer1.relu"),
                       batch_norm_change("layer1.bn2", 48, 24), batch_norm_change("layer2.bn1", 64, 32),
                       RELU_CHANGE.format("layer2.relu"), batch_norm_change("layer2.bn2", 64, 32),
                       batch_norm_change("layer2.downsample.1", 64, 32)]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 6  # the model itself is untouched
    assert model.stem[2].inplace and fixed is not model
    assert not any(isinstance(m, nn.BatchNorm2d) or getattr(m, "inplace", False) for m in fixed.modules())
    private = dpopt.Private(fixed, cross_entropy, (X, y), epsilon=4.0, delta=1e-5, steps=2, batch_size=16, seed=0)
    assert dict(private.oracle.rules())["stem.1"] == "ghost"
    sgd = torch.optim.SGD(fixed.parameters(), lr=0.1)
    before = [p.detach().clone() for p in fixed.parameters()]
    for _ in private:
        private.backward()
        sgd.step()
    assert private.ledger.event() == canonical(private.algorithm.planned_event(len(y), 2))
    assert all(not torch.equal(a, b) for a, b in zip(before, fixed.parameters()))


def test_the_fixed_resnet_has_autograds_per_record_gradients_under_both_engines():
    torch.manual_seed(0)
    fixed, _ = dpopt.fix(ResNet().double())
    X, y = images(4)
    X = X.double()
    params = [p for p in fixed.parameters()]
    want = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        cross_entropy(fixed(X[i:i + 1]), y[i:i + 1]).sum(), params)]) for i in range(4)])
    for engine in ("vmap", "ghost"):
        oracle = TorchModel(fixed, cross_entropy, X, y, engine=engine)
        norms = oracle.per_record(oracle.flat_params(), torch.arange(4)).norms()
        assert torch.allclose(norms, want.norm(dim=1), rtol=1e-9, atol=0)


@pytest.mark.parametrize(("channels", "count"), [(64, 32), (48, 24), (3, 3), (100, 25), (37, 1), (1, 1)])
def test_the_group_count_is_the_largest_divisor_up_to_32(channels, count):
    assert groups(channels) == count
    fixed, _ = dpopt.fix(nn.Sequential(nn.BatchNorm2d(channels)))
    assert (fixed[0].num_groups, fixed[0].num_channels) == (count, channels)


def test_batch_norm_1d_becomes_one_group_with_its_affine_parameters_and_flags():
    norm = nn.BatchNorm1d(6, eps=1e-3)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(6.0))
        norm.bias.copy_(-torch.arange(6.0))
    norm.bias.requires_grad_(False)
    fixed, changes = dpopt.fix(nn.Sequential(nn.Linear(3, 6), norm, nn.BatchNorm3d(4, affine=False),
                                             nn.BatchNorm2d(4, bias=False)))
    assert isinstance(fixed[1], nn.GroupNorm) and (fixed[1].num_groups, fixed[1].eps) == (1, 1e-3)
    assert torch.equal(fixed[1].weight, norm.weight) and torch.equal(fixed[1].bias, norm.bias)
    assert fixed[1].weight.requires_grad and not fixed[1].bias.requires_grad
    assert "(1 group: BatchNorm1d's input may be [B, C] features; eps, weight and bias copied" in changes[0]
    assert (fixed[2].num_groups, fixed[2].affine) == (4, False)
    assert "eps copied, running statistics dropped" in changes[1]
    assert fixed[3].bias is None and "eps and weight copied" in changes[2]


class TextModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.lstm = nn.LSTM(4, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.cell = nn.GRUCell(12, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(self.cell(out[:, -1]))


def test_an_lstm_model_is_fixed_with_its_weights_and_outputs():
    torch.manual_seed(0)
    model = TextModel().double().eval()
    X = torch.randint(0, 10, (5, 7))
    y = torch.randint(0, 2, (5,))
    with pytest.raises(DpoptError, match=r"module='lstm' is LSTM.*dpopt.fix\(model\) returns a copy with each of "
                                         r"torch's recurrent layers replaced by dpopt.nn's"):
        TorchModel(model, cross_entropy, X, y)
    fixed, changes = dpopt.fix(model)
    why = "(weights copied): torch's fused recurrent kernels have no per-record rule"
    settings = "4, 6, num_layers=2, batch_first=True, bidirectional=True"
    assert changes == [f"lstm: nn.LSTM({settings}) → dpopt.nn.LSTM({settings}) {why}",
                       f"cell: nn.GRUCell(12, 5) → dpopt.nn.GRUCell(12, 5) {why}"]
    assert isinstance(fixed.lstm, dnn.LSTM) and isinstance(fixed.cell, dnn.GRUCell) and not fixed.training
    assert fixed.state_dict().keys() == model.state_dict().keys()
    assert torch.allclose(fixed(X), model(X), rtol=0, atol=1e-12)
    for engine in ("vmap", "ghost"):
        TorchModel(fixed, cross_entropy, X, y, engine=engine).per_record(
            torch.cat([p.reshape(-1) for p in fixed.parameters()]), torch.arange(5))


def test_a_module_reached_twice_is_replaced_once_and_a_model_without_findings_is_copied():
    shared = nn.BatchNorm2d(4)
    model = nn.Sequential(shared, nn.Sequential(shared))
    fixed, changes = dpopt.fix(model)
    assert fixed[0] is fixed[1][0] and isinstance(fixed[0], nn.GroupNorm) and len(changes) == 1
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    copied, nothing = dpopt.fix(plain)
    assert nothing == [] and copied is not plain and torch.equal(copied[0].weight, plain[0].weight)
    root, changed = dpopt.fix(nn.BatchNorm2d(8))
    assert isinstance(root, nn.GroupNorm) and changed[0].startswith("<model>: nn.BatchNorm2d(8")


def test_instance_norm_with_running_statistics_is_fixed_for_both_engines():
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
                          nn.Flatten(), nn.Linear(12, 2)).double()
    X, y = torch.randn(4, 2, 4, 4, dtype=F64), torch.randint(0, 2, (4,))
    fixed, changes = dpopt.fix(model)
    settings = "3, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats"
    why = "they are updated in place from the training data, which the engines cannot do per record"
    assert changes == [(f"1: nn.InstanceNorm2d({settings}=True) → nn.InstanceNorm2d({settings}=False) "
                        f"(running statistics dropped): {why}")]
    assert "running_mean" not in fixed.state_dict() and "1.running_mean" not in fixed.state_dict()
    for engine in ("vmap", "ghost"):
        oracle = TorchModel(fixed, cross_entropy, X, y, engine=engine)
        assert oracle.per_record(oracle.flat_params(), torch.arange(4)).norms().isfinite().all()


def test_an_in_place_activation_after_a_ghost_layer_is_refused_by_the_ghost_engine_and_fixed():
    """Finding: the ghost engine differentiated against a Linear's output that a ReLU(inplace=True)
    had overwritten, and silently returned wrong per-record gradients (0.28 off in float64). It
    now refuses the model and names the fix; the fixed model's gradients are autograd's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(inplace=True), nn.Linear(4, 3)).double()
    X, y = torch.randn(6, 5, dtype=F64), torch.randint(0, 3, (6,))
    oracle = TorchModel(model, cross_entropy, X, y, engine="ghost")
    with pytest.raises(DpoptError, match=r"the output of layer '0' \(Linear\) is overwritten in place by a later "
                                         r"module .*dpopt.fix\(model\) returns a copy with in-place activations"):
        oracle.per_record(oracle.flat_params(), torch.arange(6))
    fixed, changes = dpopt.fix(model)
    assert changes == [RELU_CHANGE.format("1")]
    oracle = TorchModel(fixed, cross_entropy, X, y, engine="ghost")
    rows = oracle.per_record(oracle.flat_params(), torch.arange(6))
    params = list(fixed.parameters())
    for i in range(6):
        want = torch.autograd.grad(cross_entropy(fixed(X[i:i + 1]), y[i:i + 1]).sum(), params)
        got = rows.weighted_sum(torch.eye(6, dtype=F64)[i])
        assert torch.allclose(got, torch.cat([g.reshape(-1) for g in want]), rtol=0, atol=1e-12)


def test_bad_input_is_named():
    with pytest.raises(DpoptError, match="model=str must be a torch.nn.Module"):
        dpopt.fix("resnet")
    with pytest.raises(DpoptError, match=r"module='0' \(LazyBatchNorm2d\) has uninitialised parameters: run one "
                                         "forward pass before dpopt.fix"):
        dpopt.fix(nn.Sequential(nn.LazyBatchNorm2d()))
    lazy = nn.Sequential(nn.LazyBatchNorm2d())
    lazy(torch.randn(2, 5, 3, 3))
    assert dpopt.fix(lazy)[0][0].num_channels == 5


def test_the_original_model_is_not_modified():
    model = TextModel()
    state = copy.deepcopy(model.state_dict())
    dpopt.fix(model)
    assert isinstance(model.lstm, nn.LSTM) and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
