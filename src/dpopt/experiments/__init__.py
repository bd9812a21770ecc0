"""Frozen presets of each paper experiment, and ``reproduce(name)``."""

from __future__ import annotations

from . import aclip, dp_srm_ijcnn1
from .reproduce import reproduce  # noqa: E402

EXPERIMENTS = {dp_srm_ijcnn1.NAME: dp_srm_ijcnn1, aclip.SYNTHETIC.NAME: aclip.SYNTHETIC, aclip.REAL.NAME: aclip.REAL}

__all__ = ["EXPERIMENTS", "reproduce"]
