"""Frozen presets of each paper experiment, and ``reproduce(name)``."""

from __future__ import annotations

from . import aclip, aclip_cifar10, diff2, dp_srm_cnn, dp_srm_ijcnn1, mnist_sota, o2nc_nonsmooth, o2nc_sweep
from .reproduce import reproduce  # noqa: E402

EXPERIMENTS = {dp_srm_ijcnn1.NAME: dp_srm_ijcnn1.PRESET, aclip.SYNTHETIC.NAME: aclip.SYNTHETIC,
               aclip.REAL.NAME: aclip.REAL,
               aclip_cifar10.CIFAR.NAME: aclip_cifar10.CIFAR, dp_srm_cnn.MNIST.NAME: dp_srm_cnn.MNIST,
               dp_srm_cnn.CIFAR10.NAME: dp_srm_cnn.CIFAR10, o2nc_nonsmooth.NAME: o2nc_nonsmooth.PRESET,
               o2nc_sweep.NAME: o2nc_sweep.PRESET,
               diff2.REGRESSION_PRESET.NAME: diff2.REGRESSION_PRESET,
               diff2.CLASSIFICATION_PRESET.NAME: diff2.CLASSIFICATION_PRESET, mnist_sota.NAME: mnist_sota.PRESET}

__all__ = ["EXPERIMENTS", "reproduce"]
