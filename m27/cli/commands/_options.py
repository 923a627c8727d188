"""Options several commands share, defined once so they read and parse the same everywhere.

Only argparse here: a command that uses them imports nothing heavier (``m27 validate``
starts fast).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from m27.cli.commands import SUMMARY


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    run: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Subcommand `name`, carried out by `run`: its line in ``m27 --help`` is the table's
    (:data:`m27.cli.commands.SUMMARY`), and `run`'s docstring its description in ``m27
    NAME --help`` (argparse re-wraps it), as click takes a command's help from its
    function: the text that says what the command does stands once, on the code that
    does it."""
    p = sub.add_parser(name, help=SUMMARY[name], description=run.__doc__)
    p.set_defaults(func=run)
    return p


def add_set_option(p: argparse.ArgumentParser, dest: str = "sets") -> None:
    """``--set NAME=VALUE`` (repeatable), the same for every command that reads a pipeline
    file (run, validate, deploy); :func:`m27.spec.parse_set_args` reads the list."""
    p.add_argument(
        "--set",
        dest=dest,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="give a {{NAME}} variable a value (repeatable; the value is taken verbatim)",
    )
