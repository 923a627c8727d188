"""`m27 COMMAND --help` reads as written: every command's help renders, says no `%%`
(argparse %-formats help strings and usage, never descriptions), and its usage line
shows each argument once."""

from __future__ import annotations

import argparse

import pytest

from m27.cli.main import COMMANDS, build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_module_registers_its_commands() -> None:
    names = set(_commands())
    assert {"run", "validate", "config", "notifier", "bot", "worker"} <= names
    assert len(names) >= len(COMMANDS)


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_renders_without_escapes_or_repeats(name: str) -> None:
    text = _commands()[name].format_help()
    assert text.startswith(f"usage: m27 {name} ")
    assert "%%" not in text and "%(" not in text, text
    usage = text.split("\n\n", 1)[0]
    assert " ...]" not in usage, usage  # nargs="+" written twice
