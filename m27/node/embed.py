"""One agent per node: the lock, and the agent that `m27 run` embeds when none is running.

The lock is :class:`m27.locks.NodeLock` on ``$M27_HOME/agent.lock`` (an flock: the kernel
drops it when its process dies, ``kill -9`` included, so a crashed agent never blocks the
node); it is re-exported here for the agent's callers.

`m27 run` calls :func:`ensure_agent`: if the lock is free this process becomes the node's
agent (a daemon thread, stopped at the end of the run); if another process holds it, that
agent serves us. A process that waits for a lease, or holds one, retries the lock while it
waits (:class:`m27.node.lease.AgentLease`), so when the embedding `m27 run` ends, a
second one takes over and re-adopts the steps the first agent left running.

The node service comes first: a service that finds the lock held (it was stopped, or
died, while runs went on, and one of them took the agent over) asks for it with
:func:`request_handover`. An embedded agent gives the lock back within a poll, and no
process embeds one while a live service waits, so the service's agent re-adopts the steps.
Before, a new service waited for the run that held the lock to end, days for an MD run,
and every `m27 run` meanwhile failed `the node service was not ready after 240s`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from m27 import liveness
from m27.config import load_settings
from m27.events import Event
from m27.gpu import detect
from m27.gpu.cpus import gpu_shares
from m27.locks import NodeLock
from m27.node.agent import Agent, policy_config
from m27.node.report import Health
from m27.policy import Decision
from m27.store.sqlite import open_store

__all__ = [
    "EmbeddedAgent",
    "NodeLock",
    "build_agent",
    "ensure_agent",
    "handover_wanted",
    "request_handover",
    "running_embedded",
    "withdraw_handover",
]

#: `$M27_HOME/agent.handover`: "PID START" of a node service waiting for the agent lock.
HANDOVER_NAME = "agent.handover"
#: How often an embedded agent looks for a waiting service.
HANDOVER_POLL_S = 0.25


def request_handover(home: Path) -> None:
    """Ask the process that holds the agent lock to give it to this one (a service)."""
    started = liveness.own_start_time()
    (Path(home) / HANDOVER_NAME).write_text(f"{os.getpid()} {started or 0}\n")


def withdraw_handover(home: Path) -> None:
    """This process no longer waits (it holds the lock now, or stopped waiting)."""
    path = Path(home) / HANDOVER_NAME
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().split()[0]) == os.getpid():
            path.unlink()


def handover_wanted(home: Path) -> bool:
    """Whether another live process (a node service) waits for the agent lock; a request
    left by a service that died is ignored."""
    try:
        pid_text, started_text = (Path(home) / HANDOVER_NAME).read_text().split()[:2]
        pid, started = int(pid_text), float(started_text)
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and liveness.alive(pid, started or None)


def build_agent(
    home: Path,
    *,
    on_decision: Callable[[Decision, Sequence[Event]], None] | None = None,
    **overrides: object,
) -> Agent:
    """An agent for `home` with the node's settings, GPU backend and event log."""
    settings = load_settings()
    config = policy_config(settings, **overrides)
    health = Health(temp_alert_c=settings.gpu_temperature)
    backend = detect()
    return Agent(
        open_store(home),
        backend,
        home,
        config=config,
        on_decision=on_decision,
        health=health,
        cpu_shares=gpu_shares(settings.gpu_cpus, backend),
    )


class EmbeddedAgent:
    """An agent running in a daemon thread of this process, holding the node lock."""

    def __init__(self, agent: Agent, lock: NodeLock) -> None:
        self.agent = agent
        self.lock = lock
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="m27-agent", daemon=True)

    def _yield_to_service(self) -> None:
        while not self._stop.wait(HANDOVER_POLL_S):
            if handover_wanted(self.agent.home):
                self._stop.set()  # the agent stops; `_main` gives the lock back

    def _main(self) -> None:
        watch = threading.Thread(target=self._yield_to_service, name="m27-handover", daemon=True)
        watch.start()
        try:
            self.agent.run(self._stop)
        except BaseException as exc:  # kept for stop() and for the logs
            self.error = exc
        finally:
            # Give the node back at once: a waiting process takes over within a poll.
            self.lock.release()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        with _guard:
            global _embedded
            if _embedded is self:
                _embedded = None
        self.agent.close()
        self.agent.store.close()
        self.lock.release()


_guard = threading.Lock()
_embedded: EmbeddedAgent | None = None


def running_embedded() -> EmbeddedAgent | None:
    """This process's embedded agent, if it runs one."""
    return _embedded if _embedded is not None and _embedded.alive else None


def ensure_agent(
    home: Path,
    *,
    on_decision: Callable[[Decision, Sequence[Event]], None] | None = None,
    **overrides: object,
) -> EmbeddedAgent | None:
    """Make sure the node has an agent: this process's (returned) or another's (None)."""
    global _embedded
    with _guard:
        if _embedded is not None and _embedded.alive:
            return _embedded
        if handover_wanted(home):
            return None  # a node service is about to take the node: it serves us
        lock = NodeLock(home)
        if not lock.acquire():
            return None
        try:
            agent = build_agent(home, on_decision=on_decision, **overrides)
            agent.start()
        except BaseException:
            lock.release()
            raise
        _embedded = EmbeddedAgent(agent, lock)
        _embedded.thread.start()
        return _embedded
