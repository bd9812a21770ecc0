"""Which time steps of each record of a padded batch ``[B, T, ...]`` are its own, and the order in
which one direction of a recurrent layer visits them.

A direction runs its loop over T steps of a sequence arranged so that the record's real steps
come first, in the direction's order, and its padding after them: the state after step
``L_b − 1`` (L_b = record b's length) has seen exactly the record's steps, from the initial state,
and nothing the loop computes after it is read. Per direction and padding side, the position
visited at step s (for s < L_b; the padding fills the steps after, in any order):

* forward, right padding (real steps first): s (the sequence as it is);
* reverse, right padding: L_b − 1 − s (reversed within the record's length);
* forward, left padding (real steps last): s + T − L_b;
* reverse, left padding: T − 1 − s (the whole sequence reversed).

The outputs go back to their positions (the inverse permutation), zero at padded positions, as
torch's ``pad_packed_sequence`` gives them; the final state is the state after step L_b − 1 (a
``gather`` at that index), the initial state for L_b = 0. Every index is a tensor computed from
``lengths`` (no Python branching on its values), so a record run alone under ``torch.func.vmap``
(dpopt's per-record engines) computes the same as in a batch. Gradients are exact: the steps
after L_b − 1 reach neither an output nor the final state, so their gradients are zero, and a
``nn.Linear`` map's per-record sum over its calls (the ghost engine's rule) adds exactly the
record's own steps.

:class:`Full` is the batch without padding (every step real): the loop runs the sequence
forward or backward, with no index at all (what the layers did before lengths existed).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _validate

SIDES = ("right", "left")


class Full:
    """Every step of every record is real."""

    def arrange(self, x: Tensor, reverse: bool) -> Tensor:
        """The input in the order the loop reads it (the loop walks :meth:`times`)."""
        return x

    def times(self, T: int, reverse: bool) -> range:
        return range(T - 1, -1, -1) if reverse else range(T)

    def finish(self, states: list[tuple[Tensor, ...]], initial: tuple[Tensor, ...], reverse: bool
               ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """From the loop's states (after each of its steps): the outputs at their positions
        ``[B, T, H]``, and the final state (after the last step)."""
        hs = [state[0] for state in states]
        return torch.stack(hs[::-1] if reverse else hs, 1), states[-1]


class Padded:
    """Record b's real steps are its first ``lengths[b]`` (``side="right"``) or its last
    (``"left"``) of T; ``lengths`` ``[B]`` is clamped to [0, T]."""

    def __init__(self, lengths: Tensor, T: int, side: str) -> None:
        self.T, self.side = T, side
        self.L = lengths.clamp(0, T).unsqueeze(1)  # [B, 1]
        self.t = torch.arange(T, device=lengths.device)  # [T]
        self.real = self.t < self.L if side == "right" else self.t >= T - self.L  # [B, T]

    def _order(self, reverse: bool) -> Tensor | None:
        """``[B, T]``: the position the loop reads at each step (None: each step its own)."""
        t, L, T = self.t, self.L, self.T
        if self.side == "right":
            return torch.where(t < L, L - 1 - t, t) if reverse else None
        return (T - 1 - t).expand_as(self.real) if reverse else torch.where(t < L, t + T - L, t - L)

    def _inverse(self, reverse: bool) -> Tensor | None:
        """``[B, T]``: the step at which the loop read each position (:meth:`_order`'s inverse)."""
        if self.side == "left" and not reverse:
            t, L, T = self.t, self.L, self.T
            return torch.where(t >= T - L, t - (T - L), t + L)
        return self._order(reverse)  # (the other orders are their own inverses)

    def arrange(self, x: Tensor, reverse: bool) -> Tensor:
        order = self._order(reverse)
        return x if order is None else x.take_along_dim(order.unsqueeze(-1), 1)

    def times(self, T: int, reverse: bool) -> range:
        return range(T)

    def finish(self, states: list[tuple[Tensor, ...]], initial: tuple[Tensor, ...], reverse: bool
               ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The outputs at their positions, zero at the padding, and the state after step L_b − 1
        of each record (its initial state if L_b = 0)."""
        sequences = [torch.stack(seq, 1) for seq in zip(*states)]  # each carry's [B, T, H]
        out, inverse = sequences[0], self._inverse(reverse)
        out = out if inverse is None else out.take_along_dim(inverse.unsqueeze(-1), 1)
        at = (self.L - 1).clamp(min=0).unsqueeze(-1)  # [B, 1, 1]
        final = tuple(torch.where(self.L > 0, seq.take_along_dim(at, 1).squeeze(1), h0)
                      for seq, h0 in zip(sequences, initial))
        return torch.where(self.real.unsqueeze(-1), out, 0.0), final


def steps(lengths: object, side: str, x: Tensor, batched: bool) -> Full | Padded:
    """The steps of the records of ``x`` ``[B, T, ...]`` (one record, B = 1, if not ``batched``)
    padded on ``side``, given ``lengths`` (None: every step is real).

    ``lengths``: an integer tensor (or a list of ints) of shape ``(B,)`` (``()`` unbatched). Its
    values must lie in [1, T], checked where they can be read; inside ``torch.func.vmap`` they
    cannot (reading a value is data-dependent control flow), and a value outside is clamped to
    [0, T] (a length of 0: zero outputs, the initial state as the final one)."""
    side = _validate.one_of("padding_side", side, SIDES)
    if lengths is None:
        return Full()
    shape, T = (len(x),) if batched else (), x.shape[1]
    if isinstance(lengths, (list, tuple)):
        lengths = torch.as_tensor(lengths)
    if not (isinstance(lengths, Tensor) and not lengths.is_floating_point() and not lengths.is_complex()
            and lengths.dtype != torch.bool and tuple(lengths.shape) == shape):
        got = f"{lengths.dtype} of shape {tuple(lengths.shape)}" if isinstance(lengths, Tensor) else \
            type(lengths).__name__
        raise _validate.DpoptError(f"lengths must be an integer tensor of shape {shape} (each record's number of real "
                                   f"steps), got {got}")
    try:
        low, high = int(lengths.min()), int(lengths.max())
    except RuntimeError:  # under vmap: the values cannot be read (clamped, as said above)
        low, high = 1, T
    if low < 1 or high > T:
        raise _validate.DpoptError(f"lengths must lie in [1, {T}] (the padded length), got values from {low} to {high}")
    return Padded(lengths.reshape(-1).to(x.device, torch.int64), T, side)
