"""The warm runner: `m27 run` without importing Prefect in every run.

Importing Prefect, the flow and m27's executors costs a run 1-3 s of CPU, 10-30x `m27
--version`. The node service therefore keeps one process that has imported all of it
(``python -m m27.cli --warm-runner HOME``, started and supervised by :mod:`m27.node.serve`)
and forks it per run. A later `m27 run` on the node is a thin client
(:func:`m27.cli.warm_client.run_warm`): it sends its arguments, environment, working
directory and its stdin/stdout/stderr (the file descriptors themselves, ``SCM_RIGHTS``) over
a unix socket; the forked child runs the very same `m27 run` code
(:func:`m27.cli.main.main`, handed to :func:`serve_runner`) writing straight to the user's
terminal, and the runner reports the child's exit status back, so the client exits with it.

What a user sees stays the same as an in-process run:

- Ctrl-C, SIGTERM, SIGHUP, SIGQUIT and window resizes reaching the client are forwarded to
  the child, which handles them as `m27 run` always did (Ctrl-C, TERM and HUP cancel the
  run); one the client was started ignoring (`nohup`) is not;
- when the client dies (kill -9, the OOM killer, a closed ssh session) the child kills
  itself at once (it watches the socket), so the node service's crash watcher records the
  run crashed, stops its steps and marks it Crashed in Prefect, as for a killed run before;
- a child killed by a signal makes the client die of the same signal.

The client exits as soon as the run's end is in the event log and its summary printed
(:func:`release_client`): the child then finishes Prefect's part (the flow run's final
state, the summary artifact, the last log lines; 0.05-0.15 s) with its output back on the
runner's own log, so the next command does not wait for that bookkeeping.

The runner is used only when it can run exactly what the client would: the same Python and
m27, the same ``PREFECT_*`` settings (Prefect reads them at import), no ``--verbose``. In
every other case, and whenever no node service is ready yet (the first run after boot
starts it), the client returns None and `m27 run` runs in its own process as before.
The socket is in Linux's abstract namespace (no path-length limit for a deep
``$M27_HOME``); the runner serves only its own user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from m27.cli._stale import code_stamps, first_changed
from m27.cli.prefect_run import (
    check_server_version,
    complete_models,
    prefect_defaults,
    prefect_env,
    run_settings,
    small_ca_file,
)

__all__ = [
    "address",
    "in_child",
    "release_client",
    "runner_pid",
    "serve_runner",
]

#: Name of the file that tells a client (and `bench_startup.py`) the runner's pid.
INFO_NAME = "warm.json"
#: The signals a client passes on to the run.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH)
#: What the runner imports before it forks (the flow pulls in the executors and Prefect).
PRELOAD = (
    "m27.cli.commands.run",
    "flows.pipeline",
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect.client.orchestration",
    "prefect.logging.handlers",
    "prefect.events.worker",
    "prefect.artifacts",
    "prefect.utilities.visualization",
    "fastapi.encoders",  # Prefect serialises a flow's parameters with it (~1 s to import)
    "m27.node.crash",
    "m27.node.service",
    "m27.gpu.sim",
    "m27.notify.config",
)
_MAX_MESSAGE = 1 << 20
#: Contexts the runner entered for its whole life.
_KEPT: list[contextlib.AbstractContextManager[object]] = []
#: The forked child's request, while it runs (None outside a forked child).
_CHILD: _Child | None = None


def in_child() -> bool:
    """True in a forked child: its `m27 run` runs here instead of asking a runner again."""
    return _CHILD is not None


def release_client(code: int) -> bool:
    """In a forked run: tell the client the run ended with `code`, so it exits now, and put
    this process's stdio back on the runner's log. False outside a forked run (nothing to
    release: the process that prints the summary is the one the user waits for)."""
    return _CHILD.release(code) if _CHILD is not None else False


def address(home: Path) -> bytes:
    """The runner's socket for `home`: abstract, named after the home's real path."""
    digest = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:24]
    return b"\0m27-warm-" + digest.encode()


def runner_pid(home: Path) -> int | None:
    """The pid of the warm runner serving `home`, or None (not started yet, or gone)."""
    from m27 import liveness

    try:
        pid = int(json.loads((Path(home) / INFO_NAME).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if liveness.alive(pid) else None


def _identity() -> dict[str, str]:
    import m27

    return {"python": sys.executable, "m27": str(Path(m27.__file__).resolve())}


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.send(json.dumps(message).encode())


# -- the runner ------------------------------------------------------------------------


class _Child:
    """A forked child's request: what it runs once the runner's loop has been left."""

    def __init__(self, conn: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
        self.conn = conn
        self.entry: Callable[[list[str]], int] | None = None
        self.fds = fds
        self.request = request
        #: set once the client was told the exit code: its end is no longer a crash
        self.released = False
        self.own: list[int] = []

    def run(self) -> int:
        """Become the client's `m27 run`: its stdio, directory, environment and arguments."""
        global _CHILD
        _CHILD = self
        self.own = [os.dup(fd) for fd in (0, 1, 2)]  # the runner's: back after release()
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        _reopen_stdio()
        request = self.request
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        threading.Thread(target=self._watch, name="m27-warm-client", daemon=True).start()
        assert self.entry is not None
        try:
            return self.entry(list(request["args"]))
        except SystemExit as exc:  # argparse: --help, a usage error
            code = exc.code
            if code is None or isinstance(code, int):
                return code or 0
            print(code, file=sys.stderr)
            return 1

    def _watch(self) -> None:
        """The client's end: EOF means it died, so the run dies too (crash truth)."""
        while True:
            try:
                data = self.conn.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                if not self.released:
                    os.kill(os.getpid(), signal.SIGKILL)
                return

    def release(self, code: int) -> bool:
        """See :func:`release_client`."""
        if self.released:
            return True
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        self.released = True
        with contextlib.suppress(OSError):  # the client is gone already
            _send(self.conn, {"exit": code})
        for target, fd in enumerate(self.own):
            os.dup2(fd, target)  # Prefect's last lines go to the runner's log, not the terminal
            os.close(fd)
        self.own = []
        return True


def _reopen_stdio() -> None:
    """New stdio objects over fds 0-2, buffered as Python buffers a terminal or a pipe."""
    out_tty = os.isatty(1)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=sys.stdin.encoding)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding=sys.stdout.encoding,
        errors=sys.stdout.errors,
        line_buffering=out_tty,
        write_through=out_tty,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding=sys.stderr.encoding,
        errors="backslashreplace",
        line_buffering=True,
    )


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class _Runner:
    """The runner's loop: accept a request, fork, report the child's end to its client."""

    def __init__(self, home: Path, parent: int) -> None:
        self.home = home
        self.me = os.getpid()
        #: the node service: the runner ends when it does (also PR_SET_PDEATHSIG, set by it)
        self.parent = parent
        self.identity = _identity()
        self.prefect = prefect_env(dict(os.environ))
        self.stop = False
        #: m27's files as imported; once one changed, no run is taken, and the runner ends
        #: when its runs have (the node service starts a new one on the new code)
        self.code = code_stamps()
        self.stale: str | None = None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(address(home))
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        #: pidfd -> (pid, the client's connection)
        self.children: dict[int, tuple[int, socket.socket]] = {}

    def serve(self) -> _Child | None:
        """Serve until told to stop (None), or return the request in a forked child."""
        info = self.home / INFO_NAME
        info.write_text(json.dumps({"pid": self.me}) + "\n")
        try:
            while not self.stop and os.getppid() == self.parent:
                if self.stale and not self.children:
                    print(f"m27 warm runner: {self.stale} changed on disk; exiting", flush=True)
                    return None
                for key, _ in self.selector.select(timeout=1.0):
                    if key.data is None:
                        child = self._accept()
                        if child is not None:
                            return child
                    else:
                        self._reap(key.fd)
            return None
        finally:
            if os.getpid() == self.me:
                self._close()
                if info.exists() and json.loads(info.read_text()).get("pid") == self.me:
                    info.unlink()

    def _close(self) -> None:
        self.selector.close()
        self.listener.close()
        for pidfd, (_, conn) in self.children.items():
            os.close(pidfd)
            conn.close()

    def _accept(self) -> _Child | None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            if _peer_uid(conn) != os.getuid():
                conn.close()
                return None
            conn.settimeout(10.0)
            data, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
            conn.settimeout(None)
            request = json.loads(data)
            why = self._refusal(request, fds)
            if why:
                _send(conn, {"refused": why})
                raise ValueError(why)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            self._close()  # the child keeps only its own connection and stdio
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            return _Child(conn, fds, request)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        with contextlib.suppress(OSError):  # a client gone already: the child notices, ends
            _send(conn, {"pid": pid})
        return None

    def _refusal(self, request: dict[str, Any], fds: list[int]) -> str:
        """Why the run cannot be forked from here ("" when it can); a run the runner takes
        uses the node service's Prefect API unless it names the same one itself."""
        from m27.node.info import find_service, touch

        if len(fds) != 3:
            return "stdin, stdout and stderr are needed"
        for key, value in self.identity.items():
            if request.get(key) != value:
                return f"a different {key}: {request.get(key)!r}"
        self.stale = self.stale or first_changed(self.code)
        if self.stale:
            return f"m27 changed on disk since the runner started ({self.stale})"
        info = find_service(self.home)
        if info is None or info.state != "ready":
            return "the node service is not ready"
        env = request.get("env")
        if not isinstance(env, dict):
            return "no environment"
        env.setdefault("PREFECT_API_URL", info.url)
        if prefect_env(env) != self.prefect:
            return "different PREFECT_* settings"
        touch(self.home)  # a run counts as the service's activity (idle stop)
        return ""

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status, _ = os.wait4(pid, 0)
        message = (
            {"signal": os.WTERMSIG(status)}
            if os.WIFSIGNALED(status)
            else {"exit": os.waitstatus_to_exitcode(status)}
        )
        with contextlib.suppress(OSError):
            _send(conn, message)
        conn.close()

    def on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True


def serve_runner(argv: list[str], entry: Callable[[list[str]], int]) -> int:
    """``python -m m27.cli --warm-runner HOME SERVICE_PID``: import everything a run needs,
    then serve; a forked child runs `entry` (the `m27` command's main) with its client's
    arguments."""
    home = Path(argv[0])
    parent = int(argv[1]) if len(argv) > 1 else os.getppid()
    prefect_defaults(os.environ, verbose=False)  # before Prefect reads its settings
    import importlib

    from m27.events import prepare_codecs

    for name in PRELOAD:
        importlib.import_module(name)
    complete_models()
    prepare_codecs()  # every event class's codec plan, inherited by every forked run
    # Entered for the runner's life, so every forked run inherits it (the object is kept:
    # a collected generator context would exit).
    from m27.node.info import find_service

    info = find_service(home)
    _KEPT.append(run_settings(small_ca_file(home), own_server=bool(info and info.own_server)))
    _KEPT[-1].__enter__()
    check_server_version()
    # Everything imported so far lives as long as the runner: out of the collector's sight
    # (gc.freeze), a forked run neither scans those objects in its collections nor, by
    # scanning them, copies the pages they are on.
    gc.collect()
    gc.freeze()
    runner = _Runner(home, parent)
    signal.signal(signal.SIGTERM, runner.on_term)
    print(f"m27 warm runner: pid {os.getpid()} ready", flush=True)
    child = runner.serve()
    if child is None:
        return 0
    child.entry = entry
    return child.run()
