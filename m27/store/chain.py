"""What a resumed run inherits from the runs before it.

`m27 run --resume R` skips the steps that succeeded in R, in the run R resumed, and so
on back: the chain. The flow skips them, and `m27 run` notes what the skip leaves out (a
command edited since, an output deleted since); both read the chain here, so they agree.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from m27.events import StepSkipped
from m27.events.state import fold
from m27.store import EventStore
from m27.units import listed


@dataclass(frozen=True)
class Success:
    """Where a step of the chain last succeeded, and the command it ran there (empty when
    only a skip records it: its run is no longer in the log)."""

    run_id: str
    command: str


def chain(store: EventStore, run_id: str) -> list[str]:
    """`run_id` and the runs it resumes, newest first (a loop in the log ends the chain)."""
    runs = fold(store.read_runs((), outline=True)).runs  # every run as a whole
    found: list[str] = []
    current: str | None = run_id
    while current and current in runs and current not in found:
        found.append(current)
        current = runs[current].resume_of
    return found


def successes(store: EventStore, run_ids: list[str]) -> dict[str, Success]:
    """Each step that succeeded in one of `run_ids` (a :func:`chain`), where it last did."""
    state = fold(store.read_runs(run_ids))
    done: dict[str, Success] = {}
    for rid in run_ids:  # newest first: where each step last ran
        for name, step in state.runs[rid].steps.items():
            if step.status == "succeeded":
                done.setdefault(name, Success(rid, step.command))
    for rid in run_ids:  # a skip that says so: its own run may have left the log
        for name, step in state.runs[rid].steps.items():
            if step.status == "skipped" and StepSkipped.done_before(step.reason):
                done.setdefault(name, Success(StepSkipped.done_where(step.reason) or rid, ""))
    return done


def gone_note(step: str, gone: list[str], succeeded_in: str) -> str:
    """What a resume says of a step it runs again because its outputs are gone
    (:meth:`m27.spec.Pipeline.rerun_for_outputs`): `m27 run` on stderr, the flow in its log."""
    shown = listed(gone, 3)
    its = "its output" if len(gone) == 1 else "its outputs"
    are = "is" if len(gone) == 1 else "are"
    return (
        f"step {step} succeeded in run {succeeded_in}, but {its} {shown} {are} gone and a "
        "step that runs now needs it: it runs again, from the start"
    )


def rerun_note(asked: list[str], runs: list[str], own: Collection[str] = ()) -> str:
    """What a resume says of the steps `--rerun` runs again (`runs`:
    :meth:`m27.spec.Pipeline.rerun_steps` of `asked`), on stderr and in the flow's log;
    `own`: the steps `asked` names themselves (a matrix entry's name: the steps it made),
    not said to be waiting on them."""
    after = [name for name in runs if name not in asked and name not in own]
    note = (
        f"--rerun {', '.join(asked)}: {'it runs' if len(asked) == 1 else 'they run'} again "
        "from the start (no checkpoint of an earlier run is restored)"
    )
    if after:
        shown = listed(after, 10)
        them = "it" if len(asked) == 1 else "them"
        which = "does the step" if len(after) == 1 else "do the steps"
        note += f", and so {which} waiting on {them}: {shown}"
    return note
