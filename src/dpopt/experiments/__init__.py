"""Frozen presets of each paper experiment, and ``reproduce(name)``."""

from __future__ import annotations

from . import dp_srm_ijcnn1
from .reproduce import reproduce  # noqa: E402

EXPERIMENTS = {dp_srm_ijcnn1.NAME: dp_srm_ijcnn1}

__all__ = ["EXPERIMENTS", "reproduce"]
