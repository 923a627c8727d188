"""The warm runner's client: `m27 run` handed to the node's forked runner (m27.cli.warm).

:func:`run_warm` sends the run's arguments, environment, working directory and stdio over
the runner's socket, forwards signals to the forked child, and exits the way the child
did: with its exit code, or dying of the signal that killed it. Split from m27.cli.warm
(the runner side) so that each reads in one sitting; the protocol is described there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from types import FrameType

from m27.cli.prefect_run import prefect_defaults
from m27.cli.warm import _MAX_MESSAGE, FORWARDED, _identity, address


def run_warm(args: list[str]) -> int | None:
    """Run `m27 run ARGS` in the node's warm runner; its exit code, or None when it cannot
    (no runner, or it refused: no ready node service, a different Python, m27 or Prefect
    setting). Imports next to nothing: the runner checks the service, not the client."""
    if os.environ.get("M27_WARM", "1") == "0" or "--verbose" in args:
        return None
    from m27.paths import m27_home

    env = dict(os.environ)
    prefect_defaults(env, verbose=False)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address(m27_home()))
    except OSError:
        conn.close()
        return None
    with conn:
        return _client(conn, args, env)


def _client(conn: socket.socket, args: list[str], env: dict[str, str]) -> int | None:
    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], signum)
        else:
            pending.append(signum)

    # A signal the client was started ignoring stays ignored (`nohup m27 run`: a closed
    # terminal's HUP must not reach the run).
    previous = {
        s: signal.signal(s, forward) for s in FORWARDED if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        request = {
            **_identity(),
            "argv": [sys.argv[0] if sys.argv else "m27", "run", *args],
            "args": ["run", *args],
            "cwd": os.getcwd(),
            "umask": _umask(),
            "env": env,
        }
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        while True:
            data = conn.recv(_MAX_MESSAGE)
            if not data:
                if not child:
                    return None  # the runner went away before it started the run
                print(
                    "m27: the node service's runner stopped before the run ended; "
                    "`m27 status` says how it ended",
                    file=sys.stderr,
                )
                return 1
            message = json.loads(data)
            if "refused" in message:
                return None
            if "pid" in message:
                child.append(int(message["pid"]))
                for signum in pending:
                    forward(signum, None)
                pending.clear()
            elif "exit" in message:
                return int(message["exit"])
            elif "signal" in message:
                return _die_like(int(message["signal"]), child[0] if child else 0)
    except (OSError, ValueError):
        if child:
            raise
        return None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _die_like(signum: int, pid: int) -> int:
    """The run (flow process `pid`) died of `signum`: so does the client, as the shell and
    callers expect.

    Said first unless it was the user's own Ctrl-C (the run says `interrupted` then): a
    run killed from elsewhere (kill -9, the OOM killer) left the client silent, and for
    SIGKILL, whose handler cannot be set, with a traceback."""
    if signum != signal.SIGINT:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        run = _run_of(pid) or "RUN"
        print(
            f"m27: the run's process was killed ({name}); `m27 status {run}` shows how it "
            f"ended, `m27 run --resume {run}` goes on from it",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum


def _run_of(pid: int) -> str | None:
    """The newest run whose flow process was `pid`, from the node's log (every run's
    outline: its process, not its steps); None when it cannot be told."""
    from m27 import M27Error
    from m27.events.state import fold
    from m27.paths import m27_home
    from m27.store.sqlite import open_store

    try:
        store = open_store(m27_home())
        try:
            outline = fold(store.read_runs((), outline=True))
            runs = [r.run_id for r in outline.runs.values() if pid and r.pid == pid]
        finally:
            store.close()
    except M27Error:  # no readable log: the message names no run
        return None
    return runs[-1] if runs else None
