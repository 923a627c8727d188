"""One agent per node: the lock, and the agent that `m27 run` embeds when none is running.

The lock is :class:`m27.locks.NodeLock` on ``$M27_HOME/agent.lock`` (an flock: the kernel
drops it when its process dies, ``kill -9`` included, so a crashed agent never blocks the
node); it is re-exported here for the agent's callers.

`m27 run` calls :func:`ensure_agent`: if the lock is free this process becomes the node's
agent (a daemon thread, stopped at the end of the run); if another process holds it, that
agent serves us. A process that waits for a lease, or holds one, retries the lock while it
waits (:class:`m27.node.lease.AgentLease`), so when the embedding `m27 run` ends, a
second one takes over and re-adopts the steps the first agent left running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from m27.config import load_settings
from m27.events import Event
from m27.gpu import detect
from m27.locks import NodeLock
from m27.node.agent import Agent, policy_config
from m27.node.report import Health
from m27.policy import Decision
from m27.store.sqlite import open_store

__all__ = ["EmbeddedAgent", "NodeLock", "build_agent", "ensure_agent", "running_embedded"]


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
    return Agent(
        open_store(home), detect(), home, config=config, on_decision=on_decision, health=health
    )


class EmbeddedAgent:
    """An agent running in a daemon thread of this process, holding the node lock."""

    def __init__(self, agent: Agent, lock: NodeLock) -> None:
        self.agent = agent
        self.lock = lock
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="m27-agent", daemon=True)

    def _main(self) -> None:
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
