import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the gpu-marked tests on the lent GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def nvcc():
    from flashcore_cli.toolchain import find_nvcc
    from flashcore_cli.errors import FlashcoreError

    try:
        return find_nvcc()
    except FlashcoreError:
        pytest.skip("nvcc is not installed")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache of this test's own, so compiles are real, never another run's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLASHCORE_CACHE", str(cache))
    return cache
