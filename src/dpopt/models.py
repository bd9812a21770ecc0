"""The networks of the DP-SRM experiments (Wang, Jayaraman, Evans & Gu, "Efficient
Privacy-Preserving Stochastic Nonconvex Optimization", UAI 2023, arXiv:1910.13659): an MNIST CNN
and CNN5 / CNN6 for CIFAR-10; and the ResNet-18 of the AClip paper's CIFAR-10 experiments (Jin et
al., "Efficient Private SCO for Heavy-Tailed Data via Averaged Clipping"), with GroupNorm.

>>> from dpopt.models import make_model
>>> model = make_model("mnist-cnn", seed=0)       # input [B, 784] (dpopt.data's flat rows)
>>> sum(p.numel() for p in model.parameters())
26010

.. warning::
   **These are documented substitutes, not the paper's exact layers.** The paper's text
   available to us (its supplementary material) names the networks ("CNN on MNIST", "CNN5" and
   "CNN6" on CIFAR-10) and gives their results and hyper-parameter grids, but not their layers,
   and the main text could not be found. So each network below is the standard published
   network its name most plausibly refers to, from the line of work the paper compares with:

   * ``"mnist-cnn"``: the standard DP-SGD MNIST CNN (TensorFlow Privacy's tutorial, Opacus's
     ``examples/mnist.py`` ``SampleConvNet``, Papernot et al. 2021 "Tempered Sigmoid
     Activations for Deep Learning with Differential Privacy", AAAI, arXiv:2007.14191):
     conv 16 8×8 stride 2 pad 3 → act → maxpool 2×2 stride 1 → conv 32 4×4 stride 2 → act →
     maxpool 2×2 stride 1 → fc 512→32 → act → fc 32→10 (26,010 parameters).
   * ``"cnn6"``: Papernot et al. (2021)'s CIFAR-10 CNN, also the end-to-end CNN of Tramèr &
     Boneh 2021 ("Differentially Private Learning Needs Better Features", ICLR, arXiv:2011.11660;
     code github.com/ftramer/Handcrafted-DP ``models.py``): **six** 3×3 convolutions
     (32, 32, M, 64, 64, M, 128, 128, M; M = maxpool 2×2) → fc 2048→128 → fc 128→10
     (550,570 parameters).
   * ``"cnn5"``: the small variant of the same family in that code (``size="small"``): **five**
     3×3 convolutions (16, 16, M, 32, 32, M, 64, M) → fc 1024→128 → fc 128→10
     (167,642 parameters).

   "CNN5"/"CNN6" are read as five/six convolutional layers; this fits the paper's numbers only
   loosely (its CNN6 is far stronger than its CNN5: 29.3 % vs ~48 % private test error at
   ε = 8), so results on them are comparisons under the paper's protocol, not reproductions of
   its networks.

Activations of these three are ``tanh`` by default (Papernot et al. show bounded,
tempered-sigmoid activations train better under DP-SGD than ReLU); ``activation="relu"`` gives
the TensorFlow Privacy / Opacus variant. None of them has BatchNorm. Inputs are not normalised
inside the model: the data sets give pixels in [0, 1].

``"scatternet-linear"`` is Tramèr & Boneh (2021)'s ScatterNet + linear model (the strongest
MNIST baseline of their Table 1; the ``mnist-sota`` reproduction): input the scattering features
of a 28 × 28 image (:class:`dpopt.scattering.Scattering2D`, J = 2, L = 8: 81 × 7 × 7 = 3,969
numbers), GroupNorm without affine parameters (``groups`` of the 81 channels; each record's
features normalised on their own), a linear layer to 10 outputs; ``"linear"`` is its last layer
alone, for features normalised when they are computed. ``"mnist-cnn"`` with its default
tanh is the end-to-end CNN of the same table.

``"resnet18"`` is the standard CIFAR-10 ResNet-18 (He et al. 2016, "Deep Residual Learning for
Image Recognition", arXiv:1512.03385, in its usual CIFAR form: 3×3 conv stem of 64 channels,
stride 1, no max-pool; four stages of two :class:`BasicBlock` with 64 / 128 / 256 / 512 channels
and strides 1 / 2 / 2 / 2, a 1×1 conv shortcut where the shape changes; adaptive average pool;
fc 512→10; convolutions without bias; 11,173,962 parameters), with **GroupNorm instead of
BatchNorm**. BatchNorm normalises each record with the statistics of its whole batch, so a
record's gradient depends on the other records and per-record gradients (hence per-record
clipping and the DP sensitivity) are undefined; the torch oracle refuses it. GroupNorm normalises
each record on its own; ``nn.GroupNorm(min(32, C), C)`` (32 groups: Wu & He 2018, "Group
Normalization", arXiv:1803.08494) is what Opacus's ``ModuleValidator.fix`` substitutes for
BatchNorm (``opacus/validators/batch_norm.py``), the usual choice for DP ResNets (De et al. 2022
also train with GroupNorm). GroupNorm has BatchNorm's per-channel affine parameters and no
buffers, so the parameter count equals BatchNorm ResNet-18's. Its activation is ReLU by default.

Every model is one ``nn.Sequential`` starting with ``nn.Unflatten(1, (C, H, W))``, because
:mod:`dpopt.data` stores images as flat rows (``[B, 784]`` for MNIST, ``[B, 3072]``
channel-major R, G, B for CIFAR-10). The three CNNs hold only ``Unflatten`` / ``Conv2d`` (zero
padding) / activation / ``MaxPool2d`` / ``Flatten`` / ``Linear`` layers, so every layer with
parameters takes the ghost engine's fast path (:mod:`dpopt.oracles.ghost`). In ResNet-18 only the
stem conv and the fc layer do: each GroupNorm and each residual block (its own ``forward``) is a
ghost "block" stage, whose per-record gradients are computed densely under ``vmap``, so memory
grows as records × block parameters (up to 4.7 M for a 512-channel block): keep
``microbatch_size`` small (tens of records) with either engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from . import _validate, names
from .oracles import TorchModel
from .oracles.per_record import SqueezeLast

__all__ = ["ACTIVATIONS", "NETWORKS", "BasicBlock", "cnn5", "cnn6", "cross_entropy", "logistic_loss", "make_model",
           "mlp", "linear", "mlp_oracle", "mnist_cnn", "resnet18", "scatternet_linear", "squared_loss"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "softplus": nn.Softplus}


def mnist_cnn(*, activation: str = "tanh") -> nn.Sequential:
    """The standard DP-SGD MNIST CNN (Papernot et al. 2021; TF Privacy / Opacus): input [B, 784]."""
    act = _activation(activation)
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 8, stride=2, padding=3), act(),  # -> 16 x 14 x 14
        nn.MaxPool2d(2, stride=1),                         # -> 16 x 13 x 13
        nn.Conv2d(16, 32, 4, stride=2), act(),             # -> 32 x 5 x 5
        nn.MaxPool2d(2, stride=1),                         # -> 32 x 4 x 4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32), act(),
        nn.Linear(32, 10),
    )


def cnn6(*, activation: str = "tanh") -> nn.Sequential:
    """Six 3×3 convolutions and two linear layers for CIFAR-10 (Papernot et al. 2021): input [B, 3072]."""
    return _cifar10_cnn((32, 32, "M", 64, 64, "M", 128, 128, "M"), activation)


def cnn5(*, activation: str = "tanh") -> nn.Sequential:
    """Five 3×3 convolutions and two linear layers for CIFAR-10 (Tramèr & Boneh's small
    variant of :func:`cnn6`): input [B, 3072]."""
    return _cifar10_cnn((16, 16, "M", 32, 32, "M", 64, "M"), activation)


def _cifar10_cnn(config: tuple[int | str, ...], activation: str) -> nn.Sequential:
    """3×3 'same' convolutions (an int: output channels) and 2×2 max-pools ("M") on 3×32×32 images,
    then a hidden linear layer of 128 and 10 outputs."""
    act = _activation(activation)
    layers: list[nn.Module] = [nn.Unflatten(1, (3, 32, 32))]
    channels, side = 3, 32
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(2, stride=2))
            side //= 2
        else:
            layers += [nn.Conv2d(channels, int(item), 3, padding=1), act()]
            channels = int(item)
    layers += [nn.Flatten(), nn.Linear(channels * side * side, 128), act(), nn.Linear(128, 10)]
    return nn.Sequential(*layers)


def scatternet_linear(*, groups: int = 27) -> nn.Sequential:
    """Tramèr & Boneh (2021)'s "ScatterNet + linear" model on the scattering features of a 28 × 28
    grey image (:class:`dpopt.scattering.Scattering2D`, J = 2, L = 8: 81 channels of 7 × 7, input
    [B, 3969]): GroupNorm with ``groups`` groups (a divisor of 81) and no affine parameters, which
    normalises each record's features on their own, then a linear layer to 10 outputs (39,700
    parameters)."""
    channels, side = 81, 7
    if not (isinstance(groups, int) and groups > 0 and channels % groups == 0):
        raise _validate.DpoptError(f"groups={groups!r} must divide the {channels} feature channels (1, 3, 9, 27 or 81)")
    return nn.Sequential(
        nn.Unflatten(1, (channels, side, side)),
        nn.GroupNorm(groups, channels, affine=False),
        nn.Flatten(),
        nn.Linear(channels * side * side, 10),
    )


def linear(*, inputs: int, outputs: int = 10) -> nn.Sequential:
    """Softmax regression: one linear layer from ``inputs`` features to ``outputs`` logits, for
    features prepared beforehand (e.g. the mnist-sota preset's scattering features, GroupNorm-
    normalised with them: :class:`dpopt.scattering.GroupNormalised`). With the same seed its
    weights are those of ``"scatternet-linear"`` on 3,969 inputs (whose other layers have none)."""
    _validate.positive_int("inputs", inputs)
    _validate.positive_int("outputs", outputs)
    return nn.Sequential(nn.Linear(inputs, outputs))


def _group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm as Opacus substitutes it for BatchNorm: ``min(32, C)`` groups, affine."""
    return nn.GroupNorm(min(32, channels), channels)


class BasicBlock(nn.Module):
    """ResNet's basic block with GroupNorm: ``act(residual(x) + shortcut(x))``, where
    ``residual`` = conv 3×3 (stride) → norm → act → conv 3×3 → norm and ``shortcut`` is the
    identity, or conv 1×1 (stride) → norm when the stride or the channel count changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, act: type[nn.Module]) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
            _group_norm(out_channels), act(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            _group_norm(out_channels),
        )
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), _group_norm(out_channels))
        else:
            self.shortcut = nn.Identity()
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.residual(x) + self.shortcut(x))


def resnet18(*, activation: str = "relu") -> nn.Sequential:
    """The CIFAR-10 ResNet-18 with GroupNorm(min(32, C), C) in place of BatchNorm: input [B, 3072]
    (channel-major rows), 10 outputs, 11,173,962 parameters."""
    act = _activation(activation)
    layers: list[nn.Module] = [
        nn.Unflatten(1, (3, 32, 32)),
        nn.Conv2d(3, 64, 3, padding=1, bias=False), _group_norm(64), act(),   # -> 64 x 32 x 32
    ]
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):            # -> 512 x 4 x 4
        layers += [BasicBlock(channels, width, stride, act), BasicBlock(width, width, 1, act)]
        channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


#: The named networks (:data:`dpopt.names.NETWORKS`) and their builders (:func:`make_model`).
NETWORKS: dict[str, Callable[..., nn.Sequential]] = dict(zip(
    names.NETWORKS, (mnist_cnn, cnn5, cnn6, resnet18, scatternet_linear, linear), strict=True))


def mlp(inputs: int, *, hidden: int = 10, outputs: int = 1, activation: str = "softplus",
        seed: int = 0) -> nn.Sequential:
    """The DIFF2 paper's network (Murata & Suzuki 2023, §6): one hidden layer of ``hidden``
    softplus units, in float64. ``outputs=1`` gives one value per record (``[B]``: squared loss
    on a regression target); ``outputs=k`` gives ``[B, k]`` logits (cross-entropy).

    Initialisation: every weight and bias of a layer with w_in inputs is drawn from
    U[−1/√w_in, 1/√w_in] (generator seeded with ``seed``). The paper's text reads
    "U[−√w_in, √w_in]"; taken literally that scale grows with the width (±16.7 for
    BlogFeedback's 280 inputs, pre-activations of order 10²) and saturates the network, so we
    read it as the usual 1/√w_in (PyTorch's own ``nn.Linear`` default range).
    """
    _validate.positive_int("inputs", inputs)
    _validate.positive_int("hidden", hidden)
    _validate.positive_int("outputs", outputs)
    first, last = nn.Linear(inputs, hidden), nn.Linear(hidden, outputs)
    layers: list[nn.Module] = [first, _activation(activation)(), last]
    if outputs == 1:
        layers.append(SqueezeLast())
    model = nn.Sequential(*layers).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in (first, last):  # (.double() converts them in place)
            bound = 1 / layer.in_features ** 0.5
            for param in (layer.weight, layer.bias):
                param.copy_(torch.rand(param.shape, generator=gen, dtype=param.dtype) * 2 * bound - bound)
    return model


def squared_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-record squared loss (f(x) − y)²."""
    return (out - y) ** 2


def logistic_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-record logistic loss log(1 + e^(−y·f(x))) of one output per record and labels ±1."""
    return nn.functional.softplus(-y * out)


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-record cross-entropy of logits ``out [B, k]`` and class indices ``y``."""
    return nn.functional.cross_entropy(out, y.long(), reduction="none")


def mlp_oracle(X: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *, classes: int | None = None,
               loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, seed: int = 0) -> TorchModel:
    """The DIFF2 paper's problem on ``(X, y)``: :func:`mlp` with one output per record and
    ``loss`` (default :func:`squared_loss`, a regression target; :func:`logistic_loss` for binary
    labels ±1), or ``classes`` outputs and cross-entropy over ``classes`` classes, as a
    ghost-engine :class:`~dpopt.oracles.TorchModel` computing all records in one chunk (the
    network is tiny: one chunk is the fastest, and full-batch rounds see every record). The
    model's size is fixed by the width of X and ``classes``, never by the labels."""
    if classes is not None and loss is not None:
        raise _validate.DpoptError(f"loss={loss!r} is for one output per record; classes={classes} uses cross-entropy")
    X, y = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    model = mlp(X.shape[1], outputs=1 if classes is None else classes, seed=seed)
    loss = cross_entropy if classes is not None else loss or squared_loss
    return TorchModel(model, loss, X, y, engine="ghost", microbatch_size=max(1, len(X)))


def make_model(name: str, *, activation: str | None = None, seed: int | None = None, **options: object) -> nn.Module:
    """A fresh float32 model ``name`` (one of :data:`NETWORKS`) on the CPU.

    ``activation``: "tanh" or "relu"; ``None`` is the model's own default (tanh for the DP-SRM
    networks, relu for "resnet18"; "scatternet-linear" and "linear" have none). ``options``: the
    model's own keywords (``groups`` of "scatternet-linear", ``inputs`` and ``outputs`` of
    "linear"). ``seed``: if given, the initial weights are drawn from a generator seeded with it
    (torch's global generator is left as it was), so the same seed gives the same model; otherwise
    from torch's global generator, like any ``nn`` layer. Use ``.double()`` / ``.to(device)`` after.
    """
    _validate.one_of("model", name, NETWORKS)
    accepted = set(inspect.signature(NETWORKS[name]).parameters)
    if activation is not None:
        _activation(activation)
        if "activation" not in accepted:
            raise _validate.DpoptError(f"activation={activation!r}: model={name!r} has no activation to choose")
        options["activation"] = activation
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise _validate.DpoptError(f"options {unknown} are not options of model={name!r} (its options: "
                                   f"{', '.join(sorted(accepted)) or 'none'})")
    if seed is None:
        return NETWORKS[name](**options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return NETWORKS[name](**options)


def _activation(name: str) -> type[nn.Module]:
    return ACTIVATIONS[_validate.one_of("activation", name, ACTIVATIONS)]
