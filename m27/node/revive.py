"""`on_crash: resume`: the node service resumes a run whose process died.

A power cut at 2 a.m. on a Saturday: the node boots, the node service starts (systemd's
`m27-agent.service`, or the first `m27` command), its crash watcher records the runs whose
process is gone as crashed, and a pipeline that says ``on_crash: resume`` is resumed then,
from its checkpoints, as ``m27 run --resume RUN --detach`` would (:mod:`m27.executors.resume`),
instead of waiting for Monday and a person.

Which crashed runs: those of this host whose pipeline said so and that no run resumes yet
(by hand, from Telegram, or already by the service). A resume that crashed again without
getting further (no step of it succeeded and none saved a checkpoint) is not resumed
again: whatever kills it would kill the next one the same way, as an attempt that stopped
early is not retried without a newer checkpoint (:mod:`m27.executors._guard`). A run
stopped on purpose is cancelled, not crashed (`m27 cancel`, Ctrl-C): never resumed.

:func:`to_resume` is a pure function of the node's state, so the service, its tests and a
reader of the log agree on it; :class:`Reviver` records each decision in the log
(``AutoResumeStarted``, ``AutoResumeSkipped``), so it is made once, and `m27 status` and
`m27 wait` read it.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from m27.events import AutoResumeSkipped, AutoResumeStarted
from m27.events.state import NodeState, RunState
from m27.executors.resume import RESUME_TIMEOUT_S, start_resume
from m27.store import EventStore
from m27.store.sqlite import open_store

__all__ = ["Revival", "Reviver", "progressed", "to_resume"]

_SAID = "m27 agent: on_crash: resume:"


@dataclass(frozen=True)
class Revival:
    """What the service does with one crashed run: resume it, or say once why not."""

    run_id: str
    resume: bool
    why: str = ""


def progressed(run: RunState) -> bool:
    """Whether `run` got further than where it began: a step of it succeeded or saved a
    checkpoint (a step skipped as done in the run it resumed did neither)."""
    return any(
        s.attempts > 0 and (s.status == "succeeded" or s.checkpoints > 0)
        for s in run.steps.values()
    )


def to_resume(state: NodeState, host: str, user: str, since: float) -> list[Revival]:
    """What to do with each run of `host` that crashed with ``on_crash: resume`` and that
    the service has not decided about yet (``AutoResumeStarted``/``AutoResumeSkipped``)
    and no run resumes yet: each decision is recorded, so it is made once.

    `since` keeps old crashes old: the service starts a while before its first pass (the
    command that started it may have recorded the crash), but a run that crashed months
    ago and was left so is not resumed because the service restarted. A run of another
    user than the service's (`user`: a shared `$M27_HOME` under systemd's `m27` user) is
    not resumed either: its steps would run as the service's user, in folders that are
    not its own."""
    resumed = {r.resume_of for r in state.runs.values() if r.resume_of}
    out = []
    for run in state.runs.values():
        if not run.crashed or run.on_crash != "resume" or run.host != host:
            continue
        if run.auto_resume or run.run_id in resumed:
            continue
        if run.ended_at is None or run.ended_at < since:
            why = "it crashed before this node service started; m27 run --resume resumes it"
            out.append(Revival(run.run_id, False, why))
            continue
        if run.owner and run.owner != user:
            why = (
                f"it is {run.owner}'s run and this service runs as {user}: its steps would "
                f"run as {user}; {run.owner} resumes it (m27 run --resume {run.run_id})"
            )
            out.append(Revival(run.run_id, False, why))
            continue
        if run.resume_of and not progressed(run):
            why = (
                f"it resumed {run.resume_of} and crashed again before any step of it saved a "
                "checkpoint or succeeded: another resume would end the same way"
            )
            out.append(Revival(run.run_id, False, why))
            continue
        out.append(Revival(run.run_id, True))
    return out


class Reviver:
    """The node service's part: each decision of :func:`to_resume` recorded in the log
    (so it is made once, and `m27 status` and `m27 wait` read it), each resume started in
    a thread of its own (it waits until its run is in the log), what came of it said on
    the service log, and a resume that started no run recorded as skipped."""

    def __init__(
        self, home: Path, store: EventStore, log: Callable[[str], None], since: float
    ) -> None:
        self.home, self.store, self.log, self.since = home, store, log, since
        self.host, self.user = socket.gethostname(), getpass.getuser()

    def step(self, state: NodeState, now: float) -> bool:
        """Decide about the runs `state` shows crashed; True when a resume started."""
        started = False
        for revival in to_resume(state, self.host, self.user, self.since):
            if not revival.resume:
                self.store.append([AutoResumeSkipped(now, revival.run_id, revival.why)])
                self.log(f"{_SAID} {revival.run_id} is not resumed: {revival.why}")
                continue
            by = f"node-service:{os.getpid()}"
            self.store.append([AutoResumeStarted(now, revival.run_id, by)])
            threading.Thread(
                target=self._resume, args=(revival.run_id,), name="m27-revive", daemon=True
            ).start()
            started = True
        return started

    def _resume(self, run_id: str) -> None:
        self.log(f"{_SAID} resuming crashed run {run_id}")
        done = start_resume(run_id)
        said = f": {done.said}" if done.said else ""
        if done.run_id is not None:
            ended = " (nothing was left to run: it ended at once)" if done.ended else ""
            self.log(f"{_SAID} {run_id} resumed as run {done.run_id}{ended}")
            return
        if done.timed_out:
            why = f"its resume was not in the log after {RESUME_TIMEOUT_S:.0f} s"
        elif done.code == 0:
            why = f"nothing to resume{said}"
        else:
            how = "could not start m27" if done.code is None else f"exit {done.code}"
            why = f"its resume failed ({how}){said}"
        self.log(f"{_SAID} {run_id}: {why}")
        store = open_store(self.home)  # this thread's own: the service's is the watcher's
        try:
            store.append([AutoResumeSkipped(time.time(), run_id, why)])
        finally:
            store.close()
