"""Options several commands share, defined once so they read and parse the same everywhere.

Only argparse here: a command that uses them imports nothing heavier (``m27 validate``
starts fast).
"""

from __future__ import annotations

import argparse
import math
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


def seconds(*, least: float = 0.0, most: float = 86400.0) -> Callable[[str], float]:
    """An argparse ``type`` for a number of seconds from `least` to `most`: ``nan`` and
    ``inf`` are refused by name (``time.sleep(inf)`` raises, a ``nan`` wait returns at once
    and spins a core), so a bad value is argparse's one line, exit 2."""
    return number(least=least, most=most, of="seconds")


def duration(example: str) -> Callable[[str], float]:
    """An argparse ``type`` for a duration above zero (`300s`, `5m`, `1h30m`; `example`
    in the message): argparse then names the option in the error, and 0 (`--idle 0`
    stopped the agent at once, while `service_idle = 0` was refused) is refused."""

    def parse(text: str) -> float:
        from m27.units import parse_duration  # light, but only for the commands that ask

        try:
            value = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{text!r}: give a duration above 0, e.g. {example}")
        return value

    return parse


def whole(*, least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number from `least` (to `most`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least or (most is not None and value > most):
            span = f"from {least} to {most}" if most is not None else f"of {least} or more"
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number {span}")
        return value

    return parse


def number(*, least: float, most: float, of: str = "") -> Callable[[str], float]:
    """An argparse ``type`` for a finite number (`of` what: "seconds") from `least` to
    `most`."""
    what = f"a number of {of}" if of else "a number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not math.isfinite(value) or not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} from {least:g} to {most:g}")
        return value

    return parse
