"""Where the cache is. Its own module, importing nothing heavy, because the `flashcore` entry point reads it
before anything else is imported (entry.py: a cached --help screen)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FLASHCORE_CACHE"


# The cache (builds, tuned parameters, harness extensions, crash logs, help screens): $FLASHCORE_CACHE or
# ~/.cache/flashcore.
def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "flashcore"
