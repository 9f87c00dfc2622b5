"""The package installs like a library: a built wheel carries the default registry and every file the shipped
variants compile from, and a kernel author's own folder (no registry found from it) gets a registry of its own
from `flashcore new`, built against the installed parts. CI installs the wheel into a fresh venv and runs it
from an empty folder; these tests prove the parts of that on every run."""

import subprocess
import sys
import zipfile

import pytest
from typer.testing import CliRunner

from conftest import REPO
from flashcore_cli.builder.cache import source_closure
from flashcore_cli.cli import app
from flashcore_cli.core.paths import INSTALL_ROOT
from flashcore_cli.registry.variants import INSTALLED_PREFIX, load_registry

runner = CliRunner()


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, cwd=out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("flashcore-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_ships_the_registry_and_every_file_the_kernels_compile_from(wheel_names):
    reg = load_registry(REPO / "variants.yaml")
    needed = {"variants.yaml", "kernels/binding.cpp"}
    for v in reg.variants:
        needed |= {str(f.relative_to(REPO)) for f in source_closure(list(v.sources), list(v.include_dirs))}
    missing = sorted(f for f in needed if f"flashcore_cli/_data/{f}" not in wheel_names)
    assert not missing, missing
    assert "flashcore_cli/measure/blocking_start.cu" in wheel_names
    assert not any("__pycache__" in n for n in wheel_names)


def test_new_in_an_empty_folder_starts_a_registry_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLASHCORE_REGISTRY", raising=False)
    shipped = (INSTALL_ROOT / "variants.yaml").read_text()
    result = runner.invoke(app, ["new", "mine", "--from", "v11"])
    assert result.exit_code == 0, result.output
    assert (INSTALL_ROOT / "variants.yaml").read_text() == shipped  # the installed registry is never written
    assert not (INSTALL_ROOT / "kernels" / "mine.cu").exists()
    mine = load_registry(tmp_path / "variants.yaml").get("mine")
    v11 = load_registry(INSTALL_ROOT / "variants.yaml").get("v11")
    assert mine.sources[0] == tmp_path / "kernels" / "mine.cu"
    assert mine.sources[1:] == v11.sources[1:]  # the translation units it shares, from the installed parts
    assert mine.kernels_dir == INSTALL_ROOT / "kernels"
    assert mine.include_dirs == (tmp_path / "kernels", INSTALL_ROOT / "kernels")
    assert (mine.head_dims, mine.dtypes, mine.features, mine.tune) == (v11.head_dims, v11.dtypes, v11.features, v11.tune)
    again = runner.invoke(app, ["new", "mine", "--from", "v11"])  # found from here now: the name is taken
    assert again.exit_code == 2 and "already registered" in again.output


@pytest.mark.parametrize("source", [f"{INSTALLED_PREFIX}../outside.cu", f"{INSTALLED_PREFIX}kernels/nothing.cu"])
def test_an_installed_source_outside_the_parts_or_missing_is_refused(tmp_path, source):
    (tmp_path / "variants.yaml").write_text(
        f"variants:\n  - name: x\n    sources: [{source}]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    from flashcore_cli.core.errors import FlashcoreError

    with pytest.raises(FlashcoreError, match="outside the installed parts|does not exist"):
        load_registry(tmp_path / "variants.yaml")
