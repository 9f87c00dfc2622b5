"""Write docs/commands.md, the command reference, from the CLI's own --help.

    python3 scripts/cli_reference.py            # rewrite docs/commands.md
    python3 scripts/cli_reference.py --check    # exit 1 if docs/commands.md differs from --help

Each command's help is rendered as plain text (click's formatter, no rich boxes, no colour) at a fixed width, so
the page depends on the CLI's declarations only, never on the terminal that ran this script. tests/test_cli_reference.py
renders it in memory and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "docs" / "commands.md"
APP = "flashcore_cli.cli:app"  # the Typer app: the one name to change if it moves
PROGRAM = "flashcore"
WIDTH = 100

HEADER = f"""# Command reference

Every `flashcore` command's `--help`, as plain text. This page is generated: run
`python3 scripts/cli_reference.py` after changing a command (tests/test_cli_reference.py fails until then).
Shapes, the registry's resolution, environment variables, exit codes and the record format are in
[usage.md](usage.md).
"""


def load_app():
    import importlib

    module, name = APP.split(":")
    return getattr(importlib.import_module(module), name)


def commands(root) -> list[tuple[list[str], object, object]]:
    """(path, click command, its context) for the root and every command under it, in the order --help lists them."""
    found = []

    def walk(command, path: list[str], parent) -> None:
        command.rich_markup_mode = None  # typer's TyperCommand/TyperGroup: plain click help, no rich panels
        ctx = command.context_class(command, info_name=path[-1], parent=parent, terminal_width=WIDTH,
                                    max_content_width=WIDTH)  # fmt: skip
        found.append((path, command, ctx))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name], ctx)

    walk(root, [PROGRAM], None)
    return found


def render() -> str:
    import typer.main

    root = typer.main.get_command(load_app())
    parts = [HEADER]
    entries = commands(root)
    parts.append("\n".join(f"- [`{' '.join(path)}`](#{anchor(path)})" for path, _, _ in entries[1:]) + "\n")
    for path, command, ctx in entries:
        text = "\n".join(line.rstrip() for line in command.get_help(ctx).splitlines())
        parts.append(f"## {' '.join(path)}\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


def anchor(path: list[str]) -> str:
    return "-".join(path)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} differs from --help: run python3 scripts/cli_reference.py", file=sys.stderr)
            return 1
        print(f"{OUTPUT.relative_to(REPO)} matches --help")
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
