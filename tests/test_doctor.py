"""`flashcore doctor`: every piece is reported, and a missing one comes with what to do."""

from typer.testing import CliRunner

from flashcore_cli.builder import cudatools
from flashcore_cli.cli import app


def test_doctor_reports_every_piece_and_what_to_do(monkeypatch, tmp_path, table_rows):
    monkeypatch.setenv("FLASHCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cudatools, "locate", lambda tool: None)  # as on a machine with no CUDA tools
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    rows = {row["piece"]: row for row in table_rows}
    for piece in ("GPU + driver", "CUDA / nvcc", "torch", "triton", "ninja", "ncu", "compute-sanitizer", "cuobjdump", "cache", "registry"):
        assert piece in rows, piece
    assert "Nsight Compute" in rows["ncu"]["what to do"]
    assert "pip install nvidia-cuda-cuobjdump" in rows["cuobjdump"]["what to do"]
    assert str(tmp_path / "cache") in rows["cache"]["found"]
