"""Reference rows timed beside the variants: PyTorch SDPA (its default and each backend the GPU runs)
and the project's own Triton FlashAttention forward; and the environment a bench record carries."""

from __future__ import annotations

import platform
import shutil
import subprocess

SDPA_DEFAULT = "sdpa"


def reference_functions(q, k, v, causal: bool):
    """(name, zero-argument callable or None, context manager to time it in, reason when None)."""
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    rows = [(SDPA_DEFAULT, sdpa, contextlib.nullcontext(), "")]
    for label, backend in (
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        ("sdpa-math", SDPBackend.MATH),
    ):
        # the backend is pinned around the whole timing loop, not inside each timed call
        rows.append((label, sdpa, sdpa_kernel([backend]), ""))

    try:
        from flashcore_cli import triton_attention
    except ImportError as exc:
        rows.append(("triton", None, None, f"the Triton reference could not be imported: {exc}"))
        return rows
    if triton_attention.available():
        rows.append(("triton", lambda: triton_attention.triton_attention(q, k, v, causal=causal), contextlib.nullcontext(), ""))
    else:
        rows.append(("triton", None, None, triton_attention.unavailable_reason()))
    return rows


def nvidia_smi(fields: str) -> dict:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [x.strip() for x in out.split(",")]
    names = fields.split(",")
    return dict(zip(names, values)) if len(values) == len(names) else {}


def clocks() -> dict:
    return nvidia_smi("clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw")


def environment() -> dict:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env = {
        "gpu": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "sms": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "driver": nvidia_smi("driver_version").get("driver_version"),
        "clocks": clocks(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env
