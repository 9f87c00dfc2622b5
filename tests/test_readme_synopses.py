"""The command lines the README and docs/ show (`$ flashcore ...` in their examples, and the set-up commands) name
real commands and only options those commands have, so an example cannot drift from the CLI. The full reference,
docs/commands.md, is generated from --help (tests/test_cli_reference.py)."""

import re
import shlex

import importlib.util

import pytest
import typer.main

from conftest import REPO


def _app():
    """The Typer app, found as scripts/cli_reference.py finds it (its APP names it once)."""
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_app()


app = _app()

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def shown_command_lines() -> list[tuple[str, str]]:
    """(page, 'flashcore ...') for every line of a fenced block that runs flashcore, prompt or not."""
    found = []
    for page in PAGES:
        in_block = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                in_block = not in_block
                continue
            text = line.strip().removeprefix("$ ")
            if in_block and re.match(r"flashcore( |$)", text):
                found.append((page.relative_to(REPO).as_posix(), text.split(" #")[0].strip()))
    return found


LINES = shown_command_lines()


def test_the_readme_shows_the_four_commands_users_type():
    readme = {line for page, line in LINES if page == "README.md"}
    for command in ("flashcore build v8", "flashcore bench --shape 1,8,512,64", "flashcore ptxas v6",
                    "flashcore ptxas --all --arch sm_89,sm_90 --fail-on-spill"):
        assert command in readme
    assert any(line.startswith("flashcore test --all") for line in readme)


@pytest.mark.parametrize("page,line", LINES, ids=[f"{p}: {line}" for p, line in LINES])
def test_a_shown_command_parses(page, line):
    """Walk the words as click would: command names descend into groups, each option must belong to the command
    reached so far (a global option such as --registry to the root), and an option that takes a value takes the
    next word."""
    command, path = typer.main.get_command(app), ["flashcore"]
    words = shlex.split(line)[1:]
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and not re.match(r"-\d", word):
            flag = word.split("=")[0]
            option = next((p for p in command.params if flag in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])), None)
            assert option is not None or flag == "--help", f"{page}: `{line}`: {' '.join(path)} has no option {flag}"
            if option is not None and not getattr(option, "is_flag", False) and "=" not in word:
                i += 1  # its value
        elif hasattr(command, "commands"):
            assert word in command.commands, f"{page}: `{line}`: {' '.join(path)} has no command {word!r}"
            command, path = command.commands[word], [*path, word]
        i += 1
    assert not hasattr(command, "commands"), f"{page}: `{line}` names a group, not a command"


def test_every_record_is_cited_and_every_link_resolves():
    """docs/results/ holds the records the docs cite, each named by a doc; and every relative link of the README and
    docs/ points at a file that exists."""
    text = {page: page.read_text() for page in PAGES}
    records = [p.name for p in (REPO / "docs" / "results").iterdir() if p.name != "README.md"]
    uncited = [name for name in records if not any(name in t for t in text.values())]
    assert not uncited, f"records no doc cites (cite them or git rm them): {uncited}"
    broken = []
    for page, body in text.items():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", body):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, f"links to nothing: {broken}"
