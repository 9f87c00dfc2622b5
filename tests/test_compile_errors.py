"""The compile-error excerpt (ptxas.first_errors) from real nvcc runs: each error with the source line and
the caret under it, and the linker's "undefined reference" for a .cu that lacks the contract's launcher."""

import shutil

import pytest
from typer.testing import CliRunner

from conftest import REPO, said
from flashcore_cli.builder.ptxas import first_errors
from flashcore_cli.cli import app

runner = CliRunner()

SYNTAX_ERROR = """\
#include "flashcore.h"
__global__ void broken_fwd(int* p) {
  int x = 1
  p[0] = x;
  p[1] = undefined_name;
}
"""
NO_LAUNCHER = """\
#include "flashcore.h"
__global__ void lonely_fwd(int* p) { p[0] = 1; }
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("flashcore.h", "flashcore_defaults.h"):
        shutil.copy(REPO / "kernels" / name, kernels / name)
    (kernels / "syntax.cu").write_text(SYNTAX_ERROR)
    (kernels / "nolauncher.cu").write_text(NO_LAUNCHER)
    entry = '  - name: {0}\n    sources: [kernels/{0}.cu]\n    summary: "x"\n    head_dims: [64]\n    causal: false\n'
    (tmp_path / "variants.yaml").write_text("variants:\n" + entry.format("syntax") + entry.format("nolauncher"))
    return tmp_path / "variants.yaml"


def ptxas(project, name, table_rows):
    result = runner.invoke(app, ["--registry", str(project), "ptxas", name, "--arch", "sm_90"])
    assert result.exit_code == 1, result.output  # a failed compile is a failed check
    (row,) = [r for r in table_rows if r.get("variant") == name]
    return row["kernel"]


def test_a_syntax_error_keeps_the_source_line_and_its_caret(project, nvcc, fresh_cache, table_rows):
    excerpt = ptxas(project, "syntax", table_rows).splitlines()
    assert excerpt[0] == "compile failed"
    first = next(i for i, line in enumerate(excerpt) if 'error: expected a ";"' in line)
    assert excerpt[first].endswith('syntax.cu(4): error: expected a ";"')
    assert excerpt[first + 1].strip() == "p[0] = x;" and excerpt[first + 2].strip() == "^"
    second = next(i for i, line in enumerate(excerpt) if 'identifier "undefined_name" is undefined' in line)
    assert excerpt[second + 1].strip() == "p[1] = undefined_name;" and excerpt[second + 2].strip() == "^"


def test_a_cu_without_the_launcher_names_the_undefined_reference(project, nvcc, fresh_cache, table_rows):
    excerpt = ptxas(project, "nolauncher", table_rows)
    assert "undefined reference to `flashcore_plan(int, FlashcoreKernelPlan*, int)'" in excerpt
    assert "no definition of flashcore_plan" in excerpt and "kernels/flashcore.h" in excerpt


def test_repeated_errors_keep_each_caret_with_its_source_line():
    """Three errors whose caret lines are the same text: each keeps its source line (a line-by-line dedup used
    to drop them and leave bare carets)."""
    log = "".join(f'a.cu({n}): error: identifier "x{n}" is undefined\n    y = x{n};\n        ^\n\n' for n in (3, 4, 5))
    log += log  # the same errors again (a second instantiation): shown once
    assert first_errors(log).splitlines() == [
        'a.cu(3): error: identifier "x3" is undefined', "    y = x3;", "        ^",
        'a.cu(4): error: identifier "x4" is undefined', "    y = x4;", "        ^",
        'a.cu(5): error: identifier "x5" is undefined', "    y = x5;", "        ^",
    ]  # fmt: skip


def test_gcc_style_errors_keep_the_gutter_lines():
    log = "b.cpp:7:5: error: 'foo' was not declared in this scope\n    7 |     foo();\n      |     ^~~\n"
    assert first_errors(log).splitlines() == log.splitlines()


def test_the_excerpt_is_bounded_by_whole_errors():
    log = "".join(f"a.cu({n}): error: e{n}\n    code{n};\n    ^\n" for n in range(10))
    lines = first_errors(log, limit=7).splitlines()
    assert len(lines) == 6 and lines[-1].strip() == "^"  # two whole errors; a third would not fit
