"""Frozen presets of each paper experiment, and ``reproduce(name)``."""

from __future__ import annotations

from . import aclip, aclip_cifar10, diff2, dp_srm_ijcnn1
from .reproduce import reproduce  # noqa: E402

EXPERIMENTS = {dp_srm_ijcnn1.NAME: dp_srm_ijcnn1, aclip.SYNTHETIC.NAME: aclip.SYNTHETIC, aclip.REAL.NAME: aclip.REAL,
               aclip_cifar10.CIFAR.NAME: aclip_cifar10.CIFAR, diff2.REGRESSION_PRESET.NAME: diff2.REGRESSION_PRESET,
               diff2.CLASSIFICATION_PRESET.NAME: diff2.CLASSIFICATION_PRESET}

__all__ = ["EXPERIMENTS", "reproduce"]
