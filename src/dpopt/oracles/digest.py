"""A digest of an oracle's training data: what tells a checkpoint of one data set from another."""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def sha256_of(*tensors: Tensor) -> str:
    """Hex sha256 over each tensor's dtype, shape and bytes, in order (one pass over the data)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()
