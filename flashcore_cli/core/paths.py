"""Where things are: the cache, and the installed parts (the default registry and kernels/). Its own module,
importing nothing heavy, because the `flashcore` entry point reads it before anything else is imported
(entry.py: a cached --help screen)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FLASHCORE_CACHE"
REGISTRY_FILE = "variants.yaml"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # flashcore_cli/


# The cache (builds, tuned parameters, harness extensions, crash logs, help screens): $FLASHCORE_CACHE or
# ~/.cache/flashcore.
def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "flashcore"


def _install_root() -> Path:
    """The folder holding the default registry (variants.yaml) and kernels/ (the contract, the binding, every
    shipped kernel): a wheel's copy inside the package (flashcore_cli/_data, written by setup.py), else the
    checkout the package is imported from (an editable install, or PYTHONPATH)."""
    shipped = PACKAGE_DIR / "_data"
    return shipped if (shipped / REGISTRY_FILE).is_file() else PACKAGE_DIR.parent


INSTALL_ROOT = _install_root()
INSTALLED_REGISTRY = INSTALL_ROOT / REGISTRY_FILE
INSTALLED_KERNELS = INSTALL_ROOT / "kernels"
