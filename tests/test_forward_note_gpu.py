"""flashcore_forward_note on the GPU: a launcher that ran the kernel its plan prefers says nothing (None), and a
rung that does not define the function gets the contract's default (None). The substitution itself (v11's
cp.async kernel when the driver cannot make the TMA kernel's tensor maps) is not reachable from valid inputs
here; how its note reaches the bench row is tested on the CPU (test_bench_reference_detail.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name, head_dim", [("v11", 64), ("v11", 128), ("v8", 64)])
def test_no_substitution_no_note(name, head_dim):
    import torch

    from flashcore_cli import load_variant

    attn = load_variant(name)
    q, k, v = (torch.randn(1, 8, 512, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    attn(q, k, v)
    torch.cuda.synchronize()
    assert attn.forward_note() is None
