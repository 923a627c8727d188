"""The `m27` command: `main` parses the arguments and hands off to `commands/`."""

from m27.cli.main import main

__all__ = ["main"]
