"""What the reproductions (:mod:`dpopt.experiments`) and the bench (:mod:`dpopt.bench`) both
stand on: the :class:`Pool` their jobs run in and the :class:`Saved` files that keep them
(:mod:`.pool`), the declared preparation of a problem's data (:mod:`.preparation`), and the
statistics of their reports (:mod:`.statistics`)."""

from .pool import Job, Pool, Saved, made_for, running, source_digest
from .statistics import one_sided_p

__all__ = ["Job", "Pool", "Saved", "made_for", "one_sided_p", "running", "source_digest"]
