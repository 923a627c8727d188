"""One run's shared context in the flow process, and what each step task starts.

Split out of :mod:`flows.pipeline`: ``_Run`` (what the step tasks of a run share), the
cancel watcher, the checkpoint artifacts, and the step's launch (engine recipe, container).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m27 import StoreError
from m27.checkpoint import artifact_for, latest_checkpoint
from m27.config import load_settings
from m27.events import (
    CancelRequested,
    CheckpointWritten,
    Event,
    GuestStarted,
    Promoted,
    SlurmJobStateChanged,
    SlurmJobSubmitted,
    StepFailed,
    StepRequeued,
    StepStarted,
    StepSucceeded,
)
from m27.events.holds import Hold
from m27.events.state import fold
from m27.executors.container import wrap_argv
from m27.executors.engines import plan_for_step
from m27.executors.local import SelfCheckpoint, StepLaunch
from m27.node.lease import AgentLease, lease_wanted
from m27.paths import join_under
from m27.signals import SignalRelay
from m27.spec import Pipeline, Step
from m27.store import EventStore
from m27.units import format_duration, format_size


@dataclass
class _Run:
    """Everything the step tasks of one run share (never passed through Prefect)."""

    run_id: str
    pipeline: Pipeline
    store: EventStore
    home: Path
    lease: AgentLease
    resume_dirs: list[Path]
    #: steps a resume runs again from the start (:meth:`Pipeline.rerun_for_outputs`): the
    #: checkpoints they left where they succeeded are of a finished step
    fresh: frozenset[str] = frozenset()
    cancel: threading.Event = field(default_factory=threading.Event)
    #: the log's last sequence number before this run's RunSubmitted (for its summary)
    first_seq: int = 0
    #: bytes of each step's output sent to Prefect's logs (config prefect_log_limit)
    prefect_log_limit: int = 10 * 1024 * 1024
    #: who asked the run to stop (CancelRequested.by of the first request), "" if none
    cancelled_by: str = ""
    #: each step's stop flag (:meth:`stop_of`)
    stops: dict[str, StepStop] = field(default_factory=dict)

    def stop_of(self, step: str) -> StepStop:
        """`step`'s stop flag: what its runner watches (the run's cancel trips it too)."""
        return self.stops.setdefault(step, StepStop(self.cancel))

    def append(self, *events: Event) -> None:
        self.store.append(list(events))

    def checkpoint_dir(self, step: str) -> Path:
        return join_under(self.home, "checkpoints", self.run_id, step)

    def resume_from(self, step: str) -> str | None:
        """Newest valid checkpoint of `step`: this run's own first (retries), then the runs
        it resumes, newest first."""
        earlier = [] if step in self.fresh else self.resume_dirs
        for base in [join_under(self.home, "checkpoints", self.run_id), *earlier]:
            found = latest_checkpoint(join_under(base, step))
            if found is not None:
                return str(found)
        return None


class StepStop(threading.Event):
    """One step's stop flag: set by `m27 cancel RUN STEP`, and read as set once the whole
    run is cancelled (the runners only ask ``is_set``)."""

    def __init__(self, run_cancel: threading.Event) -> None:
        super().__init__()
        self._run_cancel = run_cancel

    def is_set(self) -> bool:
        return super().is_set() or self._run_cancel.is_set()


def record_failed(run: _Run, name: str, reason: str) -> None:
    """Record `name` failed unless the log already has its end (an error after it)."""
    state = fold(run.store.read_runs((run.run_id,), after=run.first_seq))
    found = state.runs[run.run_id].steps.get(name) if run.run_id in state.runs else None
    if found is not None and found.done:
        return
    began = found.started_at if found is not None else None
    run.append(
        StepFailed(
            at=time.time(),
            run_id=run.run_id,
            step=name,
            attempt=max(1, found.attempts if found is not None else 1),
            duration_s=time.time() - began if began is not None else 0.0,
            reason=reason,
        )
    )


def _watch_cancel(run: _Run, stop: threading.Event) -> None:
    """Turn a CancelRequested for this run (from any process) into the cancel flag."""
    try:
        after = run.store.last_seq()
        while not stop.is_set() and not run.cancel.is_set():
            # short follows: the flow's end joins this thread (a run's exit path)
            for rec in run.store.follow(after, timeout=0.05):
                after = rec.seq
                ev = rec.event
                if isinstance(ev, CancelRequested) and ev.run_id == run.run_id:
                    if ev.step:  # `m27 cancel RUN STEP`: that step alone
                        run.stop_of(ev.step).set()
                        continue
                    run.cancelled_by = run.cancelled_by or ev.by
                    run.cancel.set()
    except StoreError:  # the flow meets the same error on its next append and ends the run
        return


#: Signals to the flow's process that cancel its run: a stop (`kill`, systemd, Slurm's
#: TERM before its KILL) and a closed terminal (HUP).
CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def cancel_on_signals(run: _Run) -> Callable[[], None]:
    """While the flow runs, SIGTERM or SIGHUP to its process cancel the run, as `m27
    cancel` does: the steps get their TERM and grace (a checkpoint at stop), the run ends
    cancelled and can be resumed. Prefect's engine turned SIGTERM into a crash, then
    waited for the steps to end by themselves; HUP killed the process and left its steps
    running. A signal the process ignores (HUP under `nohup`) is left ignored. Returns
    what puts the previous handlers back (only the main thread can install them:
    elsewhere this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def cancel(signum: int) -> None:
        name = signal.Signals(signum).name
        with contextlib.suppress(StoreError):  # the flow ends on the same error
            run.append(CancelRequested(at=time.time(), run_id=run.run_id, by=name))

    relay = SignalRelay(cancel)  # not in the handler: it may land while the store is locked
    # one ignored stays ignored: `nohup m27 run` goes on when its terminal closes
    previous = relay.install(s for s in CANCEL_SIGNALS if signal.getsignal(s) != signal.SIG_IGN)

    def restore() -> None:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)  # type: ignore[arg-type]
        relay.close()

    return restore


class _StepLog:
    """What a step's task run shows in Prefect besides its output: a checkpoint artifact
    per committed checkpoint, and where the step runs (node, GPUs, attempt, Slurm job and
    why Slurm holds it) as log lines; the UI showed only the output.

    `catch_up` runs in the task's thread (artifacts need its context). Each batch of
    output first calls `before_output` from the output reader's thread, which tells the
    step's events recorded since, so `started (...)` comes before the step's first line
    (not up to a poll later), and a retry's `failed (attempt 1): ... - retrying` and
    `started (attempt 2, ...)` before the second attempt's first line; with nothing new
    in the log it costs one look at its last number (~8 us a batch).
    """

    def __init__(self, run: _Run, step: str, logger: Any) -> None:
        self.run = run
        self.step = step
        self.logger = logger
        self.after = self.early = run.store.last_seq()
        #: the step's success, once told: the task's final state says what it says
        self.succeeded: StepSucceeded | None = None
        #: its holds as a guest while its GPU's primary computed
        self.hold = Hold()
        self._told: set[int] = set()
        self._lock = threading.Lock()

    def _mine(self, ev: Event) -> bool:
        return getattr(ev, "run_id", None) == self.run.run_id and (
            getattr(ev, "step", None) == self.step
        )

    def _tell(self, seq: int, ev: Event) -> None:
        with self._lock:
            if seq in self._told:
                return
            self._told.add(seq)
            if isinstance(ev, StepSucceeded):
                self.succeeded = ev
            self.hold.apply(ev)
            if (said := _milestone(ev, self._retry_delay())) is not None:
                warn = isinstance(ev, StepFailed | StepRequeued)
                (self.logger.warning if warn else self.logger.info)("%s", said)

    def _retry_delay(self) -> float:
        return self.run.pipeline.step(self.step).retry_delay

    def before_output(self) -> None:
        try:
            if self.run.store.last_seq() <= self.early:
                return
            for rec in self.run.store.read(self.early):
                self.early = rec.seq
                if self._mine(rec.event):
                    self._tell(rec.seq, rec.event)
        except StoreError:  # the output goes on; `catch_up` tells these lines later
            return

    def catch_up(self) -> None:
        from prefect.artifacts import create_markdown_artifact

        for rec in self.run.store.read(self.after):
            self.after = rec.seq
            ev = rec.event
            if not self._mine(ev):
                continue
            self._tell(rec.seq, ev)
            if isinstance(ev, CheckpointWritten):
                key, markdown = artifact_for(ev)
                try:
                    create_markdown_artifact(
                        markdown, key=key, description=f"checkpoint of {self.step}"
                    )
                except Exception as exc:  # the checkpoint is durable; the UI entry is a bonus
                    self.logger.warning("could not register checkpoint artifact: %s", exc)


def waiting_line(step: str, gpus: int) -> str:
    """What a step's Prefect task log says when its lease has not come after WAIT_TOLD_S:
    the task is Running in the UI from the moment it asks, and nothing told that it had
    not started (a Slurm step's log says why Slurm holds it)."""
    host = socket.gethostname()
    return f"waiting for {lease_wanted(gpus)} on {host} (`m27 queue --why {step}` there says why)"


def _milestone(ev: Event, retry_delay: float = 0.0) -> str | None:
    """The line a step's event puts in its Prefect task log, if any. A failed attempt
    followed by another is said here (the task's state says only how the last ended);
    `retry_delay` is the step's wait before it."""
    if isinstance(ev, StepStarted):
        where = f"GPU {','.join(map(str, ev.gpus))}" if ev.gpus else "CPU"
        proc = f"pid {ev.pid}" if ev.pid else "in Slurm"
        on = f" on {ev.host}" if ev.host else ""
        resumed = f", resuming from {ev.resume_from}" if ev.resume_from else ""
        return f"started (attempt {ev.attempt}, {proc}{on}, {where}{resumed})"
    if isinstance(ev, StepRequeued):
        return ev.line()
    if isinstance(ev, GuestStarted):
        return (
            f"a guest on GPU {ev.gpu}, beside the GPU's primary: it computes in the "
            "primary's I/O waits and is held while the primary computes"
        )
    if isinstance(ev, Promoted):
        return f"promoted to primary on GPU {ev.gpu} (its primary is done)"
    if isinstance(ev, StepFailed) and ev.will_retry:
        again = f" in {format_duration(retry_delay)}" if retry_delay > 0 else ""
        return f"failed (attempt {ev.attempt}): {ev.reason} - retrying{again}"
    if isinstance(ev, SlurmJobSubmitted):
        return f"submitted as Slurm job {ev.job_id} (attempt {ev.attempt})"
    if isinstance(ev, SlurmJobStateChanged) and ev.state == "PENDING" and ev.reason:
        return f"Slurm job {ev.job_id} pending: {ev.reason}"
    return None


class _PrefectOutput:
    """A step's output in its Prefect task run log: the lines of one read as one record,
    up to `limit` bytes per step, then one warning that says where the rest is.

    A record per line cost ~100 us per line on the thread that reads the step's pipe, so
    `seq 1 2000000` ran 3m23s instead of a blink, and it left two million rows for the
    node's shared Prefect server to write for minutes after the run had ended."""

    def __init__(self, logger: Any, limit: int, run_id: str, step: str) -> None:
        self.logger = logger
        self.limit = limit
        self.where = f"m27 logs {run_id} {step}"
        self.sent = 0
        self.cut = False

    def add(self, stream: str, lines: list[str]) -> None:
        if self.cut or not lines:
            return
        text = "\n".join(lines)
        size = len(text.encode("utf-8", "replace"))
        if self.sent + size > self.limit:
            room, kept = self.limit - self.sent, []
            for line in lines:
                room -= len(line.encode("utf-8", "replace")) + 1
                if room < 0:
                    break
                kept.append(line)
            text = "\n".join(kept)
            self.cut = True
        self.sent += size
        if text:
            (self.logger.warning if stream == "stderr" else self.logger.info)("%s", text)
        if self.cut:
            self.logger.warning(
                "%s",
                f"the step's output after its first {format_size(self.limit)} is not sent"
                f" to Prefect (prefect_log_limit); all of it is in the step log: {self.where}",
            )


def _launch(run: _Run, step: Step, gpus: tuple[int, ...]) -> StepLaunch:
    """What the runner (or Slurm) starts; a `container:` step runs inside its image."""
    env = dict(step.env)
    env["M27_PIPELINE"] = run.pipeline.name
    argv, guarded, grace = _self_checkpoint(run, step)
    if step.container:
        argv = wrap_argv(argv, step.container, step.binds, gpus=step.uses_gpu)
    return StepLaunch(
        run_id=run.run_id,
        step=step.name,
        argv=argv,
        env=env,
        workdir=run.pipeline.workdir_of(step),
        timeout=step.timeout,
        retries=step.retries,
        retry_delay=step.retry_delay,
        outputs=tuple(step.outputs),
        gpus=gpus,
        checkpoint_dir=run.checkpoint_dir(step.name),
        checkpoint_interval=step.checkpoint,
        log_path=join_under(run.home, "runs", run.run_id, f"{step.name}.log"),
        grace=grace,
        self_checkpoint=guarded,
    )


def _self_checkpoint(run: _Run, step: Step) -> tuple[tuple[str, ...], SelfCheckpoint | None, float]:
    """The command with its engine recipe's options, what guards its files, the stop grace:
    a step that checkpoints (its own files, or `m27.Checkpointer` saving on
    `m27.watch_stop()`) gets `checkpoint_grace` to save after the stop signal, any other
    step 10 s."""
    plan = plan_for_step(step)
    if plan is None or not plan.files:
        argv = plan.argv if plan else tuple(step.argv)
        grace = load_settings().checkpoint_grace if step.checkpoint is not None else 10.0
        return argv, None, grace
    settings = load_settings()
    guarded = SelfCheckpoint(
        files=plan.files,
        resume=plan.resume,
        signal=plan.signal,
        recipe=plan.recipe,
        restore_from=tuple(join_under(d, step.name, "files") for d in run.resume_dirs),
        poll=settings.capture_poll,
        pipeline=run.pipeline.name,
        every=step.checkpoint,
    )
    return plan.argv, guarded, settings.checkpoint_grace
