"""Options several commands share, defined once so they read and parse the same everywhere.

Only argparse here: a command that uses them imports nothing heavier (``m27 validate``
starts fast).
"""

from __future__ import annotations

import argparse


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
