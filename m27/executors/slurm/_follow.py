"""Following one Slurm job to its end: state polls, output tails, starts, cancellation.

Time is the injected clock's (tests drive a FakeClock through requeues and lost
controllers without sleeping). A poll that fails is retried; the job is given up only
after ``LOST_AFTER_S`` without an answer, because abandoning a job that may have days of
work in it over a controller restart would be worse than waiting.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from m27.clock import Clock
from m27.events import SlurmJobStateChanged, StepStarted
from m27.executors._proc import LineSplitter
from m27.executors.local import Sink, StepLaunch
from m27.executors.slurm._jobs import REQUEUEABLE_STATES, JobInfo, SlurmCli, SlurmError
from m27.executors.slurm._script import SlurmOptions
from m27.store import EventStore

#: Seconds without an answer about the job (controller down, job forgotten) before the
#: attempt is given up as failed.
LOST_AFTER_S = 300.0
#: Seconds a requeueable end state (PREEMPTED, NODE_FAIL) must last before it counts:
#: a job submitted with --requeue usually goes back to PENDING within a poll or two.
SETTLE_S = 10.0
#: Seconds to wait for a cancelled job to end before reporting it cancelled anyway.
CANCEL_WAIT_S = 60.0
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class FollowResult:
    """The job's last known state; `lost` says why there is none; `cancelled` if m27 ended it."""

    info: JobInfo | None
    cancelled: bool = False
    lost: str | None = None


class FileTail:
    """New complete lines of a file that another machine may still be appending to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.splitter = LineSplitter()

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                lines: list[str] = []
                while data := f.read(_READ_CHUNK):
                    self.offset += len(data)
                    lines += self.splitter.feed(data, time.monotonic())
                return lines
        except FileNotFoundError:
            return []

    def finish(self) -> list[str]:
        return self.read() + self.splitter.finish()


@dataclass(frozen=True)
class StepJobs:
    """What every Slurm job of one step shares: the step, its event log and log lines,
    the cluster and the step's ``slurm:`` options."""

    launch: StepLaunch
    store: EventStore
    clock: Clock
    sink: Sink
    cli: SlurmCli
    opts: SlurmOptions
    log_path: Path


class Follower:
    """Polls one job until it ends; records its starts and state changes as events."""

    def __init__(
        self, jobs: StepJobs, *, job_id: str, job_dir: Path, attempt: int, argv: tuple[str, ...]
    ) -> None:
        self.jobs, self.job_id, self.attempt, self.argv = jobs, job_id, attempt, argv
        self.outputs = [
            (FileTail(job_dir / "stdout"), "stdout"),
            (FileTail(job_dir / "stderr"), "stderr"),
        ]
        self.starts = FileTail(job_dir / "starts")
        self.last: tuple[str, str] | None = None

    def follow(self, cancel: threading.Event | None) -> FollowResult:
        clock = self.jobs.clock
        info: JobInfo | None = None
        cancel_sent: float | None = None
        unanswered_since: float | None = None
        settle_since: float | None = None
        problem = ""
        while True:
            self._pump()
            try:
                now_info = self.jobs.cli.show(self.job_id)
            except SlurmError as exc:
                now_info, problem = None, str(exc)
            else:
                problem = f"Slurm no longer knows job {self.job_id}"
            now = clock.monotonic()
            if now_info is None:
                unanswered_since = now if unanswered_since is None else unanswered_since
                if now - unanswered_since >= LOST_AFTER_S:
                    self._drain()
                    lost = (
                        f"lost track of Slurm job {self.job_id} for {LOST_AFTER_S:.0f}s: {problem}"
                    )
                    return FollowResult(info, cancelled=cancel_sent is not None, lost=lost)
            else:
                unanswered_since = None
                info = now_info
                self._record_state(info)
            if cancel is not None and cancel.is_set() and cancel_sent is None:
                cancel_sent = now
                try:
                    self.jobs.cli.cancel(self.job_id)
                    self.jobs.sink.note(f"scancel {self.job_id}")
                except SlurmError as exc:
                    self.jobs.sink.note(f"scancel {self.job_id} failed: {exc}")
            if info is not None and info.terminal and now_info is not None:
                settling = (
                    info.state in REQUEUEABLE_STATES
                    and self.jobs.opts.requeue
                    and cancel_sent is None
                )
                if not settling:
                    break
                settle_since = now if settle_since is None else settle_since
                if now - settle_since >= SETTLE_S:
                    break
            else:
                settle_since = None
            if cancel_sent is not None and now - cancel_sent >= CANCEL_WAIT_S:
                self.jobs.sink.note(f"Slurm job {self.job_id} still not ended after scancel")
                break
            clock.sleep(self.jobs.opts.poll)
        self._drain()
        return FollowResult(info, cancelled=cancel_sent is not None)

    def _record_state(self, info: JobInfo) -> None:
        key = (info.state, info.reason)
        if key == self.last:
            return
        self.last = key
        reason = info.reason
        if info.restarts and info.state == "PENDING":
            reason = f"requeued (restart {info.restarts})" + (f": {reason}" if reason else "")
        self.jobs.store.append(
            [
                SlurmJobStateChanged(
                    **self.jobs.launch.head(self.jobs.clock.now()),
                    job_id=self.job_id,
                    state=info.state,
                    reason=reason,
                )
            ]
        )

    def _pump(self, final: bool = False) -> None:
        # The job script writes its `starts` line before the command runs: reading it
        # first records StepStarted before the first output line of that start is shown.
        for line in self.starts.finish() if final else self.starts.read():
            self._started(line)
        for tail, stream in self.outputs:
            lines = tail.finish() if final else tail.read()
            if lines:
                self.jobs.sink.emit(stream, lines)

    def _drain(self) -> None:
        self._pump(final=True)
        self.jobs.sink.flush()

    def _started(self, line: str) -> None:
        """One line of the job's ``starts`` file: restart count, host, GPUs, checkpoint."""
        parts = [*line.split("\t"), "", "", ""][:4]
        restart, host, gpus_text, resume = parts
        gpus = tuple(int(g) for g in gpus_text.split(",") if g.strip().isdigit())
        if restart not in ("", "0"):
            self.jobs.sink.write(
                f"=== Slurm job {self.job_id} restarted ({restart}) on {host}, resuming from "
                f"{resume or 'the beginning'} ===\n"
            )
        self.jobs.store.append(
            [
                StepStarted(
                    **self.jobs.launch.head(self.jobs.clock.now()),
                    attempt=self.attempt,
                    pid=0,
                    pgid=0,
                    command=self.argv,
                    gpus=gpus,
                    log_path=str(self.jobs.log_path),
                    resume_from=resume or None,
                    host=host,
                )
            ]
        )
