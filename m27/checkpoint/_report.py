"""Telling the node about checkpoints: events in its log, and the Prefect artifact text.

A checkpoint that is durable stays durable even if the log cannot be written: a failure
here is logged as a warning, never raised into the step.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from m27.checkpoint._writer import Committed
from m27.clock import Clock
from m27.events import CheckpointRestored, CheckpointWritten, Event
from m27.paths import slug
from m27.store import EventStore
from m27.units import format_duration, format_size

log = logging.getLogger("m27.checkpoint")


class Reporter:
    """Appends CheckpointWritten/CheckpointRestored for the step named by M27_RUN_ID/M27_STEP.

    With no store given, the node's log is opened for each event (from the writer thread;
    a checkpoint every few minutes does not justify holding a connection) and only when
    the runner set ``M27_RUN_ID``: a script run by hand writes no events.
    """

    def __init__(self, store: EventStore | None, clock: Clock) -> None:
        self.run_id = os.environ.get("M27_RUN_ID", "")
        self.step = os.environ.get("M27_STEP", "")
        self.pipeline = os.environ.get("M27_PIPELINE", "")
        #: what the events say was saved (the runner's file captures set "files")
        self.source = "arrays"
        self.files: tuple[str, ...] = ()
        #: the step the captured files record (a GROMACS .cpt's MD step), when known
        self.engine_step: int | None = None
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()

    def written(self, done: Committed) -> CheckpointWritten:
        event = CheckpointWritten(
            at=self._clock.now(),
            run_id=self.run_id,
            step=self.step,
            path=str(done.path),
            sim_step=done.sim_step,
            bytes_written=done.bytes_written,
            bytes_total=done.bytes_total,
            duration_s=done.duration_s,
            pipeline=self.pipeline,
            source=self.source,
            files=self.files,
            engine_step=self.engine_step,
        )
        self._append(event)
        return event

    def restored(self, path: Path, sim_step: int) -> None:
        self._append(
            CheckpointRestored(
                at=self._clock.now(),
                run_id=self.run_id,
                step=self.step,
                path=str(path),
                sim_step=sim_step,
            )
        )

    def _append(self, event: Event) -> None:
        try:
            with self._lock:
                if self._store is not None:
                    self._store.append([event])
                elif self.run_id:
                    from m27.store.sqlite import open_store

                    store = open_store()
                    try:
                        store.append([event])
                    finally:
                        store.close()
        except Exception as exc:
            log.warning("could not record %s in the event log: %s", event.kind, exc)


def artifact_key(pipeline: str, step: str) -> str:
    """``m27-ckpt-<pipeline>-<step>`` in the alphabet Prefect allows (a-z, 0-9, dashes)."""
    return slug(f"m27-ckpt-{pipeline}-{step}")


def _sim_step(event: CheckpointWritten) -> str:
    """The simulation step, as the program counts it: a capture's `sim_step` counts
    captures, its `engine_step` is the program's own (unknown for some engines)."""
    if event.source != "files":
        return str(event.sim_step)
    return "unknown" if event.engine_step is None else str(event.engine_step)


def artifact_for(event: CheckpointWritten) -> tuple[str, str]:
    """(artifact key, markdown) for the Prefect artifact of a committed checkpoint."""
    when = datetime.fromtimestamp(event.at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    share = 100.0 * event.bytes_written / event.bytes_total if event.bytes_total else 0.0
    title = f"### Checkpoint of `{event.step}` at step {event.sim_step}"
    if event.source == "files":
        title = f"### Checkpoint files of `{event.step}`: {', '.join(event.files)}"
    text = "\n".join(
        [
            title,
            "",
            "| field | value |",
            "|---|---|",
            f"| run | `{event.run_id}` |",
            f"| step | `{event.step}` |",
            f"| sim step | {_sim_step(event)} |",
            f"| time | {when} |",
            # sizes as the run log and `m27 checkpoints` print them (format_size), bytes after
            f"| written | {format_size(event.bytes_written)} ({event.bytes_written} bytes, "
            f"{share:.1f}% of the state) |",
            f"| state size | {format_size(event.bytes_total)} ({event.bytes_total} bytes) |",
            f"| durable after | {format_duration(event.duration_s)} |",
            f"| path | `{event.path}` |",
            "",
            (
                "`m27 run --resume` restores these files and adds the resume arguments."
                if event.source == "files"
                else f"Resume with `M27_RESUME_FROM={event.path}`."
            ),
        ]
    )
    return artifact_key(event.pipeline, event.step), text
