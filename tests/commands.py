"""Running one `m27` command in-process, through its module's register() and func."""

from __future__ import annotations

import argparse
from typing import Any


def cli(module: Any, argv: list[str]) -> int:
    """`m27 ARGV` through the command `module` (`m27.cli.commands.gpus`, ...): its exit code."""
    parser = argparse.ArgumentParser(prog="m27")
    module.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
