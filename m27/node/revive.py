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
reader of the log agree on it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from m27.events.state import NodeState, RunState

__all__ = ["Revival", "progressed", "to_resume"]


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


def to_resume(
    state: NodeState, host: str, user: str, seen: Collection[str], since: float
) -> list[Revival]:
    """The runs of `host` that crashed at `since` or later with ``on_crash: resume``, that
    no run resumes yet and that are not in `seen` (started or refused by this service).

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
        if run.ended_at is None or run.ended_at < since:
            continue
        if run.run_id in resumed or run.run_id in seen:
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
