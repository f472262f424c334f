"""Where specprim keeps what it converts, builds and compiles: one directory, read from the environment on every
call (the lowest layer: it imports nothing of the package)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECPRIM_CACHE"


def cache_dir() -> Path:
    """The directory holding converted embedded models: ``$SPECPRIM_CACHE``, else ``~/.cache/specprim``.

    Read from the environment on every call; the directory is created only when a model is converted.
    """
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "specprim"
