"""ptxas parsing and occupancy on captured output, and a real compile of every registered kernel."""

import json

import pytest
from typer.testing import CliRunner

from flashcore_cli.registry.archs import ARCHS
from flashcore_cli.cli import app
from flashcore_cli.builder.ptxas import KernelResources, occupancy, parse_ptxas

CAPTURED = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6v8_fwdILi64EEv15FlashcoreParams' for 'sm_89'
ptxas info    : Function properties for _Z6v8_fwdILi64EEv15FlashcoreParams
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 16 bytes cumulative stack size, 1024 bytes smem, 408 bytes cmem[0]
ptxas info    : Function properties for _ZN2fc6helperEv
    48 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z6v8_fwdILi128EEv15FlashcoreParams' for 'sm_89'
ptxas info    : Function properties for _Z6v8_fwdILi128EEv15FlashcoreParams
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 408 bytes cmem[0]
"""


def test_parse_captured_ptxas_output():
    kernels = {k.kernel: k for k in parse_ptxas(CAPTURED)}
    k64 = kernels["void v8_fwd<64>(FlashcoreParams)"]
    assert (k64.registers, k64.static_smem, k64.stack_frame, k64.spill_stores, k64.spill_loads) == (80, 1024, 16, 8, 12)
    assert k64.arch == "sm_89" and k64.barriers == 1
    k128 = kernels["void v8_fwd<128>(FlashcoreParams)"]
    assert (k128.registers, k128.static_smem, k128.spills) == (128, 0, 0)  # a device function's frame is not its


def test_short_kernel_names_drop_the_parameter_list():
    from flashcore_cli.core.console import short_kernel

    assert short_kernel("void v8_fwd<64>(FlashcoreParams)") == "v8_fwd<64>"
    tma = "void v11_fwd_tma<64, 32, 64, 16, 3, 2, 1>(FlashcoreParams, CUtensorMap_st, CUtensorMap_st)"
    assert short_kernel(tma) == "v11_fwd_tma<64, 32, 64, 16, 3, 2, 1>"
    assert short_kernel("fault_fwd(int)") == "fault_fwd(int)"  # another signature is left as it is


def test_occupancy_limits():
    k = KernelResources("m", "k", "sm_89", registers=80, static_smem=0, threads=384, dynamic_smem=49 * 1024)
    assert occupancy(k, ARCHS["sm_89"]) == (2, "registers")
    k = KernelResources("m", "k", "sm_90", registers=32, static_smem=0, threads=128, dynamic_smem=90 * 1024)
    assert occupancy(k, ARCHS["sm_90"]) == (2, "smem")
    k = KernelResources("m", "k", "sm_89", registers=32, static_smem=0, threads=128, dynamic_smem=100 * 1024)
    ctas, why = occupancy(k, ARCHS["sm_89"])
    assert ctas == 0 and "per block" in why


def test_every_registered_kernel_compiles_for_the_l4_and_hopper_without_spills(tmp_path, nvcc, shared_cache):
    out = tmp_path / "ptxas.json"
    result = CliRunner().invoke(app, ["ptxas", "--all", "--arch", "sm_89,sm_90", "--json", str(out), "--fail-on-spill"])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    for report in record["reports"]:
        assert not report["error"], report
        if report["not_built"]:  # a variant whose registry archs exclude this arch (v12: sm_90a only)
            assert report["arch"] == "sm_89" and not report["kernels"], report
            continue
        assert report["kernels"], f"{report['variant']} has no kernels"
        for k in report["kernels"]:
            assert k["spills"] == 0, k
            if k["arch"] == "sm_89" and k["threads"]:
                assert k["static_smem"] + (k["dynamic_smem"] or 0) <= ARCHS["sm_89"].smem_per_block_optin, k
                assert k["ctas_per_sm"] >= 1, k
