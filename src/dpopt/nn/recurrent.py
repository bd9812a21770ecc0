"""Recurrent layers whose per-record gradients dpopt's engines compute: drop-in replacements of
torch's ``nn.RNN``/``nn.LSTM``/``nn.GRU`` and their cells.

torch's recurrent modules run fused kernels without a complete ``torch.func.vmap`` rule, so
neither engine can keep the records of a batch apart in them (``TorchModel`` refuses them).
These modules compute the same function as a loop over the time steps of two ``nn.Linear``
maps per layer and direction (as Opacus's ``DPLSTM`` does):

* ``gi = ih(x)``: the input map ``W_ih x_t + b_ih`` of every step at once (``[B, T, G·H]``);
* ``gh = hh(h_{t−1})``: the hidden map ``W_hh h_{t−1} + b_hh``, called once per step,

with G gate blocks in torch's order, and the cell's update (torch's equations):

* RNN (G = 1): ``h_t = act(gi_t + gh)``, act = tanh or relu;
* LSTM (G = 4, gates i, f, g, o): ``c_t = σ(f) ⊙ c_{t−1} + σ(i) ⊙ tanh(g)``, ``h_t = σ(o) ⊙ tanh(c_t)``;
* GRU (G = 3, gates r, z, n): ``r = σ(gi_r + gh_r)``, ``z = σ(gi_z + gh_z)``,
  ``n = tanh(gi_n + r ⊙ gh_n)``, ``h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}``.

Layers are stacked (each layer's output sequence is the next one's input, with dropout between
layers in training mode); a bidirectional layer runs a second pair of maps over the reversed
sequence and concatenates the two outputs. Outputs, their shapes (``batch_first``, unbatched
inputs, ``hx``) and the initialisation (every parameter uniform in ±1/√H) are torch's.

Parameters have torch's names and shapes (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...; the
cells' ``weight_ih``, ...), in torch's order, so ``state_dict()`` loads into torch's module and
back. Each is registered twice, under torch's name on this module and as the ``weight``/``bias``
of its ``nn.Linear`` child (``ih_l0``, ``hh_l0``, ...): ``named_parameters()`` and ``parameters()``
list it once, under torch's name; the state dict holds it once, under torch's name (the
children's keys are left out on saving and filled from torch's on loading).

Per-record gradients: with ``engine="vmap"`` each record runs alone. With ``engine="ghost"``
this module (or the custom module holding it) has trainable parameters and its own forward, so
the engine runs it on each record alone under ``vmap`` too, its ``nn.Linear`` children tapped:
their ghost rule (a Linear called T times is one layer over T positions) gives the records'
norms and sums, with no ``[B, d]`` matrix. Either way no record's computation can see another's.

Records of their own lengths: ``forward(input, hx=None, lengths=None, padding_side="right")``.
``lengths`` (an integer tensor ``[B]``, ``()`` for an unbatched input) counts each record's real
steps, which are its first ``lengths[b]`` (``padding_side="right"``, the padding after them, as
``pad_sequence`` gives it) or its last (``"left"``). Each direction then reads exactly the
record's steps (:mod:`dpopt.nn.padding`): the forward one from its first real step, the reverse
one from its last; ``h_n`` (``c_n``) is the state after the record's last step in each
direction, and the outputs at padded positions are zero: torch's results on the
``PackedSequence`` of the records, whatever the padded length T. A ``PackedSequence`` input is
taken too (unpacked, run with its lengths, and the output packed as torch packs it), outside
dpopt's per-record run: inside it, packing cannot work (a packed record's data has the record's
own length, so ``vmap`` cannot batch records of different lengths, and torch's packing has no
``vmap`` rule), so a ``PackedSequence`` reaching the layer there is refused, pointing to
``lengths=``.

Without ``lengths`` every step is the record's own: right for records of one length, wrong where
some are padded, and then a privacy leak wherever a record's padded length depends on other
records (a DataLoader's ``collate_fn`` that pads each chunk to its longest record, or padding to
the longest record of the data set): the reverse direction starts in the padding, the forward
one runs through left padding, ``h_n`` comes after the padding, so one record's length moves the
gradients of the records beside it, which clipping does not bound. The layer cannot tell padding
from data, so where dpopt's engines run it on records collated by a DataLoader's own
``collate_fn`` (``dpopt.oracles.records.may_be_padded``: any ``collate_fn`` but torch's default,
which stacks records of one shape and pads nothing) the stacked layers refuse to run without
``lengths``, in either direction. Records padded before they reach dpopt (tensors) look like
records of one length: pass ``lengths`` for them too, or pad to a length fixed in advance.
"""

from __future__ import annotations

import math
from typing import Any
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .. import _validate
from ..oracles import records
from . import padding

State = tuple[Tensor, ...]  # (h,) or, for an LSTM, (h, c)
Hidden = Tensor | tuple[Tensor, ...] | list[Tensor]  # a given hx: h, or an LSTM's (h, c)
Device = torch.device | str | int | None


def _drop_children(module: _Recurrent, state_dict: dict[str, Tensor], prefix: str, local_metadata: object) -> None:
    """State-dict post-hook: the parameters are saved under torch's names only, not again under
    the ``nn.Linear`` children that share them."""
    for child_key in module._aliases.values():
        state_dict.pop(prefix + child_key, None)


def _fill_children(module: _Recurrent, state_dict: dict[str, Tensor], prefix: str, *args: object) -> None:
    """Load pre-hook: the ``nn.Linear`` children's keys from torch's names (one tensor, two keys)."""
    for name, child_key in module._aliases.items():
        if prefix + name in state_dict:
            state_dict[prefix + child_key] = state_dict[prefix + name]


class _Recurrent(nn.Module):
    """Pairs of ``nn.Linear`` maps (input → G·H, hidden → G·H) whose parameters are also
    registered under torch's names; the cell's update is the subclass's :meth:`_update`."""

    gates: int      # G: gate blocks of the maps' outputs
    carries: int    # state tensors: 1 (h) or 2 (h, c)

    def __init__(self, input_size: int, hidden_size: int, bias: bool) -> None:
        super().__init__()
        self.input_size = _validate.positive_int("input_size", input_size)
        self.hidden_size = _validate.positive_int("hidden_size", hidden_size)
        self.bias = bool(bias)
        self._aliases: dict[str, str] = {}  # torch's name → the child's key
        self.register_state_dict_post_hook(_drop_children)
        self.register_load_state_dict_pre_hook(_fill_children)

    def _pair(self, suffix: str, input_size: int, device: Device, dtype: torch.dtype | None) -> None:
        """The maps ``ih{suffix}`` and ``hh{suffix}``, their parameters under torch's names
        ``weight_ih{suffix}``, ``weight_hh{suffix}``, ``bias_ih{suffix}``, ``bias_hh{suffix}``."""
        out = self.gates * self.hidden_size
        maps = {"ih": nn.Linear(input_size, out, self.bias, device, dtype),
                "hh": nn.Linear(self.hidden_size, out, self.bias, device, dtype)}
        for kind, linear in maps.items():
            self.add_module(f"{kind}{suffix}", linear)
        for attr in ("weight", "bias") if self.bias else ("weight",):
            for kind, linear in maps.items():
                self.register_parameter(f"{attr}_{kind}{suffix}", getattr(linear, attr))
                self._aliases[f"{attr}_{kind}{suffix}"] = f"{kind}{suffix}.{attr}"

    def reset_parameters(self) -> None:
        """Every parameter uniform in [−1/√H, 1/√H], as torch initialises its recurrent layers."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    def _update(self, gi: Tensor, gh: Tensor, state: State) -> State:
        raise NotImplementedError

    def _zeros(self, x: Tensor, batch: tuple[int, ...]) -> State:
        return tuple(x.new_zeros(*batch, self.hidden_size) for _ in range(self.carries))

    def _state(self, hx: Hidden, shape: tuple[int, ...]) -> State:
        """``hx`` (a tensor, or an LSTM's pair) as a state, each tensor of ``shape``."""
        state = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
        if len(state) != self.carries or any(not isinstance(s, Tensor) or s.shape != shape for s in state):
            what = "a pair (h_0, c_0) of tensors" if self.carries == 2 else "a tensor h_0"
            got = [tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__ for s in state]
            raise _validate.DpoptError(f"hx must be {what} of shape {shape}, got {got}")
        return state

    def _packed(self, state: State) -> Tensor | State:
        """The state as torch returns it: ``h`` or ``(h, c)``."""
        return state if self.carries == 2 else state[0]

    def _check_input(self, input: object, dims: tuple[int, int]) -> None:
        if isinstance(input, PackedSequence):
            name = type(self).__name__
            raise _validate.DpoptError(
                f"input is a PackedSequence, which dpopt.nn.{name} (one step, as torch's {name}) does not take: loop "
                f"over the steps yourself, or use dpopt.nn.{name.removesuffix('Cell')} with lengths=")
        if not isinstance(input, Tensor) or input.dim() not in dims or input.shape[-1] != self.input_size:
            shape = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise _validate.DpoptError(f"input of shape {shape} must have {dims[0]} or {dims[1]} dims, the last of "
                                       f"size input_size={self.input_size}")


class _LSTMUpdate:
    gates, carries = 4, 2

    def _update(self, gi: Tensor, gh: Tensor, state: State) -> State:
        i, f, g, o = (gi + gh).chunk(4, -1)
        c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class _GRUUpdate:
    gates, carries = 3, 1

    def _update(self, gi: Tensor, gh: Tensor, state: State) -> State:
        i_r, i_z, i_n = gi.chunk(3, -1)
        h_r, h_z, h_n = gh.chunk(3, -1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return ((1 - z) * n + z * state[0],)


class _RNNUpdate(_Recurrent):
    gates, carries = 1, 1
    nonlinearity: str

    def _update(self, gi: Tensor, gh: Tensor, state: State) -> State:
        return ((torch.tanh if self.nonlinearity == "tanh" else torch.relu)(gi + gh),)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.nonlinearity == "tanh" else f", nonlinearity={self.nonlinearity!r}")


def _nonlinearity(value: str) -> str:
    return _validate.one_of("nonlinearity", value, ("tanh", "relu"))


# ------------------------------------------------------------------------------------- cells


class _Cell(_Recurrent):
    """One step: ``forward(input [B, input_size] or [input_size], hx=None)`` → the new state
    (``h``, or ``(h, c)`` for an LSTM cell), zeros for a missing ``hx``."""

    ih: nn.Linear  # the maps of :meth:`_Recurrent._pair`, registered as children
    hh: nn.Linear

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, bias)
        self._pair("", input_size, device, dtype)
        self.reset_parameters()

    def forward(self, input: Tensor, hx: Hidden | None = None) -> Tensor | State:
        self._check_input(input, (1, 2))
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            state = self._zeros(x, (len(x),))
        else:
            state = self._state(hx, (len(x), self.hidden_size) if batched else (self.hidden_size,))
            state = tuple(s if batched else s.unsqueeze(0) for s in state)
        state = self._update(self.ih(x), self.hh(state[0]), state)
        return self._packed(tuple(s if batched else s.squeeze(0) for s in state))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_RNNUpdate, _Cell):
    """``nn.RNNCell``: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = _nonlinearity(nonlinearity)


class LSTMCell(_LSTMUpdate, _Cell):
    """``nn.LSTMCell``: returns ``(h', c')``."""


class GRUCell(_GRUUpdate, _Cell):
    """``nn.GRUCell``."""


# ---------------------------------------------------------------------------- stacked layers


class _Stack(_Recurrent):
    """``num_layers`` layers over a sequence: ``forward(input, hx=None, lengths=None,
    padding_side="right")`` → ``(output, h_n)`` (``(output, (h_n, c_n))`` for an LSTM), with
    torch's shapes: input ``[T, B, input_size]`` (``[B, T, input_size]`` if ``batch_first``,
    ``[T, input_size]`` unbatched) or a ``PackedSequence`` (output packed likewise), output
    ``[T, B, D·H]`` likewise, ``h_n`` ``[num_layers·D, B, H]`` (D = 2 if bidirectional);
    ``lengths``: each record's real steps (module docstring)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, bias)
        self.num_layers = _validate.positive_int("num_layers", num_layers)
        self.batch_first, self.bidirectional = bool(batch_first), bool(bidirectional)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise _validate.DpoptError(f"dropout={dropout!r} must be a number in [0, 1]")
        self.dropout = float(dropout)
        directions = 2 if self.bidirectional else 1
        for layer in range(self.num_layers):
            for direction in range(directions):
                self._pair(self._suffix(layer, direction), input_size if layer == 0 else directions * hidden_size,
                           device, dtype)
        self.reset_parameters()

    @staticmethod
    def _suffix(layer: int, direction: int) -> str:
        return f"_l{layer}" + ("_reverse" if direction else "")

    def forward(self, input: Tensor | PackedSequence, hx: Hidden | None = None, lengths: Tensor | None = None,
                padding_side: str = "right") -> tuple[Tensor | PackedSequence, Tensor | State]:
        if isinstance(input, PackedSequence):
            if lengths is not None or padding_side != "right":
                raise _validate.DpoptError("lengths= and padding_side= describe a padded tensor input; a "
                                           "PackedSequence holds its own lengths")
            _unbatched(input)
            padded, lengths = pad_packed_sequence(input, batch_first=self.batch_first)
            output, last = self.forward(padded, hx, lengths)
            assert isinstance(output, Tensor)  # (of a tensor input)
            return _packed_like(output, lengths, self.batch_first, input), last
        self._check_input(input, (2, 3))
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(0 if self.batch_first else 1)
        x = x if self.batch_first else x.transpose(0, 1)  # [B, T, p]
        if lengths is None and records.may_be_padded():
            raise _validate.DpoptError(
                f"dpopt.nn.{type(self).__name__} got no lengths= while dpopt runs it on records collated by the "
                "DataLoader's collate_fn, which may pad each chunk to its longest record (so a record's padding "
                "depends on the records beside it, and the layer would run over it): pass lengths=, each record's "
                "number of real steps (e.g. (tokens != pad).sum(1)), so that its outputs and final state ignore the "
                "padding")
        steps = padding.steps(lengths, padding_side, x, batched)
        directions = 2 if self.bidirectional else 1
        B = x.shape[0]
        if hx is None:
            initial = self._zeros(x, (self.num_layers * directions, B))
        else:
            initial = self._state(hx, (self.num_layers * directions, *((B,) if batched else ()), self.hidden_size))
            initial = tuple(s if batched else s.unsqueeze(1) for s in initial)
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                output, final = self._direction(self._suffix(layer, direction), x, tuple(s[k] for s in initial),
                                                steps, bool(direction))
                outputs.append(output)
                finals.append(final)
            x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        output = x if self.batch_first else x.transpose(0, 1)
        last = tuple(torch.stack(parts) for parts in zip(*finals))
        if not batched:
            output, last = output.squeeze(0 if self.batch_first else 1), tuple(s.squeeze(1) for s in last)
        return output, self._packed(last)

    def _direction(self, suffix: str, x: Tensor, initial: State, steps: padding.Full | padding.Padded,
                   reverse: bool) -> tuple[Tensor, State]:
        """One direction (``reverse`` or not) of the layer of ``suffix`` over ``x`` ``[B, T, p]`` from
        ``initial``: its outputs ``[B, T, H]`` and its final state, each record's from its own steps."""
        gi = getattr(self, f"ih{suffix}")(steps.arrange(x, reverse))
        hh, state, states = getattr(self, f"hh{suffix}"), initial, []
        for t in steps.times(x.shape[1], reverse):
            state = self._update(gi[:, t], hh(state[0]), state)
            states.append(state)
        return steps.finish(states, initial, reverse)

    def extra_repr(self) -> str:
        options = {"num_layers": (self.num_layers, 1), "bias": (self.bias, True),
                   "batch_first": (self.batch_first, False), "dropout": (self.dropout, 0.0),
                   "bidirectional": (self.bidirectional, False)}
        return ", ".join([f"{self.input_size}, {self.hidden_size}",
                          *(f"{name}={value}" for name, (value, default) in options.items() if value != default)])


class RNN(_RNNUpdate, _Stack):
    """``nn.RNN``: ``h_t = act(W_ih x_t + b_ih + W_hh h_{t−1} + b_hh)``, act = ``nonlinearity``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device,
                         dtype)
        self.nonlinearity = _nonlinearity(nonlinearity)


class LSTM(_LSTMUpdate, _Stack):
    """``nn.LSTM`` (without ``proj_size``): returns ``(output, (h_n, c_n))``."""


class GRU(_GRUUpdate, _Stack):
    """``nn.GRU``."""


def _unbatched(packed: PackedSequence) -> None:
    """Refuse a PackedSequence made inside ``torch.func.vmap`` (its batch sizes cannot be read)."""
    try:
        packed.batch_sizes.tolist()
    except RuntimeError as error:
        raise _validate.DpoptError(
            "input is a PackedSequence packed inside dpopt's per-record run (torch.func.vmap), which cannot work: a "
            "packed record's data has the record's own length, so records of different lengths cannot be batched "
            "(torch's pack_padded_sequence has no vmap rule, and fails with 'stack expects each tensor to be equal "
            "size'); give the padded tensor and lengths= instead") from error


def _packed_like(output: Tensor, lengths: Tensor, batch_first: bool, like: PackedSequence) -> PackedSequence:
    """The padded ``output`` packed as ``like`` is (its batch sizes and orders), as torch returns it."""
    order = like.sorted_indices
    dim = 0 if batch_first else 1
    sorted_output = output if order is None else output.index_select(dim, order)
    data = pack_padded_sequence(sorted_output, lengths if order is None else lengths[order.cpu()],
                                batch_first=batch_first).data
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


#: torch's recurrent module type → dpopt's.
REPLACEMENTS: dict[type[nn.Module], type[_Recurrent]] = {
    nn.RNN: RNN, nn.LSTM: LSTM, nn.GRU: GRU, nn.RNNCell: RNNCell, nn.LSTMCell: LSTMCell, nn.GRUCell: GRUCell}


def from_torch(module: nn.Module) -> _Recurrent:
    """dpopt's module computing what torch's ``module`` computes: the same settings, dtype,
    device, training mode, parameters (copied) and ``requires_grad`` flags."""
    kind = REPLACEMENTS.get(type(module))
    if kind is None:
        raise _validate.DpoptError(f"module={type(module).__name__} has no dpopt.nn replacement (one of "
                                   f"{', '.join(cls.__name__ for cls in REPLACEMENTS)} is needed)")
    if isinstance(module, nn.RNNBase) and module.proj_size:  # (an LSTM's; 0 for the others)
        raise _validate.DpoptError(f"proj_size={module.proj_size}: dpopt.nn.LSTM has no projection; use an "
                                   "nn.Linear on its output instead")
    assert isinstance(module, (nn.RNNBase, nn.RNNCellBase))  # (the keys of REPLACEMENTS)
    first = next(module.parameters())
    settings: dict[str, Any] = {"bias": module.bias, "device": first.device, "dtype": first.dtype}
    if isinstance(module, nn.RNNBase):
        settings |= {"num_layers": module.num_layers, "batch_first": module.batch_first,
                     "dropout": module.dropout, "bidirectional": module.bidirectional}
    if isinstance(module, (nn.RNN, nn.RNNCell)):
        settings["nonlinearity"] = module.nonlinearity
    ours = kind(module.input_size, module.hidden_size, **settings)
    ours.load_state_dict(module.state_dict())
    flags = {name: p.requires_grad for name, p in module.named_parameters()}
    for name, p in ours.named_parameters():
        p.requires_grad_(flags[name])
    return ours.train(module.training)
