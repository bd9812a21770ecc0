"""Small parameter-free layers that act on each record on its own, known to the ghost engine."""

from __future__ import annotations

from torch import Tensor, nn


class SqueezeLast(nn.Module):
    """``[B, 1] → [B]``: each record's one output as a scalar (a regression network's last layer).

    ``nn.Flatten(0)`` computes the same values but flattens across the records' axis, so the ghost
    engine must run it record by record (it cannot know the trailing size is 1); this layer only
    removes the trailing axis of size 1 and is called on the whole batch."""

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != 1:
            raise ValueError(f"SqueezeLast needs a trailing axis of size 1, got input of shape {tuple(x.shape)}")
        return x.squeeze(-1)
