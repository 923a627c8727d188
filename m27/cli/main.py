"""The `m27` command: one subcommand per module in m27/cli/commands/.

Exit codes are the same everywhere: 0 success, 1 a run or check failed, 2 bad input
(an invalid pipeline file, configuration, or arguments).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from m27 import __version__
from m27._exceptions import ConfigError, M27Error, SpecError

#: subcommand modules under m27.cli.commands, in the order `m27 --help` lists them.
COMMANDS = (
    "run",
    "validate",
    "runs",
    "status",
    "logs",
    "cancel",
    "checkpoints",
    "gpus",
    "queue",
    "bump",
    "agent",
    "config_cmd",
    "exporter",
    "notify",
    "simulate",
    "deploy",
    "pool",
    "worker",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="m27",
        description="Run YAML pipelines of cpu/gpu steps on Prefect, keep GPUs busy, "
        "checkpoint long jobs.",
        epilog="Exit codes: 0 success, 1 failure, 2 bad input. Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"m27 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"m27.cli.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"m27.cli.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (SpecError, ConfigError) as exc:
        print(f"m27: {exc}", file=sys.stderr)
        return 2
    except M27Error as exc:
        print(f"m27: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("m27: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
