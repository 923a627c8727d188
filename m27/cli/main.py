"""The `m27` command: one subcommand per module in m27/cli/commands/.

Exit codes are the same everywhere: 0 success, 1 a run or check failed, 2 bad input
(an invalid pipeline file, configuration, or arguments).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from m27 import __version__
from m27._exceptions import ConfigError, M27Error, SpecError
from m27.cli.commands import COMMANDS, MODULE

if TYPE_CHECKING:
    from m27.events.check import Misfit


def _only(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The one command module `argv` needs, so `m27 run` does not import the modules of
    every other command (Telegram, checkpoints, Prefect deployments: about a second on a
    loaded machine); None when there is no command to run (help, a typo)."""
    if list(argv) == ["--version"]:
        return ()
    name = next((a for a in argv if not a.startswith("-")), None)
    module = MODULE.get(name) if name is not None else None
    return None if module is None else (module,)


class _Parser(argparse.ArgumentParser):
    """A parser whose subcommands report arguments they do not know themselves.

    Plain argparse hands them up to `m27`, which prints its own usage (`usage: m27 [-h]
    [--version] COMMAND ...`) for `m27 exporter --port 1`; the subcommand's usage is the
    one that lists what it does take. Subparsers inherit the class (``parser_class``).

    A command whose positionals may follow its options (`m27 checkpoints gc --keep 2 RUN`)
    says so with ``set_defaults(intermixed_args=True)``: plain argparse takes `gc` as every
    positional there is, and RUN as an unknown argument."""

    _mixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._mixing:  # parse_known_intermixed_args's own passes: extras are expected
            return super().parse_known_args(args, namespace)
        if self.get_default("intermixed_args"):
            self._mixing = True
            try:
                parsed, extras = self.parse_known_intermixed_args(args, namespace)
            finally:
                self._mixing = False
        else:
            parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser(modules: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser (every command module, or only `modules`)."""
    parser, sub = _top()
    for name in dict.fromkeys(MODULE.values()) if modules is None else modules:
        importlib.import_module(f"m27.cli.commands.{name}").register(sub)
    return parser


def overview_parser() -> argparse.ArgumentParser:
    """`m27` with its commands named and summed up but none imported: what ``m27 --help``
    shows and a mistyped command is checked against (``invalid choice: 'rnu' (choose
    from ...)``). It never runs a command: one named in argv gets :func:`build_parser`."""
    parser, sub = _top()
    for name, _, line in COMMANDS:
        sub.add_parser(name, help=line)
    return parser


def _top() -> tuple[_Parser, argparse._SubParsersAction[_Parser]]:
    parser = _Parser(
        prog="m27",
        description="Run YAML pipelines of cpu/gpu steps on Prefect, keep GPUs busy, "
        "checkpoint long jobs.",
        epilog="Exit codes: 0 success, 1 failure, 2 bad input. A bug in m27 says so in one "
        "line and saves its traceback in $M27_HOME/errors/. Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"m27 {__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND", required=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        from m27.cli import detach, warm, warm_client  # the node's warm runner, when one serves

        if not warm.in_child():  # (in its forked child the run runs here)
            if (rest := detach.detach_args(argv[1:])) is not None:
                return detach.launch(rest)  # `m27 run --detach`: its own session, then exit
            served = warm_client.run_warm(argv[1:])
            if served is not None:
                return served
    modules = _only(argv)
    parser = overview_parser() if modules is None else build_parser(modules)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except SpecError as exc:
        # bounded like `m27 validate`: the first problems, then how many more
        from m27.spec import problem_lines  # here: `m27 --version` stays free of yaml

        if not exc.context.get("problems"):
            print(f"m27: {exc}", file=sys.stderr)
            return 2
        # as `m27 validate` shows them: `file:line:column: field: message` on every line
        # (an `m27: ` before the first one broke that line for editors and tools)
        for line in problem_lines(exc):
            print(line, file=sys.stderr)
        total = exc.context.get("total", len(exc.context["problems"]))
        print(f"{total} problem(s) found", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"m27: {exc}", file=sys.stderr)
        return 2
    except M27Error as exc:
        print(f"m27: {exc}", file=sys.stderr)
        # Bad input (an unknown or ambiguous run id, ...) says so with exit_code = 2.
        return exc.exit_code
    except KeyboardInterrupt:
        print("m27: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except OSError as exc:
        # a file m27 needs cannot be made or read (an unwritable M27_HOME, a full disk):
        # the path and the reason, never a traceback
        text, code = _os_error(exc)
        print(f"m27: {text}", file=sys.stderr)
        return code
    except Exception as exc:  # a bug in m27: one line, and where its traceback is
        return _internal_error(exc, argv)
    return code


def _internal_error(exc: Exception, argv: Sequence[str]) -> int:
    """An exception no command expects is a bug in m27: the user gets one line that names
    it and the file that holds its traceback, for a report, not forty lines of frames (a
    NameError in `m27 checkpoints` printed a traceback)."""
    import tempfile
    import time
    import traceback

    text = f"m27 {' '.join(argv)}\n" + "".join(traceback.format_exception(exc))
    saved = None
    for folder in (_errors_folder(), Path(tempfile.gettempdir())):
        if folder is None:
            continue
        path = folder / f"m27-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        try:
            path.write_text(text, encoding="utf-8")
        except OSError:
            continue
        saved = path
        break
    where = f"its traceback is in {saved}" if saved else "its traceback could not be saved"
    found = _log_misfit() if isinstance(exc, _VALUE_ERRORS) else None
    if found is not None:  # not a bug: a row of the log was changed by hand
        path, misfit = found
        print(
            f"m27: the event log {path} holds an event m27 did not write: {misfit}. It was "
            f"changed by hand or by another program: see it with `sqlite3 {path} "
            f'"select * from events where seq = {misfit.seq}"` and put back what m27 wrote, '
            "or stop the node service (`m27 agent stop`) and move the log aside to start a "
            f"new one, without its history ({type(exc).__name__}: {exc}; {where})",
            file=sys.stderr,
        )
        return 1
    print(
        f"m27: internal error: {type(exc).__name__}: {exc}; this is a bug in m27 ({where}; "
        "please report it)",
        file=sys.stderr,
    )
    return 1


#: What a value of the wrong type fails with where it is used: only these make the log's
#: check worth its read (seconds for a log of millions) before the line is said
_VALUE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError)


def _log_misfit() -> tuple[Path, Misfit] | None:
    """After a failure no command expects: the node's event log and its first event whose
    values do not hold its fields' types (m27.events.check), if there is one. Decoding does
    not check types, so a row edited by hand fails a command far from the cause."""
    from m27.config import m27_home
    from m27.events.check import first_misfit_in
    from m27.store.sqlite import LOG_NAME, open_store

    try:
        path = m27_home() / LOG_NAME
        if not path.is_file():
            return None
        store = open_store(path.parent)
        try:
            found = first_misfit_in(store.read)
        finally:
            store.close()
    except Exception:  # the log cannot be read either: the failure itself is said
        return None
    return None if found is None else (path, found)


def _errors_folder() -> Path | None:
    """$M27_HOME/errors, made if need be; None when it cannot be."""
    try:
        from m27.config import m27_home

        folder = m27_home() / "errors"
        folder.mkdir(parents=True, exist_ok=True)
    except (M27Error, OSError):
        return None
    return folder


#: errno of a write that found no room: a write's OSError names no file (`print` to a full
#: disk, `m27 runs > out.txt`), so the line says what failed, as coreutils do
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _cwd_exists() -> bool:
    """Whether the current folder is still there (os.getcwd fails once it is deleted)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


def _os_error(exc: OSError) -> tuple[str, int]:
    """The line for an OSError and the exit code: 2 (bad configuration) when the path lies
    in M27_HOME, whose setting is then named; 1 otherwise."""
    from m27.paths import m27_home

    name = exc.filename
    if name is None:
        if exc.errno in _WRITE_ERRORS:
            return f"write error: {exc.strerror}", 1
        if exc.errno == errno.ENOENT and not _cwd_exists():
            return "the current folder was deleted: cd to one that exists", 2
        return str(exc), 1
    path = os.fsdecode(name) if isinstance(name, str | bytes) else str(name)
    text = f"cannot use {path}: {exc.strerror or exc}"
    home = m27_home()
    if Path(path) == home or home in Path(path).parents:
        where = "M27_HOME" if "M27_HOME" in os.environ else "m27's home (M27_HOME unset)"
        return f"{text} ({where} is {home}: set M27_HOME to a folder m27 can write)", 2
    return text, 1


if __name__ == "__main__":
    sys.exit(main())
