"""`flashcore sass`: the SASS parser on real cuobjdump captures, and the command on a real cubin (no GPU)."""

import gzip

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, said
from flashcore_cli.builder import cudatools
from flashcore_cli.cli import app
from flashcore_cli.inspect.sass import parse_sass

INSTRUMENTS = FIXTURES / "instruments"


def test_v8_capture_has_the_tensor_core_mix():
    # cuobjdump 13.5 -sass of kernels/ladder/v8.cu built for sm_90 (WMMA, ldmatrix, cp.async 16-byte copies)
    kernels = {k.kernel: k for k in parse_sass(gzip.decompress((INSTRUMENTS / "sass_v8_sm90.sass.gz").read_bytes()).decode())}
    assert set(kernels) == {"void v8_fwd<64>(FlashcoreParams)", "void v8_fwd<128>(FlashcoreParams)"}
    k64, k128 = kernels["void v8_fwd<64>(FlashcoreParams)"], kernels["void v8_fwd<128>(FlashcoreParams)"]
    assert (k64.count("HMMA"), k128.count("HMMA")) == (16, 32)  # twice the head dim, twice the MMAs
    assert k64.count("LDSM") == 13 and k64.count("BAR") == 4
    assert k64.widths("LDGSTS") == {128: 10}  # every cp.async moves 16 bytes
    assert k64.count("LDL", "STL") == 0 and k64.count("HGMMA") == 0
    assert k64.total == 759  # NOPs (padding after EXIT) are not instructions
    assert k64.mix()["LDGSTS"] == {128: 10}


def test_local_memory_and_access_widths():
    # cuobjdump -sass of tests/fixtures/instruments/sass_mix.cu (a dynamically indexed per-thread array)
    (k,) = parse_sass((INSTRUMENTS / "sass_mix_sm90.sass").read_text())
    assert k.mangled == "_Z8sass_mixPK6float4P6float2PKi"
    assert k.count("LDL") >= 1 and k.count("STL") >= 1
    assert k.widths("LDG") == {128: 1, 32: 1}  # the float4 and the int index
    assert k.widths("STG") == {64: 1}
    assert k.widths("STL")[128] >= 1
    assert k.count("BAR") == 1


def test_predicated_and_uniform_instructions_are_counted():
    text = """
\t\tFunction : _Z1kv
        /*0000*/                   LDC R1, c[0x0][0x28] ;        /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDG.E.U16.CONSTANT R4, desc[UR10][R6.64] ;   /* 0x0000000a06048981 */
        /*0020*/              @UP0 HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x0 */
        /*0030*/             @!PT LDS.128 R4, [R2] ;      /* 0x0 */
        /*0040*/                   HGMMA.64x64x16.F32 gdesc[UR4], RZ, !UPT ;   /* 0x0 */
        /*0050*/                   NOP ;     /* 0x0 */
"""
    (k,) = parse_sass(text)
    assert k.count("LDG") == 1 and k.widths("LDG") == {16: 1}
    assert k.count("HMMA") == 1 and k.count("HGMMA") == 1 and k.count("LDS") == 1
    assert k.total == 5


@pytest.fixture
def cuobjdump():
    if cudatools.locate("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def test_sass_of_baseline_from_a_real_cubin(tmp_path, nvcc, cuobjdump, table_rows):
    listing = tmp_path / "baseline.sass"
    result = CliRunner().invoke(app, ["sass", "baseline", "--arch", "sm_90", "--out", str(listing)])
    assert result.exit_code == 0, result.output
    rows = {row["kernel"]: row for row in table_rows}
    assert rows.keys() == {"baseline_fwd<64>", "baseline_fwd<128>"}
    assert {"LDGSTS bits x n", "HMMA"} <= rows["baseline_fwd<64>"].keys()
    kernels = {k.kernel for k in parse_sass(listing.read_text())}
    assert kernels == {"void baseline_fwd<64>(FlashcoreParams)", "void baseline_fwd<128>(FlashcoreParams)"}


def test_missing_cuobjdump_says_how_to_get_it(monkeypatch, nvcc):
    monkeypatch.setattr(cudatools, "locate", lambda tool: None)
    result = CliRunner().invoke(app, ["sass", "baseline", "--arch", "sm_90"])
    assert result.exit_code == 2
    assert "pip install nvidia-cuda-cuobjdump" in said(result)
    assert "Traceback" not in result.output
