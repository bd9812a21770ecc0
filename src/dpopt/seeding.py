"""Where a run's randomness comes from: its sampling generator and its release noise, derived from
a user's seed (reproducible; the guarantee then rests on the seed staying secret) or from the
operating system (docs/design.md rule 4), and the sentence a run's outputs say it with."""

from __future__ import annotations

import os

import numpy as np
import torch

from . import _validate
from .base import NoiseSource
from .mechanisms import SeededNoise

SEEDED = "seeded by the user: the run is reproducible and its guarantee rests on the seed staying secret"
FROM_OS = "seeded from the operating system (secret; saved in checkpoints, which are secret too)"
SYSTEM = "release noise from the operating system's CSPRNG"


class OsSeed(int):
    """A seed drawn from the operating system (secret) and handed on as a seed, e.g. by the first
    process of a data-parallel run to every other (:func:`dpopt.distributed.shared_secret_seed`):
    a run derives its generators from it as from a user's seed, and says that its randomness comes
    from the operating system (:func:`origin`)."""


def origin(seed: int | None) -> str:
    """Where the randomness of a run or tuning with ``seed`` comes from: :data:`SEEDED` for a user's
    seed, :data:`FROM_OS` for None (drawn from the operating system) or an :class:`OsSeed`."""
    return FROM_OS if seed is None or isinstance(seed, OsSeed) else SEEDED


def randomness(seed: int | None, noise_source: NoiseSource | None = None) -> tuple[torch.Generator, NoiseSource, str]:
    """The run's sampling generator, noise source and the sentence saying where they come from.

    With ``seed``, both are derived from it (reproducible). Without, from the operating system:
    a predictable seed would let anyone who reruns the public configuration subtract the noise
    and replay the Poisson sample that amplification by sampling assumes secret."""
    if seed is not None:
        _validate.non_negative("seed", seed)
    root = np.random.SeedSequence(seed if seed is not None else int.from_bytes(os.urandom(16), "little"))
    sample_seed, noise_seed = root.generate_state(2, dtype=np.uint64)
    sample_gen = torch.Generator().manual_seed(int(sample_seed))
    if noise_source is not None:
        batches = "the operating system" if origin(seed) == FROM_OS else "the user's seed, which must stay secret"
        return sample_gen, noise_source, f"{SYSTEM}; batches sampled from {batches}"
    return sample_gen, SeededNoise(int(noise_seed)), origin(seed)
