"""`m27 run --detach`: start a run that outlives the terminal, and say how to follow it.

A week of MD started over ssh died with the laptop's lid: `m27 run` cancels its run on
SIGHUP (a closed terminal), as it does on Ctrl-C, and `nohup m27 run ... &` was the lore.
With ``--detach`` the command starts the same `m27 run` (the arguments without
``--detach``) as a process of its own session (no terminal, so no SIGHUP; stdin
``/dev/null``), its output in ``$M27_HOME/runs/<run>/run.out``, and waits only until the
run is in the node's event log: until then the child's output before the run's first line
(starting the node service, notes, a bad file's problems) is shown here, and a failure
exits with the child's code; from then on `m27 status`, `m27 logs -f RUN` (that output,
until the run's process exits: it holds the file's lock) and `m27 cancel` follow and stop
it. Nothing else changes: the child is an ordinary run (the node service's warm runner
serves it), so a kill -9 of it is recorded as a crash, as for any run.

The parent picks the run id (the child takes it from :data:`RUN_ENV`, which it removes
from its environment so the steps never see it): it can name the output file before the
child starts and look for that one run in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from m27 import runids
from m27.paths import home_problem, join_under, make_home

if TYPE_CHECKING:
    from m27.store.sqlite import SqliteEventStore

__all__ = ["OUT_NAME", "RUN_ENV", "detach_args", "given_run_id", "launch", "out_path", "writing"]

#: The detached run's output, in its folder ``$M27_HOME/runs/<run>/``.
OUT_NAME = "run.out"
#: The run id the parent chose, for the detached child's `m27 run`.
RUN_ENV = "M27_DETACHED_RUN"
#: `m27 run`'s options that take a value: the token after one is the value, not a flag.
_VALUED = frozenset({"--set", "--resume", "--rerun"})
_RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}\Z")
#: How often the parent looks at the log and relays the child's output.
_POLL_S = 0.1


def detach_args(args: Sequence[str]) -> list[str] | None:
    """`args` without ``--detach``/``-d`` when they ask to detach, else None.

    Read before argparse so that the waiting parent imports almost nothing; a value of
    ``--set`` (``--set X=-d``), anything after ``--``, and ``--help`` are not a detach."""
    rest: list[str] = []
    found = False
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            rest.append(token)
            rest.extend(tokens)
            break
        if token in ("-h", "--help"):
            return None
        if token in ("--detach", "-d"):
            found = True
            continue
        rest.append(token)
        if token in _VALUED and (value := next(tokens, None)) is not None:
            rest.append(value)
    return rest if found else None


def given_run_id() -> str | None:
    """The run id a detaching parent chose for this `m27 run`, taken out of the
    environment (the steps must not inherit it: a step's own `m27 run` is a new run)."""
    value = os.environ.pop(RUN_ENV, None)
    return value if value is not None and _RUN_ID.match(value) else None


def launch(args: list[str]) -> int:
    """Start `m27 run ARGS` detached; 0 once its run is in the log, else the child's exit
    code (bad input 2) with its output shown."""
    if "--dry-run" in args:
        print("m27 run: --detach with --dry-run: a dry run starts nothing", file=sys.stderr)
        return 2
    try:
        home = make_home()
    except OSError as exc:
        print(f"m27: {home_problem(os.environ.get('M27_HOME', '~/.m27'), exc)}", file=sys.stderr)
        return 2
    run_id = runids.new_run_id()
    out_path = join_under(home, "runs", run_id, OUT_NAME)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(out_path, "ab")  # noqa: SIM115 (the child's; closed here once it has it)
        # held while any process has this open file (the child, a warm runner's child it
        # hands its stdio to): `m27 logs -f RUN` follows the output until its writer is gone
        fcntl.flock(out.fileno(), fcntl.LOCK_EX)
    except OSError as exc:
        print(f"m27: cannot write {out_path}: {exc.strerror}", file=sys.stderr)
        return 1
    env = {**os.environ, RUN_ENV: run_id}
    with out:
        child = subprocess.Popen(
            [sys.executable, "-m", "m27.cli", "run", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # no terminal: its HUP cannot reach the run
        )
    try:
        return _wait(home, run_id, out_path, child)
    except KeyboardInterrupt:
        # before the run is in the log a Ctrl-C means "not now": the run is cancelled
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
        print(f"\nm27: interrupted (run {run_id} stops)", file=sys.stderr)
        return 130


def _wait(home: Path, run_id: str, out_path: Path, child: subprocess.Popen[bytes]) -> int:
    """Relay the child's output until its run is in the log (exit 0) or it exits."""
    from m27.store.sqlite import open_store

    relay = _Relay(out_path, run_id)
    store: SqliteEventStore | None = None
    try:
        while True:
            code = child.poll()
            if store is None and (home / "events.db").exists():
                store = open_store(home)
            submitted = _submitted(store, run_id) if store is not None else None
            relay.flush(final=code is not None)
            if submitted is not None:
                _say_detached(run_id, submitted, out_path, ended=code is not None)
                return 0
            if code is not None:  # it never ran: what it said is shown, nothing to keep
                with contextlib.suppress(OSError):
                    out_path.unlink()
                    out_path.parent.rmdir()
                return code
            time.sleep(_POLL_S)
    finally:
        if store is not None:
            store.close()


def _submitted(store: SqliteEventStore, run_id: str) -> str | None:
    """The run's Prefect flow-run address ('' without one) once it is in the log."""
    from m27.events import RunSubmitted

    for rec in store.read_runs((run_id,)):  # (before its submission: a few events)
        if isinstance(rec.event, RunSubmitted) and rec.event.run_id == run_id:
            return rec.event.prefect_url or ""
    return None


def _say_detached(run_id: str, prefect_url: str, out_path: Path, *, ended: bool) -> None:
    """The run id alone on stdout (`R=$(m27 run -d p.yaml)`, as `docker run -d` prints its
    container's), what to do with it on stderr."""
    print(run_id, flush=True)
    where = "ended already" if ended else "runs in the background"
    lines = [f"run {run_id} {where}; its output: {out_path}"]
    if prefect_url:
        lines.append(f"  prefect: {prefect_url}")
    lines += [
        f"  follow:  m27 logs -f {run_id}   m27 status {run_id}   m27 wait {run_id}",
        f"  stop:    m27 cancel {run_id}",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def out_path(home: Path, run_id: str) -> Path:
    """Where a run started with ``--detach`` writes its output."""
    return join_under(home, "runs", run_id, OUT_NAME)


def writing(path: Path) -> bool:
    """Whether a detached run's process still writes its output file `path` (it holds the
    file's lock until it exits, its summary written)."""
    try:
        with open(path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


class _Relay:
    """The child's output up to its run's first line (`run R: pipeline p (3 steps)`), to
    stderr: what comes before the run (starting the node service, notes, a bad file's
    problems) is for the terminal; the run's progress is in the file, for `m27 logs -f`."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.marker = f"run {run_id}: pipeline ".encode()
        self.offset = 0
        self.done = False

    def flush(self, final: bool = False) -> None:
        if self.done:
            return
        try:
            data = self.path.read_bytes()  # small: the lines before the run's first
        except OSError:
            return
        found = data.find(self.marker)
        if found >= 0:
            end = data.rfind(b"\n", 0, found) + 1
            self.done = True
        else:
            end = len(data) if final else data.rfind(b"\n") + 1  # whole lines until the end
        if end > self.offset:
            sys.stderr.buffer.write(data[self.offset : end])
            sys.stderr.flush()
            self.offset = end
