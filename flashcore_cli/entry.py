"""The `flashcore` command's entry point (pyproject's [project.scripts], and `python -m flashcore_cli`).

A help screen (`flashcore --help`, `flashcore bench --help`, `flashcore report merge --help`) is fixed by the
request, the terminal and the sources that render it. Rendering one takes ~0.25 s, nearly all of it importing
typer and rich and building the commands; so a screen once rendered is kept in the cache (<cache>/help/) and
the same request again prints it without importing either (~0.05 s). An entry's key is everything the screen
depends on: the arguments and how the program was started (its name in "Usage:"), whether stdout is a
terminal and its encoding, the terminal's size, the environment variables rich and typer read, the Python
version, and the size and modification time of every .py file of flashcore_cli, typer, rich and click. An
entry holds its whole key and is used only when that key matches. A cache that cannot be written is passed
over: the screen is rendered each time, as before. Any other request goes straight to the CLI (cli.py).
"""

from __future__ import annotations

import io
import os
import sys
import zlib

# What rich and typer read from the environment when they lay out and colour a screen (a grep of their
# sources), and the locale and Python's I/O encoding, which pick the characters it is drawn with.
_SCREEN_ENV = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "PY_COLORS", "TTY_COMPATIBLE",
               "TTY_INTERACTIVE", "TERMINAL_WIDTH", "JUPYTER_COLUMNS", "JUPYTER_LINES", "UNICODE_VERSION",
               "GITHUB_ACTIONS", "DATABRICKS_RUNTIME_VERSION", "TYPER_USE_RICH", "_TYPER_FORCE_DISABLE_TERMINAL",
               "PYTHONIOENCODING", "LANG", "LC_ALL", "LC_CTYPE")  # fmt: skip
_RENDERERS = ("flashcore_cli", "typer", "rich", "click")
_KEEP = 64  # entries kept; the oldest go when a new one is stored


def main() -> None:
    import signal

    # `flashcore list | head -1`: when the reader goes, stop at once and quietly, as cat, grep and git do: killed
    # by SIGPIPE, which a shell reports as 141 (128 + 13). Python ignores SIGPIPE by default, so the write would
    # raise BrokenPipeError instead, and click and rich turn that into exit 1 (and at times a traceback at exit).
    # Children are unaffected (subprocess restores SIGPIPE's default in them anyway).
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # SIGTERM (`timeout`, a CI job cancelled, `kill`) ends a command as Ctrl-C does (exit 130): its compilers
    # and workers killed, its temporary folders removed. Python's default would end this process alone, at once,
    # leaving its children running (they have sessions of their own) and its folders behind.
    signal.signal(signal.SIGTERM, _interrupt)
    if not is_help_request(sys.argv[1:]):
        sys.exit(run_cli(sys.argv[1:]))
    key = screen_key(sys.argv)
    path = entry_path(key)
    text = read_entry(path, key)
    if text is None:
        text = _render()
        store_entry(path, key, text)
    sys.stdout.write(text)
    sys.stdout.flush()


def run_cli(args: list[str]) -> int:
    """The CLI on `args`: its exit code, a parse error included (commands/handling.py's run_app)."""
    from flashcore_cli.cli import app
    from flashcore_cli.commands.handling import run_app

    return run_app(app, args)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def is_help_request(args: list[str]) -> bool:
    """`--help` after nothing but command names: what click answers with a screen and nothing else. (`bench
    --shape --help` is left to the CLI, which may read "--help" as the shape.)"""
    return bool(args) and args[-1] == "--help" and all(a[:1].isalpha() and a.replace("-", "").isalnum() for a in args[:-1])


def screen_key(argv: list[str]) -> str:
    """One line naming everything a help screen depends on (the module docstring lists it)."""
    main_module = sys.modules.get("__main__")
    stdout = sys.stdout
    try:
        tty = stdout.isatty()
    except (AttributeError, ValueError):
        tty = None
    parts = {
        "argv": argv,
        "main": getattr(main_module, "__package__", None),
        "python": sys.version,
        "tty": tty,
        "encoding": getattr(stdout, "encoding", None),
        "size": _terminal_size(),
        "env": [os.environ.get(name) for name in _SCREEN_ENV],
        "sources": [source_fingerprint(name, _package_dir(name)) for name in _RENDERERS],
    }
    return repr(parts).replace("\n", "\\n")


def _terminal_size():
    for fd in (0, 1, 2):  # as rich looks for it
        try:
            return tuple(os.get_terminal_size(fd))
        except (AttributeError, ValueError, OSError):
            pass
    return None


def _package_dir(name: str) -> str | None:
    if name == "flashcore_cli":
        return os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def source_fingerprint(name: str, folder: str | None) -> str:
    """name:files:crc32:adler32 over the relative path, size and modification time of every .py file under
    `folder` (an upgrade, an edit or a checkout changes it), or name:absent."""
    if not folder or not os.path.isdir(folder):
        return f"{name}:absent"
    stats = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(files):
            if file.endswith(".py"):
                path = os.path.join(root, file)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                stats.append(f"{os.path.relpath(path, folder)}|{st.st_size}|{st.st_mtime_ns}")
    blob = "\n".join(stats).encode()
    return f"{name}:{len(stats)}:{zlib.crc32(blob):08x}:{zlib.adler32(blob):08x}"


def entry_path(key: str) -> str:
    from flashcore_cli.core.paths import cache_root

    blob = key.encode()
    return os.path.join(cache_root(), "help", f"{zlib.crc32(blob):08x}{zlib.adler32(blob):08x}.txt")


def read_entry(path: str, key: str) -> str | None:
    """The screen stored under `key`, or None (no entry, another key in it, unreadable)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if f.readline() != key + "\n":
                return None
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def store_entry(path: str, key: str, text: str) -> None:
    """Write the entry whole (a temporary file renamed over it, so a reader never sees half of one), then keep
    the newest _KEEP; a cache that cannot be written is passed over."""
    folder = os.path.dirname(path)
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(temp, "w", encoding="utf-8", newline="") as f:
            f.write(key + "\n" + text)
        os.replace(temp, path)
        entries = sorted((e for e in os.scandir(folder) if e.name.endswith(".txt")), key=lambda e: e.stat().st_mtime_ns)
        for old in entries[:-_KEEP]:
            os.unlink(old.path)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass


class _Screen(io.StringIO):
    """Stands in for stdout while a screen renders: rich and click see the real stream's terminal and encoding."""

    def __init__(self, real):
        super().__init__()
        self._real = real

    @property
    def encoding(self):
        return getattr(self._real, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self._real.isatty()

    def fileno(self) -> int:
        return self._real.fileno()


def _deferred(module: str, name: str):
    """A stand-in for the module `module` (rich.markdown, rich.traceback) while a screen renders. typer's
    rich_utils imports rich.markdown's Markdown and rich.traceback's Traceback at the top; those imports
    (markdown-it, pygments) cost a screen more than anything else (markdown 50-110 ms of ~0.25-0.3 s on the lent
    machines; with traceback deferred too, a render here went from a median 0.25 s to 0.20), yet a Markdown is
    made only under rich_markup_mode="markdown", which flashcore does not use, and a Traceback only for an
    exception typer prints, which handle_errors never lets through. The stand-in's class (and its class
    attributes: Traceback.from_exception) are the real one's, and any other name imports the real module; either
    way the real module then replaces the stand-in. A screen is the same, byte for byte, either way
    (tests/test_help_cache.py)."""
    import importlib
    import types

    stand_in = types.ModuleType(module)

    def real_module():
        if sys.modules.get(module) is stand_in:
            del sys.modules[module]
        return importlib.import_module(module)

    class ForwardsClassAttributes(type):  # Traceback.from_exception(...): the real class's
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return getattr(getattr(real_module(), name), attr)

    class Deferred(metaclass=ForwardsClassAttributes):
        def __new__(cls, *args, **kwargs):
            return getattr(real_module(), name)(*args, **kwargs)

    def other_name(attr):
        if attr.startswith("__"):  # the import system's probes (__path__, ...): a plain module has none
            raise AttributeError(attr)
        return getattr(real_module(), attr)

    Deferred.__name__ = Deferred.__qualname__ = name
    setattr(stand_in, name, Deferred)
    stand_in.__getattr__ = other_name
    return stand_in


_DEFERRED = (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback"))


def _render() -> str:
    """The CLI's answer to the help request, captured. One that does not end with exit 0 (an unknown command)
    is not a screen: its output is printed and the process exits with its code, as the CLI would."""
    from flashcore_cli.cli import app

    real = sys.stdout
    screen = _Screen(real)
    stand_ins = {module: _deferred(module, name) for module, name in _DEFERRED if module not in sys.modules}
    sys.modules.update(stand_ins)
    sys.stdout = screen
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stdout = real
        for module, stand_in in stand_ins.items():
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]
    text = screen.getvalue()
    if code not in (0, None):
        real.write(text)
        real.flush()
        raise SystemExit(code)
    return text
