"""dpopt's cache folder: what it computes once and keeps, from public operations only (e.g. the
scattering features of a data set, :func:`dpopt.scattering.features`).

``$DPOPT_CACHE`` if set, else the user's cache folder (``platformdirs.user_cache_dir("dpopt")``).
Deleting it loses nothing but time.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def folder() -> Path:
    """``$DPOPT_CACHE``, else ``<user cache dir>/dpopt``."""
    env = os.environ.get("DPOPT_CACHE")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("dpopt"))
