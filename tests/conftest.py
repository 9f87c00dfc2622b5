import os
import shutil
from pathlib import Path

import pytest

# One thread per torch process (this one, the workers, the scripts the tests run). The tests' tensors are small,
# and on a shared 2-core machine torch's default of a thread per core oversubscribes it: scripts/train_tiny.py's CPU
# check (test_autograd) took 247 s with the default and 39 s with one thread, at a load of ~5.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    for item in items:  # one worker runs every gpu test, in turn (pyproject.toml: --dist loadgroup)
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("gpu"))
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the gpu-marked tests on the lent GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The width every test renders at. flashcore's consoles are fixed at 180 columns when stdout is not a terminal
# (core/console.py) and take the terminal's width when it is (`pytest -s`), so COLUMNS alone does not reach them;
# the fixture below pins them, and COLUMNS covers any other rich console (typer's usage errors).
TERMINAL_WIDTH = 200


@pytest.fixture(autouse=True)
def wide_fixed_terminal(monkeypatch):
    """Every test renders at the same width, whatever terminal runs pytest. Tests still never assert on how a
    table wraps: a cell's text is read from `table_rows`, a plain message with its whitespace normalised."""
    from flashcore_cli.core import console as consoles

    monkeypatch.setenv("COLUMNS", str(TERMINAL_WIDTH))
    for console in (consoles.console, consoles.err_console):
        monkeypatch.setattr(console, "width", TERMINAL_WIDTH)


@pytest.fixture
def fake_bench_workers(monkeypatch, tmp_path):
    """`flashcore bench` with its workers faked, no GPU needed: fake_bench_workers(references=..., variant=...) puts the
    functions in place of measure.bench's bench_references and bench_variant (either may be left out); records go
    under tmp_path."""
    from flashcore_cli.measure import bench

    def install(references=None, variant=None):
        if references is not None:
            monkeypatch.setattr(bench, "bench_references", references)
        if variant is not None:
            monkeypatch.setattr(bench, "bench_variant", variant)
        monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
        monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))

    return install


@pytest.fixture
def table_rows(monkeypatch):
    """Every row a rich table with a header is given during the test, as {column header: the cell's plain
    text}: what a user reads, as data, however the table would wrap it."""
    from rich.table import Table
    from rich.text import Text

    rows: list[dict[str, str]] = []
    add_row = Table.add_row

    def plain(cell) -> str:
        if isinstance(cell, Text):
            return cell.plain
        return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)

    def recording_add_row(self, *cells, **kwargs):
        if self.show_header:  # a table a user reads, not a layout grid (rich's progress display)
            rows.append({str(column.header): plain(cell) for column, cell in zip(self.columns, cells)})
        return add_row(self, *cells, **kwargs)

    monkeypatch.setattr(Table, "add_row", recording_add_row)
    return rows


def cells(rows: list[dict[str, str]]) -> list[str]:
    """Every cell of the rows `table_rows` recorded."""
    return [cell for row in rows for cell in row.values()]


def said(result) -> str:
    """A CliRunner result's output with its whitespace normalised: the words of a plain message, wherever rich
    broke its lines (a message that holds a path breaks at a place that depends on the path's length)."""
    return " ".join(result.output.split())


@pytest.fixture
def nvcc():
    from flashcore_cli.builder.toolchain import find_nvcc
    from flashcore_cli.core.errors import FlashcoreError

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


@pytest.fixture(scope="session")
def session_cache_dir():
    """flashcore's own cache ($FLASHCORE_CACHE or ~/.cache/flashcore), where the README's first set-up command
    (`flashcore ptxas --all`) left the probes of the registry's kernels. Probes are cached by content (sources and
    headers, flags, target, nvcc), so what it holds is what a compile would give now, and what a test compiles
    there is what `flashcore ptxas` would have written."""
    from flashcore_cli.core.paths import cache_root

    return cache_root()


@pytest.fixture
def shared_cache(session_cache_dir, monkeypatch):
    """flashcore's own cache, for tests that only read compiles of the registry's own, unmodified variants (their
    ptxas probes): each is compiled at most once, by `flashcore ptxas --all` or whichever test needs it first.
    A test that counts compiles, edits a source or interrupts one keeps fresh_cache."""
    monkeypatch.setenv("FLASHCORE_CACHE", str(session_cache_dir))
    return session_cache_dir


def host_check_program(tmp_path_factory, source: Path, target: str) -> Path:
    """A host-side check program (tests/fixtures/hosts/*.cu, which includes a kernel's own host/device
    functions) built with nvcc for PTX only (`target`, e.g. compute_90: ptxas is not needed for host code);
    skips the test where nvcc is not installed."""
    import subprocess

    from flashcore_cli.builder.toolchain import find_nvcc
    from flashcore_cli.core.errors import FlashcoreError

    try:
        nvcc = find_nvcc()
    except FlashcoreError:
        pytest.skip("nvcc is not installed")
    exe = tmp_path_factory.mktemp(source.stem) / source.stem
    cmd = [str(nvcc), "-std=c++17", "-gencode", f"arch={target},code={target}", f"-I{REPO / 'kernels'}", str(source),
           "-o", str(exe)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe


def run_host_check(exe: Path, cases: list[str]) -> list[str]:
    """Run a host check program on cases and return its lines, asserting one OK verdict per case, in order
    (`OK case ...`; anything else is a failure, shown)."""
    import subprocess

    proc = subprocess.run([str(exe), *cases], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    failed = [line for line in lines if not line.startswith("OK ")]
    assert proc.returncode == 0 and not failed, "\n".join(failed[:10]) + proc.stderr
    assert [line.split()[1] for line in lines] == cases  # one verdict per case, in order
    return lines


def processes_mentioning(text: str) -> list[str]:
    """'pid: command line' of every live process whose command line holds `text`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != b"Z":
            found.append(f"{pid}: {cmdline[:200]}")
    return found
