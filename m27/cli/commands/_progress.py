"""Live progress of one run, built only from the event log (and step output lines).

In a terminal it is a rich table refreshed a few times a second; otherwise one plain line
per event, so logs of CI jobs and cron runs stay readable.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from m27.cli.commands._common import how_it_failed
from m27.events import (
    CancelRequested,
    CheckpointWritten,
    Event,
    GuestPaused,
    GuestResumed,
    GuestStarted,
    LeaseGranted,
    Promoted,
    Recorded,
    RunCancelled,
    RunFailed,
    RunSubmitted,
    RunSucceeded,
    SlurmJobStateChanged,
    SlurmJobSubmitted,
    StepCancelled,
    StepFailed,
    StepQueued,
    StepRequested,
    StepRequeued,
    StepSkipped,
    StepStarted,
    StepSucceeded,
)
from m27.events.holds import Hold
from m27.events.state import STEP_DONE, RunState
from m27.monitoring.energy import format_energy
from m27.node.lease import WAIT_TOLD_S, lease_wanted
from m27.spec import Pipeline
from m27.store import EventStore
from m27.units import count, format_duration, format_size

#: The live table is redrawn at least this often (elapsed times move on).
REDRAW_S = 0.2

_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "running": "cyan",
    "skipped": "yellow",
    "cancelled": "yellow",
    "queued": "white",
    "pending": "dim",
    "paused": "magenta",
}


def _guest(
    step: str, row: dict[str, Any], ev: GuestStarted | GuestPaused | GuestResumed | Promoted
) -> str | None:
    """A guest's life on its GPU: its first hold and its promotion get a line (a guest is
    held each time the primary computes, which may be every few seconds: those holds are
    summed into the step's end line instead), and the live table shows `paused`."""
    if row["status"] in STEP_DONE:
        return None  # the agent acted on the log before it read the step's end
    if isinstance(ev, GuestStarted):
        row["guest"] = ev.gpu
        return None
    if isinstance(ev, GuestPaused):
        if row["status"] != "running" or row["held_told"]:
            return None  # not started yet: its started line says it is held
        row["held_told"] = True
        return (
            f"{step}: held on GPU {ev.gpu} while the GPU's primary computes "
            "(a guest runs in the primary's I/O waits)"
        )
    if isinstance(ev, Promoted):
        row["guest"] = None
        return f"{step}: promoted to primary on GPU {ev.gpu} (its primary is done)"
    return None


class Progress:
    """Follows the log for one run and shows it; never blocks the run."""

    def __init__(
        self,
        store: EventStore,
        run_id: str,
        pipeline: Pipeline,
        *,
        live: bool,
        show_output: bool = True,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.pipeline = pipeline
        self.live = live
        self.show_output = show_output
        self.console = Console(highlight=False)
        self.rows: dict[str, dict[str, Any]] = {
            s.name: {
                "type": s.type,
                "status": "pending",
                "gpus": "",
                "since": None,
                "took": None,
                "last": "",
                "guest": None,  # the GPU it shares as a guest, until promoted or done
                "hold": Hold(),  # a guest held while its GPU's primary computes
                "held_told": False,  # the first hold has been shown (later ones are summed)
                "requested": None,  # (at, gpus) of its request for a lease, until granted
                "wait_told": False,
            }
            for s in pipeline.steps
        }
        self._stop = threading.Event()
        self._stopped = False
        self._ended = False  # the run's end event was applied: the follower has shown it all
        self._cancel_told = False
        self._thread = threading.Thread(target=self._follow, name="m27-progress", daemon=True)
        self._lock = threading.Lock()
        # Held while events are taken from the log and applied: the follower and a step's
        # first output line (`on_lines`) both take them, each event exactly once.
        self._feed = threading.Lock()
        self._live: Live | None = None
        self._after = store.last_seq()

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self.live:
            self._live = Live(
                self._table(), console=self.console, refresh_per_second=4, transient=False
            )
            self._live.start()
        else:
            self._print(
                f"run {self.run_id}: pipeline {self.pipeline.name} "
                f"({count(len(self.pipeline.steps), 'step')})"
            )
        self._thread.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()  # what the follower has not seen yet, _drain reads
        self._thread.join(timeout=2)
        self._drain()
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()

    # --- inputs ----------------------------------------------------------------------
    def on_lines(self, step: str, stream: str, lines: list[str]) -> None:
        """A step's lines of one read: printed with one write, however many there are."""
        if not lines:
            return
        with self._lock:
            row = self.rows.get(step)
            if row is not None:
                row["last"] = lines[-1][-80:]
            starting = row is not None and row["status"] != "running"
        if self.show_output and not self.live:
            if starting:
                # The step's StepStarted is in the log before its first line is read: show
                # "started" first, not whenever the follower wakes next.
                self._take(self.store.read(self._after))
            stamp = time.strftime("%H:%M:%S")
            write_out("".join(f"{stamp} [{step}] {line}\n" for line in lines))

    def note(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self._print(text)

    # --- following -------------------------------------------------------------------
    def _follow(self) -> None:
        # Short follows, so `stop` is not kept waiting (it is on the run's exit path); the
        # live table is rebuilt on new events and at most every REDRAW_S otherwise.
        drawn = 0.0
        while not self._stop.is_set():
            records = self.store.follow(self._after, timeout=0.05)
            self._take(records)
            if self._ended:
                return  # the run's end is shown; `stop` then drains what came after it
            self.tell_waits(time.time())
            now = time.monotonic()
            if self._live is not None and (records or now - drawn >= REDRAW_S):
                drawn = now
                self._live.update(self._table())

    def tell_waits(self, now: float) -> None:
        """Say once of each step that has waited WAIT_TOLD_S for its lease (`now`: wall
        time, as events' `at`) what it waits for, and where the reason is."""
        told = []
        with self._lock:
            for name, row in self.rows.items():
                asked = row["requested"]
                busy = row["status"] == "running" or row["status"] in STEP_DONE
                if asked is None or row["wait_told"] or busy:
                    continue
                if now - asked[0] >= WAIT_TOLD_S:
                    row["wait_told"] = True
                    what = lease_wanted(asked[1])
                    told.append(f"{name}: waiting for {what} (`m27 queue --why {name}` says why)")
        for text in told:
            self.note(text)

    def _drain(self) -> None:
        self._take(self.store.read(self._after))

    def _take(self, records: list[Recorded]) -> None:
        """Apply the records not applied yet, in order (two readers may overlap)."""
        with self._feed:
            for rec in records:
                if rec.seq > self._after:
                    self._after = rec.seq
                    self._apply(rec.event)

    def _apply(self, ev: Event) -> None:
        if getattr(ev, "run_id", None) != self.run_id:
            return
        step = getattr(ev, "step", None)
        row = self.rows.get(step) if isinstance(step, str) else None
        text: str | None = None
        with self._lock:
            if row is not None and row["status"] not in STEP_DONE:
                row["hold"].apply(ev)
            if isinstance(ev, RunSubmitted):
                if ev.prefect_url:
                    text = f"Prefect flow run: {ev.prefect_url}"
            elif isinstance(ev, CancelRequested) and ev.step:
                text = f"{ev.step}: cancel requested ({ev.by}); the run goes on without it"
            elif row is None:
                text = self._run_end(ev)
            elif isinstance(ev, StepQueued):
                row["status"] = "queued"
            elif isinstance(ev, StepRequested):
                row.update(requested=(ev.at, ev.gpus), wait_told=False)
            elif isinstance(ev, LeaseGranted):
                row["gpus"] = ",".join(map(str, ev.gpus)) or "cpu"
                row["requested"] = None
            elif isinstance(ev, SlurmJobSubmitted):
                row["job"] = ev.job_id
                text = f"{step}: submitted as Slurm job {ev.job_id} (attempt {ev.attempt})"
            elif isinstance(ev, SlurmJobStateChanged):
                # RUNNING shows as "started", the end as succeeded/failed; a wait in
                # Slurm's queue (Resources, Priority, a requeue) is worth a line.
                if ev.state == "PENDING" and ev.reason:
                    text = f"{step}: Slurm job {ev.job_id} pending: {ev.reason}"
            elif isinstance(ev, (GuestStarted, GuestPaused, GuestResumed, Promoted)):
                text = _guest(str(step), row, ev)
            elif isinstance(ev, StepStarted):
                row.update(status="running", since=ev.at)
                where = f"GPU {','.join(map(str, ev.gpus))}" if ev.gpus else "CPU"
                if row["guest"] is not None:
                    where += ", as a guest beside the GPU's primary"
                    if row["hold"].held and not row["held_told"]:
                        row["held_told"] = True
                        where += ", held while it computes"
                resumed = f", resuming from {ev.resume_from}" if ev.resume_from else ""
                # a Slurm step has no local pid (0): its job and node say where it runs
                job = f"Slurm job {row.get('job', '?')} on {ev.host}"
                proc = f"pid {ev.pid}" if ev.pid else job
                text = f"{step}: started (attempt {ev.attempt}, {proc}, {where}{resumed})"
            elif isinstance(ev, StepSucceeded):
                held = row["hold"].seconds()
                row.update(status="succeeded", took=ev.duration_s)
                text = f"{step}: succeeded in {format_duration(ev.duration_s)}"
                if held >= 0.5:
                    text += f" (held {format_duration(held)} as a guest)"
            elif isinstance(ev, StepFailed):
                row.update(status="queued" if ev.will_retry else "failed", took=ev.duration_s)
                again = " - retrying" if ev.will_retry else ""
                if ev.will_retry and (delay := self._retry_delay(ev.step)):
                    again += f" in {format_duration(delay)}"
                text = f"{step}: failed (attempt {ev.attempt}): {ev.reason}{again}"
            elif isinstance(ev, StepSkipped):
                row["status"] = "skipped"
                text = f"{step}: skipped ({ev.reason})"
            elif isinstance(ev, StepCancelled):
                row["status"] = "cancelled"
                text = f"{step}: cancelled"
            elif isinstance(ev, StepRequeued):
                row["status"] = "queued"
                text = f"{step}: {ev.line()}"
            elif isinstance(ev, CheckpointWritten):
                what = f"checkpoint at step {ev.sim_step}"
                if ev.source == "files":
                    at = "" if ev.engine_step is None else f" at step {ev.engine_step}"
                    what = f"captured {', '.join(ev.files)}{at} (#{ev.sim_step})"
                text = (
                    f"{step}: {what} "
                    f"({format_size(ev.bytes_written)} written, state "
                    f"{format_size(ev.bytes_total)})"
                )
        if text and not self.live:
            self._print(text)
        elif text and self._live is not None and not isinstance(ev, StepStarted):
            self._live.console.print(text)

    def _retry_delay(self, step: str) -> float:
        found = next((s for s in self.pipeline.steps if s.name == step), None)
        return found.retry_delay if found is not None else 0.0

    def _run_end(self, ev: Event) -> str | None:
        if isinstance(ev, CancelRequested) and not self._cancel_told:
            self._cancel_told = True
            return _cancelling(ev.by)
        if isinstance(ev, (RunSucceeded, RunFailed, RunCancelled)):
            self._ended = True
        if isinstance(ev, RunSucceeded):
            return f"run {self.run_id} succeeded in {format_duration(ev.duration_s)}"
        if isinstance(ev, RunFailed):
            return f"run {self.run_id} failed: {ev.reason}"
        if isinstance(ev, RunCancelled):
            return f"run {self.run_id} cancelled"
        return None

    # --- output ----------------------------------------------------------------------
    def _print(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        write_out(f"{stamp} {text}\n")

    def _table(self) -> Table:
        # Readable at 80 columns: the fixed columns keep their full width (a step name up to
        # 24 characters), "last output" takes what is left and is cut with an ellipsis.
        table = Table(
            title=f"{self.pipeline.name} / {self.run_id}", title_justify="left", expand=True
        )
        longest = max((len(name) for name in self.rows), default=4)
        table.add_column("step", no_wrap=True, overflow="ellipsis", min_width=min(longest, 24))
        table.add_column("type", no_wrap=True, min_width=len("gpu_light"))
        table.add_column("status", no_wrap=True, min_width=len("succeeded"))
        table.add_column("where", no_wrap=True, min_width=5)
        table.add_column("time", no_wrap=True, min_width=6)
        table.add_column("last output", no_wrap=True, overflow="ellipsis", ratio=1, min_width=8)
        now = time.time()
        with self._lock:
            for name, row in self.rows.items():
                took = row["took"]
                if took is None and row["since"] is not None:
                    took = now - row["since"]
                status = row["status"]
                if status == "running" and row["hold"].held:
                    status = "paused"  # a guest held while its GPU's primary computes
                table.add_row(
                    name,
                    row["type"],
                    f"[{_STYLE.get(status, 'white')}]{status}[/]",
                    row["gpus"],
                    format_duration(took) if took is not None else "",
                    row["last"],
                )
        return table

    def summary(self, run: RunState) -> None:
        """Final lines: each step's outcome, where its log is, and how to resume.

        Written to stdout itself, not with print(): a forked run prints it from inside the
        flow (m27.cli.warm.release_client), where Prefect's log_prints turns print() into
        log records."""
        _line()
        for name, st in run.steps.items():
            extra = ""
            if st.status == "failed":
                extra = f"  {how_it_failed(st.exit_code, st.signal, st.reason)}".rstrip()
            if st.energy_j:  # measured by the exporter from NVML energy counters
                extra += f"  {format_energy(st.energy_j)}"
            shown = st.status
            if st.done_before:
                shown = "succeeded"  # done already: a resumed run shows every step done
                where = StepSkipped.done_where(st.reason) or run.resume_of
                extra += f"  (in the earlier run {where})" if where else ""
            _line(f"  {shown:<10} {name}{extra}")
        finals = [s for s in self.pipeline.steps if not self.pipeline.dependents(s.name)]
        made = [
            str(self.pipeline.workdir_of(s) / o)  # relative to the step's folder
            for s in finals
            if run.steps[s.name].status == "succeeded"
            for o in s.outputs
        ]
        if made:
            _line("\noutputs: " + ", ".join(made))
        total = sum(st.energy_j for st in run.steps.values())
        if total:
            _line(f"\nenergy: {format_energy(total)} on GPUs")
        _line(f"\nrun {run.run_id}: {run.status}")
        _line(f"logs:   m27 logs {run.run_id} STEP")
        if run.status in ("failed", "cancelled"):
            _line(f"resume: m27 run --resume {run.run_id}")


def _cancelling(by: str) -> str | None:
    """The line for the first request to cancel the run, naming who asked (a Ctrl-C in
    this terminal is told by its handler); a signal's came from outside the terminal."""
    if by == "ctrl-c":
        return None
    if by.startswith("SIG"):
        who = f"{by} received"
    elif by.startswith("cli:"):
        who = "asked by `m27 cancel`"
    elif by == "prefect":
        who = "cancelled from Prefect"
    elif by.startswith("telegram:"):
        who = "asked from Telegram"
    else:
        who = f"asked by {by}" if by else "asked"
    return f"cancelling: {who}; stopping step processes"


def _line(text: str = "") -> None:
    write_out(text + "\n")


def write_out(text: str) -> None:
    """Write `text` to stdout now. When its reader has gone (`m27 run p.yaml | head -3`)
    or it cannot be written (`> /full/disk/out.txt`), the output stops, not the run:
    stdout is /dev/null from then on, and the run goes on to its end and exit code (a
    write that raised there stopped the progress thread with a traceback, every later line
    of a step's output logged a warning, and a full disk refused the run before it began)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        _mute_stdout()
        if not isinstance(exc, BrokenPipeError):  # a reader that left knows why
            with contextlib.suppress(OSError):  # a closed terminal (EIO) takes stderr too
                sys.stderr.write(
                    f"m27: cannot write the output: {exc.strerror or exc}; it stops here, "
                    "the run goes on (`m27 runs` lists it)\n"
                )


def _mute_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes there too
    except (OSError, ValueError):  # no file descriptor (a test's capture): replace it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (stdout for the process's life)
    finally:
        os.close(devnull)
