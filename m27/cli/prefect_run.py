"""Prefect for a run: the settings `m27 run` uses, and what the warm runner prepares once.

Split from :mod:`m27.cli.warm` (the runner and its client): these are about Prefect, not
about forking. Nothing here imports Prefect at module level, so the warm client (which
imports this module for :func:`prefect_defaults`) stays light.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

__all__ = [
    "END_GRACE_S",
    "bound_prefect_end",
    "check_server_version",
    "complete_models",
    "prefect_defaults",
    "prefect_env",
    "prefect_late",
    "quiet_run_loggers",
    "run_settings",
    "silence_prefect",
    "small_ca_file",
]


def prefect_defaults(env: MutableMapping[str, str], *, verbose: bool) -> None:
    """Quiet, offline-safe Prefect defaults for a run; anything the user set wins."""
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("DO_NOT_TRACK", "1")
    if not verbose:
        env.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
        env.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
        env.setdefault("PREFECT_LOGGING_SERVER_LEVEL", "WARNING")


def quiet_run_loggers() -> None:
    """Flow and task run log records go to Prefect's API (the UI's logs), not also to the
    terminal: m27 prints each step's output and state itself.

    Prefect logs a step's stderr lines as WARNING, the level its console shows for
    `m27 run`, so each of them was printed twice (every progress line of `gmx mdrun -v`),
    with Prefect's own "Task run failed with state ..." after m27's line saying the same.
    Other Prefect warnings (an unreachable API) still reach the terminal. Called once
    Prefect has set up its logging (at import), which does not happen again in a run.
    """
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).propagate = False
    for name in ("EventsWorker", "APILogWorker"):  # Prefect's senders of events and logs
        logger = logging.getLogger(name)
        if _draining not in logger.filters:
            logger.addFilter(_draining)
    # what reaches the terminal through Prefect's own handlers (root's console, and its
    # internal loggers' stream)
    internal = logging.getLogger("prefect._internal")
    for handler in [*logging.getLogger().handlers, *internal.handlers]:
        if _TERSE not in handler.filters:
            handler.addFilter(_TERSE)


class _Terse(logging.Filter):
    """Prefect's own complaints at `m27 run`'s terminal, without tracebacks or repeats.

    With its API down (a lab server restarting during a run), Prefect logged every event
    it could not send as an ERROR with a traceback and the whole event, and a warning
    that it cannot connect each time it tried again: screens of it, around m27's lines.
    The first warning of each kind shows, in one line; the per-event errors do not (the
    warning says it); any other record keeps its message without the traceback."""

    def __init__(self) -> None:
        super().__init__()
        self._told: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if record.name.startswith("prefect._internal") and "failed to process item" in text:
            return False
        if record.levelno >= logging.WARNING and record.name.startswith("prefect"):
            key = f"{record.name}:{text[:40]}"
            if key in self._told:
                return False
            self._told.add(key)
        record.exc_info, record.exc_text = None, None
        return True


_TERSE = _Terse()


def silence_prefect() -> None:
    """Nothing Prefect logs from here on reaches the terminal: for a run aborted by a
    second Ctrl-C. Its end is recorded already; Prefect's threads are still ending as the
    interpreter shuts down, and said so with tracebacks (`Error emitting event:
    prefect.task-run.Cancelled ... can't register atexit after shutdown`) after `m27:
    interrupted`."""
    for name in ("prefect", "prefect._internal", "EventsWorker", "APILogWorker"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _draining(record: logging.LogRecord) -> bool:
    """False for "Still processing items: N items remaining...": Prefect's senders say
    it as they drain at exit, as a WARNING, after the run's summary (a loaded machine,
    a first run creating Prefect's database); the items are sent all the same. Their
    other warnings (a full queue dropping items) still show."""
    return not str(record.msg).startswith("Still processing items")


def run_settings(
    ca_file: Path | None = None, *, own_server: bool = False
) -> contextlib.AbstractContextManager[object]:
    """Prefect settings for a run, around its flow (and entered once for its whole life by
    the warm runner, so forked runs inherit them instead of each paying a settings copy,
    ~0.2 s of CPU):

    - no flow heartbeats: OSS Prefect does nothing with them, the node service's crash
      watcher is what marks a dead run Crashed, and joining their thread costs ~1 s;
    - with a plain ``http://`` API and a `ca_file` (the warm runner's, :func:`small_ca_file`),
      that file as Prefect's CA bundle: Prefect builds a certificate-verifying SSL context
      for each of a run's ~4 API clients, parsing a whole CA bundle each time (30-60 ms of
      CPU each here), though plain HTTP never uses it. A one-certificate bundle costs
      ~0.6 ms, and anything that did try TLS would still verify (against that one root);
    - with the node's `own_server` (started without CSRF protection, Prefect's default:
      m27.node.prefect_server.server_env), no CSRF token fetched by each API client.
    """
    from prefect.settings import (
        PREFECT_API_SSL_CERT_FILE,
        PREFECT_API_URL,
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    updates: dict[Any, Any] = {}
    if PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is not None:
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    url = PREFECT_API_URL.value() or ""
    # (its default is $SSL_CERT_FILE, a system's full bundle: only an explicit setting wins)
    if ca_file is not None and url.startswith("http://") and not _said("PREFECT_API_SSL_CERT_FILE"):
        updates[PREFECT_API_SSL_CERT_FILE] = str(ca_file)
    if own_server and PREFECT_CLIENT_CSRF_SUPPORT_ENABLED.value():
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
    if not updates:
        return contextlib.nullcontext()
    return temporary_settings(updates=updates)


def _said(name: str) -> bool:
    """Whether the user set Prefect setting `name` (its environment variable or profile)."""
    from prefect.settings import get_current_settings

    return name in os.environ or name in get_current_settings().to_environment_variables(
        exclude_unset=True
    )


def small_ca_file(home: Path) -> Path | None:
    """A CA bundle of one certificate (certifi's first) under `home`, for :func:`run_settings`;
    None when it cannot be written (runs then parse the full bundle, as before)."""
    import certifi

    marker = "-----END CERTIFICATE-----"
    try:
        bundle = Path(certifi.where()).read_text(encoding="ascii")
        start = bundle.index("-----BEGIN CERTIFICATE-----")
        pem = bundle[start : bundle.index(marker, start) + len(marker)] + "\n"
        path = home / "prefect" / "http-only-ca.pem"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(pem, encoding="ascii")
        os.replace(tmp, path)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return path


def check_server_version() -> None:
    """Prefect checks the API server's version once per process and API address (the HTTP
    clients and the events websocket each: 2 requests, 2 clients per run): done here,
    before forking, every forked run inherits the result. Both connections are closed
    again; a server that cannot be reached now is checked by each run instead."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.events.clients import PrefectEventsClient

    async def events() -> None:
        async with PrefectEventsClient():
            pass

    with contextlib.suppress(Exception), get_client(sync_client=True) as client:
        client.raise_for_api_version_mismatch_once()
    with contextlib.suppress(Exception):
        asyncio.run(events())


def prefect_env(env: Mapping[str, str]) -> dict[str, str]:
    """The settings Prefect reads at import: a run may use the runner only when they match."""
    return {k: v for k, v in env.items() if k.startswith("PREFECT_") or k == "DO_NOT_TRACK"}


def complete_models() -> None:
    """Build every pydantic model that Prefect defers (``defer_build``) now, once: a forked
    run would otherwise build the ~15 it touches itself, ~0.14 s of CPU per run."""
    from pydantic import BaseModel

    todo: list[type[BaseModel]] = [BaseModel]
    seen: set[type[BaseModel]] = set()
    while todo:
        for cls in todo.pop().__subclasses__():
            if cls not in seen:
                seen.add(cls)
                todo.append(cls)
    for cls in seen:
        if not cls.__pydantic_complete__:
            with contextlib.suppress(Exception):  # a model whose forward refs never resolve
                cls.model_rebuild()


#: Seconds `m27 run` waits, after the run's end is in the log and its summary printed, for
#: Prefect's part of the end (final states, summary artifact) before it exits anyway.
END_GRACE_S = 30.0


def bound_prefect_end(code: int) -> threading.Timer:
    """Exit with `code` if Prefect's part of the end takes more than END_GRACE_S: a lab
    server that went down during the run kept `m27 run` retrying for minutes after its
    summary, then ended it with a traceback. The node service tells Prefect how the run
    ended once it answers (m27.node.settle: the flow's process is gone by then). Cancel
    the timer returned once the flow has returned."""

    def give_up() -> None:
        prefect_late(f"has not taken the run's end after {END_GRACE_S:g} s")
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(END_GRACE_S, give_up)
    timer.daemon = True
    timer.start()
    return timer


def prefect_late(what: str) -> None:
    """Say on stderr that Prefect's server did not take the run's end (`what`)."""
    url = os.environ.get("PREFECT_API_URL", "")
    with contextlib.suppress(OSError):
        sys.stderr.write(
            f"m27: Prefect's server at {url} {what}; the node service tells it how the run "
            "ended once it answers\n"
        )
