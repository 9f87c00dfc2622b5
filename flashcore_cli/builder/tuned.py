"""Tuned parameters per GPU: `flashcore tune` stores the winning -D values for a variant on a GPU model,
and every build of that variant on that GPU uses them (on top of the registry's defines).

    <cache>/tuned/<variant>/<gpu-slug>.json   {"variant", "gpu", "defines": {NAME: value}, "record": ...}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from flashcore_cli.core.records import cache_root


def gpu_slug(gpu_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower()


def tuned_path(variant: str, gpu_name: str) -> Path:
    return cache_root() / "tuned" / variant / f"{gpu_slug(gpu_name)}.json"


def tuned_defines(variant: str, gpu_name: str | None) -> dict[str, str]:
    if not gpu_name:
        return {}
    path = tuned_path(variant, gpu_name)
    if not path.is_file():
        return {}
    return {k: str(v) for k, v in json.loads(path.read_text()).get("defines", {}).items()}


def has_tuned(variant: str) -> bool:
    """Whether a winner is stored for the variant on any GPU (no torch, no CUDA)."""
    folder = cache_root() / "tuned" / variant
    return folder.is_dir() and any(folder.glob("*.json"))


def tuned_defines_here(variant: str) -> dict[str, str]:
    """The stored winner for this process's GPU. Asks torch for the GPU's name (which initialises CUDA, a
    second or more) only when some winner is stored for the variant: a plain build never pays for it."""
    return tuned_defines(variant, current_gpu_name()) if has_tuned(variant) else {}


def store_tuned(variant: str, gpu_name: str, defines: dict[str, str], record: dict) -> Path:
    path = tuned_path(variant, gpu_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"variant": variant, "gpu": gpu_name, "defines": defines, "record": record}, indent=1))
    return path


def current_gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None
