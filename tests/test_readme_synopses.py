"""The README's command synopses (its "### `flashcore ...`" headings) list every option each command's --help
shows, and no other, so they cannot drift from the CLI again."""

import re

import pytest
import typer.main

from conftest import REPO
from flashcore_cli.cli import app

README = (REPO / "README.md").read_text()


def commands() -> dict:
    """'bench' -> its click command, 'report merge' -> ..., for every command the app has."""
    root = typer.main.get_command(app)
    found = {}

    def walk(group, prefix: str) -> None:  # click's classes (typer vendors click): a group has .commands
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = command

    walk(root, "")
    return found


COMMANDS = commands()


def synopses() -> dict[str, str]:
    """'bench' -> the synopsis text after `flashcore bench`, from every `### ` heading (one heading may hold
    two, as `flashcore report merge ...` and `flashcore report readme ...`)."""
    found = {}
    for heading in re.findall(r"^### (.*)$", README, re.MULTILINE):
        for synopsis in re.findall(r"`flashcore ([^`]*)`", heading):
            words = synopsis.split()
            name = next(n for n in sorted(COMMANDS, key=len, reverse=True) if words[: len(n.split())] == n.split())
            found[name] = synopsis
    return found


SYNOPSES = synopses()


def options(command) -> list[tuple[str, ...]]:
    """Each option's flags (e.g. ('--out', '-o')), as --help shows them; --help itself aside."""
    return [tuple(p.opts) for p in command.params if p.param_type_name == "option" and "--help" not in p.opts and not getattr(p, "hidden", False)]


def test_every_command_has_a_synopsis():
    assert sorted(SYNOPSES) == sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_synopsis_lists_every_option_of_its_command_and_no_other(name):
    synopsis = SYNOPSES[name]
    written = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", synopsis))
    real = options(COMMANDS[name])
    missing = [flags[0] for flags in real if not written & set(flags)]
    unknown = sorted(written - {flag for flags in real for flag in flags})
    assert not missing, f"the README's synopsis of `flashcore {name}` leaves out {missing}"
    assert not unknown, f"the README's synopsis of `flashcore {name}` names options it does not have: {unknown}"
