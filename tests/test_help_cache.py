"""A help screen is rendered once and replayed from the cache (entry.py): the replay is the same text, comes
without importing typer, and is never used for another request, terminal or source tree."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from flashcore_cli import entry


def flashcore(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(cache), **env}
    return subprocess.run([sys.executable, "-m", "flashcore_cli", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def entries(cache: Path) -> list[Path]:
    folder = cache / "help"
    return sorted(folder.glob("*.txt")) if folder.is_dir() else []


@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"], ["report", "merge", "--help"]])
def test_the_replay_is_the_rendered_screen(tmp_path, args):
    first = flashcore(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    assert "Usage:" in first.stdout and len(entries(tmp_path)) == 1
    second = flashcore(tmp_path, *args)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert len(entries(tmp_path)) == 1


def test_a_replay_does_not_import_typer(tmp_path):
    program = ("import sys; sys.argv = ['flashcore', '--help']\n"
               "from flashcore_cli.entry import main\n"
               "try:\n    main()\n"
               "finally:\n    print('typer imported:', 'typer' in sys.modules, file=sys.stderr)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]  # fmt: skip
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert "typer imported: True" in runs[0].stderr  # rendered
    assert "typer imported: False" in runs[1].stderr  # replayed
    assert runs[1].stdout == runs[0].stdout and "Commands" in runs[1].stdout


def test_another_width_is_another_screen(tmp_path):
    narrow = flashcore(tmp_path, "--help", COLUMNS="60")
    wide = flashcore(tmp_path, "--help", COLUMNS="130")
    assert narrow.returncode == wide.returncode == 0
    assert max(map(len, narrow.stdout.splitlines())) <= 60 < max(map(len, wide.stdout.splitlines())) <= 130
    assert len(entries(tmp_path)) == 2
    assert flashcore(tmp_path, "--help", COLUMNS="60").stdout == narrow.stdout


def test_an_unwritable_cache_still_gives_the_screen(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    good = flashcore(tmp_path / "cache", "--help")
    for _ in range(2):
        proc = flashcore(blocker / "cache", "--help")
        assert proc.returncode == 0 and proc.stderr == ""
        assert proc.stdout == good.stdout


def test_a_failed_request_is_not_stored(tmp_path):
    proc = flashcore(tmp_path, "no-such-command", "--help")
    assert proc.returncode == 2 and "no-such-command" in proc.stderr
    assert entries(tmp_path) == []


def test_an_entry_is_used_only_under_its_own_key(tmp_path):
    path = str(tmp_path / "help" / "entry.txt")
    entry.store_entry(path, "key A", "screen A\n")
    assert entry.read_entry(path, "key A") == "screen A\n"
    assert entry.read_entry(path, "key B") is None
    assert entry.read_entry(str(tmp_path / "missing.txt"), "key A") is None


def test_a_stale_entry_under_the_path_is_rendered_over(tmp_path):
    """An entry file holding another key (a hash collision, a hand edit) is not replayed."""
    good = flashcore(tmp_path, "--help")
    [path] = entries(tmp_path)
    path.write_text("some other key\nNOT THE SCREEN\n")
    again = flashcore(tmp_path, "--help")
    assert again.stdout == good.stdout


def test_the_fingerprint_follows_every_source_file(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    a = tmp_path / "pkg" / "a.py"
    b = tmp_path / "pkg" / "sub" / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not a source")
    before = entry.source_fingerprint("pkg", str(tmp_path / "pkg"))
    assert before.startswith("pkg:2:")
    (tmp_path / "pkg" / "notes.txt").write_text("still not a source")
    assert entry.source_fingerprint("pkg", str(tmp_path / "pkg")) == before
    st = b.stat()
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # an edit that keeps the size
    touched = entry.source_fingerprint("pkg", str(tmp_path / "pkg"))
    assert touched != before
    a.write_text("x = 10\n")
    assert entry.source_fingerprint("pkg", str(tmp_path / "pkg")) not in (before, touched)
    assert entry.source_fingerprint("gone", str(tmp_path / "nowhere")) == "gone:absent"


def test_the_key_names_the_request_and_the_sources(monkeypatch):
    base = entry.screen_key(["flashcore", "--help"])
    assert entry.screen_key(["flashcore", "bench", "--help"]) != base
    monkeypatch.setenv("NO_COLOR", "1")
    assert entry.screen_key(["flashcore", "--help"]) != base
    assert "flashcore_cli:" in base and "typer:" in base and "rich:" in base


@pytest.mark.parametrize("args, expected", [
    (["--help"], True), (["bench", "--help"], True), (["report", "merge", "--help"], True),
    ([], False), (["bench"], False), (["--help", "bench"], False), (["bench", "--shape", "--help"], False),
    (["--registry", "x", "--help"], False), (["bench", "1,2,3,4", "--help"], False),
])  # fmt: skip
def test_which_requests_are_help_screens(args, expected):
    assert entry.is_help_request(args) is expected


def test_the_cache_keeps_its_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(entry, "_KEEP", 3)
    for i in range(5):
        path = tmp_path / "help" / f"{i}.txt"
        entry.store_entry(str(path), f"key {i}", "screen\n")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    assert [p.name for p in entries(tmp_path)] == ["2.txt", "3.txt", "4.txt"]


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="POSIX pipes")
def test_a_replay_into_a_closed_pipe_ends_with_sigpipe(tmp_path):
    from test_broken_pipe import into_a_closed_pipe

    assert flashcore(tmp_path, "--help").returncode == 0 and len(entries(tmp_path)) == 1
    proc = into_a_closed_pipe("--help", FLASHCORE_CACHE=str(tmp_path))
    assert proc.returncode == -signal.SIGPIPE and proc.stderr == ""


def test_a_render_defers_rich_markdown_and_traceback_and_leaves_the_real_modules(tmp_path):
    """While a screen renders, rich.markdown and rich.traceback are stand-ins (typer imports their Markdown and
    Traceback and never makes one for a help screen under flashcore's markup mode); afterwards nothing of them
    is left: an import gives the real module, and the classes typer holds make real objects."""
    program = ("import sys; sys.argv = ['flashcore', '--help']\n"
               "from flashcore_cli import entry\n"
               "text = entry._render()\n"
               "print('markdown_it' in sys.modules, 'pygments' in sys.modules, 'rich.markdown' in sys.modules,\n"
               "      'rich.traceback' in sys.modules, 'Commands' in text)\n"
               "import rich.markdown, rich.traceback, typer.rich_utils as u\n"
               "print(hasattr(rich.markdown, 'MarkdownContext'), type(u.Markdown('*x*')) is rich.markdown.Markdown)\n"
               "try:\n"
               "    raise ValueError('x')\n"
               "except ValueError as exc:\n"
               "    tb = u.Traceback.from_exception(type(exc), exc, exc.__traceback__)\n"
               "print(hasattr(rich.traceback, 'install'), type(tb) is rich.traceback.Traceback)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"] * 4 + ["True"] * 5


@pytest.mark.parametrize("request_args", [["--help"], ["bench", "--help"], ["report", "merge", "--help"]])
def test_the_stand_ins_leave_every_byte_of_a_screen_as_it_was(tmp_path, request_args):
    """A screen rendered with rich.markdown and rich.traceback deferred is the one typer renders with the real
    modules, byte for byte, in colour too."""
    program = ("import os, sys; from flashcore_cli import entry\n"
               "sys.argv = ['flashcore'] + sys.argv[2:]\n"
               "if os.environ['STAND_INS'] == '0': entry._DEFERRED = ()  # the real modules\n"
               "sys.stdout.write(entry._render())\n")  # fmt: skip
    screens = []
    for stand_ins in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(tmp_path), "COLUMNS": "100",
               "FORCE_COLOR": "1", "STAND_INS": stand_ins}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", program, "-", *request_args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        screens.append(proc.stdout)
    assert "Usage" in screens[0] and "\x1b[" in screens[0]
    assert screens[0] == screens[1]
