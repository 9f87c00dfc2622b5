"""The options several commands share are declared once (commands/options.py): every command that takes one has
its default and its help, and their values are checked by one rule."""

import pytest
import typer

from flashcore_cli.cli import app
from flashcore_cli.commands.options import DEFAULT_REPS, DEFAULT_WARMUP, MIN_REPS, check_counts
from flashcore_cli.core.errors import FlashcoreError


def options_of_every_command() -> dict[str, dict[str, object]]:
    """{'bench': {'--reps': click.Option, ...}, 'report readme': {...}, ...}"""
    def walk(group, prefix=""):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", {opt: p for p in command.params for opt in getattr(p, "opts", [])}

    return dict(walk(typer.main.get_command(app)))


@pytest.mark.parametrize("option, default", [("--reps", DEFAULT_REPS), ("--warmup", DEFAULT_WARMUP)])
def test_a_shared_option_has_one_default_and_one_help(option, default):
    found = {name: options[option] for name, options in options_of_every_command().items() if option in options}
    assert len(found) >= 3, found  # bench, sweep, tune (and watch, for --reps)
    assert {p.default for p in found.values()} == {default}
    assert len({p.help for p in found.values()}) == 1


def test_arch_is_one_option_wherever_one_arch_is_meant():
    helps = {name: options["--arch"].help for name, options in options_of_every_command().items() if "--arch" in options}
    assert len(set(helps.values()) - {helps["ptxas"]}) == 1, helps  # ptxas takes a list, the rest one target


@pytest.mark.parametrize("reps, warmup, timeout", [(MIN_REPS - 1, 1, 1.0), (MIN_REPS, 0, 1.0), (MIN_REPS, 1, 0.0),
                                                   (MIN_REPS, 1, -1.0)])  # fmt: skip (nan and inf: test_defects.py, for every option)
def test_the_counts_are_checked_by_one_rule(reps, warmup, timeout):
    with pytest.raises(FlashcoreError):
        check_counts(reps, warmup, timeout)
    check_counts(MIN_REPS, 1, 0.5)
