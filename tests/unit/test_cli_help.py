"""`m27 COMMAND --help` reads as written: every command's help renders, says no `%%`
(argparse %-formats help strings and usage, never descriptions), and its usage line
shows each argument once."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from m27.cli.commands import COMMANDS
from m27.cli.main import build_parser, overview_parser


def _sub(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub


def _commands() -> dict[str, argparse.ArgumentParser]:
    return dict(_sub(build_parser()).choices)


def _listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    """(command, its line) as `m27 --help` lists them."""
    return [(a.dest, a.help) for a in _sub(parser)._choices_actions]


def test_every_module_registers_the_commands_the_table_names_it_for() -> None:
    for module in {m for _, m, _ in COMMANDS}:
        assert set(dict(_sub(build_parser([module])).choices)) == {
            n for n, m, _ in COMMANDS if m == module
        }, module
    assert [n for n, _, _ in COMMANDS] == list(_commands())


def test_the_overview_lists_what_the_whole_parser_would() -> None:
    """`m27 --help` comes from the table without importing a command: the same commands,
    lines and order as the parser their modules build."""
    assert _listed(overview_parser()) == _listed(build_parser())
    assert overview_parser().format_help() == build_parser().format_help()


def test_help_and_a_mistyped_command_import_no_command_module() -> None:
    probe = (
        "import sys\n"
        "from m27.cli.main import main\n"
        "for argv in (['--help'], ['rnu'], []):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        print('exit', e.code)\n"
        "mods = [m for m in sys.modules if m.startswith(('m27.cli.commands.', 'telegram'))]\n"
        "print('imported', sorted(mods))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert "exit 0\nexit 2\nexit 2\n" in done.stdout
    assert "imported []" in done.stdout, done.stdout
    assert "invalid choice: 'rnu' (choose from 'run', 'validate'" in done.stderr


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_renders_without_escapes_or_repeats(name: str) -> None:
    text = _commands()[name].format_help()
    assert text.startswith(f"usage: m27 {name} ")
    assert "%%" not in text and "%(" not in text, text
    usage = text.split("\n\n", 1)[0]
    assert " ...]" not in usage, usage  # nargs="+" written twice
