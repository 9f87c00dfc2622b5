"""Tests for flashcore_cli/measure/triton_attention.py (the Triton FlashAttention reference row).

CPU (run in CI):
  * the module imports with neither triton nor torch importable, imports neither itself, and says why
    it is unavailable;
  * when triton is installed: the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, in a
    subprocess so the flag never leaks into this process) on tiny shapes, causal and not, and with every
    autotune tile forced in turn, against an fp32 reference.
GPU (@pytest.mark.gpu, skipped without CUDA): the autotuned kernel at (1,8,512,64) and (2,3,1000,128),
causal and not, and every tile of the autotune space forced in turn.

Pass rule (flash-attention's): max abs error vs the fp32 reference <= max(1e-3, 2 x the error an fp16
math-path attention makes against that same reference).
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE_PATH = ROOT / "flashcore_cli" / "measure" / "triton_attention.py"
ATOL = 1e-3

# Shared by the interpreter subprocess (exec'd there) and the GPU tests (exec'd here): one definition
# of the references and the pass rule.
_HELPERS = r'''
import math

def attention_ref(q, k, v, causal, scale, dtype):
    """softmax(scale q k^T [causal]) v with every step in `dtype` (fp32: the reference; fp16: the math path)."""
    import torch
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v

def judge(out, q, k, v, causal, scale, atol=1e-3):
    """(max abs error, tolerance, first mismatches as text) of out against the fp32 reference."""
    import torch
    ref = attention_ref(q, k, v, causal, scale, torch.float32)
    err16 = (attention_ref(q, k, v, causal, scale, torch.float16).float() - ref).abs().max().item()
    diff = (out.float() - ref).abs()
    err = diff.max().item() if diff.numel() else 0.0
    if torch.isnan(out).any():
        err = float("nan")
    tol = max(atol, 2.0 * err16)
    lines = []
    if not (err <= tol):
        bad = (~(diff <= tol)).nonzero()[:5].tolist()
        for b, h, s_, d in bad:
            lines.append(f"  (b={b}, h={h}, s={s_}, d={d}): got {out[b, h, s_, d].item():.6f} "
                         f"want {ref[b, h, s_, d].item():.6f}")
    return err, tol, "\n".join(lines)
'''

_ns = {}
exec(_HELPERS, _ns)
attention_ref = _ns["attention_ref"]
judge = _ns["judge"]


def _require(name):
    """Skip when `name` does not import (missing, or installed but broken); return the module."""
    try:
        return __import__(name)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not here"
        pytest.skip(f"{name} is not importable ({type(exc).__name__}: {exc})")


def _env_with_root(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------- CPU


def test_imports_without_triton_or_torch():
    """The CLI imports this module lazily and `flashcore --help` must stay fast: no triton, no torch needed."""
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.modules["triton"] = None   # makes `import triton` raise ImportError
        sys.modules["torch"] = None
        spec = importlib.util.spec_from_file_location("fc_triton_attention", {str(MODULE_PATH)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.available() is False
        assert mod.tuned_config() == ""  # nothing tuned, nothing to report
        reason = mod.unavailable_reason()
        assert "triton" in reason, reason
        try:
            mod.triton_attention(None, None, None)
        except RuntimeError as exc:
            assert "triton" in str(exc), exc
        else:
            raise AssertionError("triton_attention ran without triton")
        print("OK", reason)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=_env_with_root())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")


def test_import_does_not_import_torch():
    script = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("fc_triton_attention", {str(MODULE_PATH)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print("torch" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=_env_with_root())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "False", "importing triton_attention imported torch"


# Cases run under the interpreter: (id, shape, causal, scale or None, tile or None). A tile of None goes
# through triton_attention() itself (its fixed interpreter tile); a tile forces one entry of CONFIGS
# through the same kernel, so the masking logic of every tile the GPU may pick is checked here too.
_INTERP_SHAPES = [(1, 2, 17, 16), (2, 1, 33, 32)]
_TILE_SHAPE = (1, 1, 129, 64)  # 129: a partial tail block and several diagonal blocks for every tile

_INTERP_SCRIPT = _HELPERS + r'''
import json, sys, zlib
import torch
from flashcore_cli import triton_attention as ta

assert ta._interpreting(), "TRITON_INTERPRET=1 did not reach triton"
cases = json.loads(sys.argv[1])
results = {}
for case_id, shape, causal, scale, tile in cases:
    g = torch.Generator().manual_seed(zlib.crc32(case_id.encode()))
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float32).to(torch.float16) for _ in range(3))
    saved = [t.clone() for t in (q, k, v)]
    try:
        if tile is None:
            out = ta.triton_attention(q, k, v, causal=causal, scale=scale)
        else:
            out = ta._launch(q, k, v, causal, scale, tuple(tile))
    except Exception as exc:
        results[case_id] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    sc = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
    err, tol, detail = judge(out, q, k, v, causal, sc)
    results[case_id] = {
        "err": err, "tol": tol, "detail": detail,
        "shape_ok": tuple(out.shape) == tuple(shape) and out.dtype == torch.float16,
        "inputs_ok": all(torch.equal(a, b) for a, b in zip(saved, (q, k, v))),
    }
print("RESULTS " + json.dumps(results))
'''


def _interp_cases():
    cases = []
    for shape in _INTERP_SHAPES:
        for causal in (False, True):
            cases.append(("x".join(map(str, shape)) + ("-causal" if causal else ""), shape, causal, None, None))
    cases.append(("1x1x1x16-causal", (1, 1, 1, 16), True, None, None))
    cases.append(("1x2x17x16-scale0.3", (1, 2, 17, 16), False, 0.3, None))
    cases.append(("1x2x17x16-causal-scale-0.5", (1, 2, 17, 16), True, -0.5, None))
    cases.append(("1x2x17x16-causal-scale0", (1, 2, 17, 16), True, 0.0, None))
    return cases


def _tile_cases():
    # CONFIGS is read from the module file without importing it (this process may lack triton/torch)
    import ast
    tree = ast.parse(MODULE_PATH.read_text())
    configs = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CONFIGS" for t in node.targets):
            configs = ast.literal_eval(node.value)
    assert configs, "CONFIGS not found in triton_attention.py"
    cases = []
    for tile in configs:
        for causal in (False, True):
            cid = "tile{}x{}w{}s{}".format(*tile) + ("-causal" if causal else "")
            cases.append((cid, _TILE_SHAPE, causal, None, list(tile)))
    return cases


_ALL_INTERP_CASES = _interp_cases() + _tile_cases()


@pytest.fixture(scope="module")
def interp_results():
    _require("torch")
    _require("triton")
    proc = subprocess.run(
        [sys.executable, "-c", _INTERP_SCRIPT, json.dumps(_ALL_INTERP_CASES)],
        capture_output=True, text=True, timeout=600, cwd=str(ROOT),
        env=_env_with_root(TRITON_INTERPRET="1"),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"interpreter run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("case", _ALL_INTERP_CASES, ids=[c[0] for c in _ALL_INTERP_CASES])
def test_interpreter_matches_fp32_reference(interp_results, case):
    r = interp_results[case[0]]
    assert "error" not in r, r.get("error")
    assert r["shape_ok"], "output shape/dtype differ from q's"
    assert r["inputs_ok"], "inputs were modified"
    assert r["err"] <= r["tol"], f"max abs error {r['err']:.3g} > tolerance {r['tol']:.3g}\n{r['detail']}"


# --------------------------------------------------------------------------------------------- GPU


def _gpu_module():
    torch = _require("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _require("triton")
    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no"):
        pytest.skip("TRITON_INTERPRET is set; the GPU tests need compiled kernels")
    from flashcore_cli import triton_attention as ta

    if not ta.available():
        pytest.skip(ta.unavailable_reason())
    return torch, ta


def _inputs(torch, shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, generator=g, device="cuda", dtype=torch.float16) for _ in range(3)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 8, 512, 64), (2, 3, 1000, 128)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_autotuned_matches_fp32_reference(shape, causal):
    torch, ta = _gpu_module()
    q, k, v = _inputs(torch, shape, seed=sum(shape) + causal)
    saved = [t.clone() for t in (q, k, v)]
    out = ta.triton_attention(q, k, v, causal=causal)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == torch.float16 and out.is_cuda
    assert not torch.isnan(out).any(), "NaN in output"
    assert all(torch.equal(a, b) for a, b in zip(saved, (q, k, v))), "inputs were modified"
    err, tol, detail = judge(out, q, k, v, causal, 1.0 / math.sqrt(shape[-1]), ATOL)
    assert err <= tol, f"max abs error {err:.3g} > tolerance {tol:.3g}\n{detail}"
    # a second call reuses the tuned config and must give the same bits
    again = ta.triton_attention(q, k, v, causal=causal)
    assert torch.equal(out, again), "two calls on the same inputs differ"


@pytest.mark.gpu
def test_gpu_best_config_reported():
    torch, ta = _gpu_module()
    q, k, v = _inputs(torch, (1, 8, 512, 64), seed=7)
    ta.triton_attention(q, k, v, causal=False)
    cfg = ta.best_config(512, 64, False, 8)
    assert cfg is not None and (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) in ta.CONFIGS


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_every_tile_matches_fp32_reference(causal):
    """Autotuning runs only the fastest tile afterwards; check all of them so none is silently wrong."""
    torch, ta = _gpu_module()
    from triton.runtime.errors import OutOfResources

    shape = (1, 2, 1000, 64)
    q, k, v = _inputs(torch, shape, seed=11 + causal)
    failures, skipped = [], []
    for tile in ta.CONFIGS:
        try:
            out = ta._launch(q, k, v, causal, None, tile)
            torch.cuda.synchronize()
        except OutOfResources as exc:  # e.g. a small-smem GPU
            skipped.append(f"{tile}: {exc}")
            continue
        if torch.isnan(out).any():
            failures.append(f"{tile}: NaN in output")
            continue
        err, tol, detail = judge(out, q, k, v, causal, 1.0 / math.sqrt(shape[-1]), ATOL)
        if not err <= tol:
            failures.append(f"{tile}: max abs error {err:.3g} > {tol:.3g}\n{detail}")
    assert not failures, "\n".join(failures)
    assert len(skipped) < len(ta.CONFIGS), "every tile ran out of resources:\n" + "\n".join(skipped)
