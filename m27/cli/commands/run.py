"""`m27 run`: validate a pipeline, then run it as a Prefect flow with live progress."""

from __future__ import annotations

import argparse
import atexit
import itertools
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from m27 import runids
from m27._exceptions import M27Error, RunnerError, StoreError, one_line
from m27.cli import warm
from m27.cli.commands import SUMMARY, _common, _notes
from m27.cli.commands._options import add_set_option
from m27.cli.commands._plan import print_dry_run
from m27.cli.commands._prepare import prepare
from m27.cli.commands._progress import Progress, write_out
from m27.cli.detach import given_run_id
from m27.cli.prefect_run import (
    bound_prefect_end,
    prefect_defaults,
    prefect_late,
    quiet_run_loggers,
    run_settings,
    silence_prefect,
)
from m27.events import CancelRequested, RunCancelled, RunFailed
from m27.executors import environ
from m27.executors.engines import plan_for_step
from m27.gpu import detect
from m27.locks import OutputLocks
from m27.paths import m27_home, make_home
from m27.signals import SignalRelay
from m27.spec import Pipeline, Problem


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help=SUMMARY["run"],
        description="Validate FILE, record the run in the node's event log and run it as a "
        "Prefect flow on the node service's Prefect server (started when none runs; "
        "PREFECT_API_URL: the lab's server instead). Ctrl-C, SIGTERM and SIGHUP cancel "
        "the run (its steps get SIGTERM and their grace; a second Ctrl-C aborts); with "
        "--detach it runs on after the command exits, until `m27 cancel`. "
        "Exit code 0 when every step succeeded (with --detach: once the run is recorded; "
        "`m27 wait RUN` gives its end), 1 when a step failed or the run was cancelled, 2 "
        "for bad input.",
    )
    p.add_argument("file", nargs="?", help="pipeline YAML (optional with --resume)")
    add_set_option(p)
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="rerun the steps of RUN_ID (an id, a unique prefix, or `last`) that did not "
        "succeed, from their checkpoints, "
        "with the pipeline file as it is now (a fixed command is used) and RUN_ID's "
        "--set values (a new --set overrides one); a step that succeeded runs again when "
        "its output: is gone and a step that runs needs it; with no step left to run, "
        "nothing starts (exit 0)",
    )
    p.add_argument(
        "--rerun",
        metavar="STEP",
        action="append",
        default=[],
        help="with --resume: run STEP again, from the start, though it succeeded (its "
        "command or input changed), and every step that waits on it (repeatable)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check FILE and say what the run would do with each step (with --resume: "
        "skipped as done, run again and why, or from which checkpoint), then exit; nothing "
        "starts",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="plain lines instead of the live table (default when not a terminal)",
    )
    p.add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="run in the background, in a session of its own (a closed terminal or ssh "
        "session does not stop it): wait until the run is in the node's log, print its "
        "id (alone on stdout) and how to follow it (m27 logs -f, m27 status, m27 wait, "
        "m27 cancel), exit 0; its output goes to $M27_HOME/runs/RUN/run.out",
    )
    p.add_argument("--quiet", action="store_true", help="do not print step output")
    p.add_argument("--verbose", action="store_true", help="show Prefect's own log lines")
    p.set_defaults(func=run)


def _node_service() -> float:
    """Make sure the node service runs (start it detached when none does) and point this
    process's Prefect client at its server (or the lab's); the seconds spent waiting.

    Called before `prefect` is imported, so every Prefect setting read later sees the URL.
    """
    from m27.config import m27_home
    from m27.node.reach import unreachable
    from m27.node.service import ensure_service

    info, waited = ensure_service(m27_home())
    os.environ["PREFECT_API_URL"] = info.url
    # A lab's server (the service's own answered before it said ready): Prefect's engine
    # met a server that is down with a page of traceback, after the run was announced.
    why = None if info.own_server else unreachable(info.url)
    if why is not None:
        raise M27Error(
            f"cannot reach the Prefect server at {info.url} (PREFECT_API_URL): {why}; "
            "is it running?",
            url=info.url,
        )
    return waited


def _claim_outputs(pipeline: Pipeline, run_id: str) -> OutputLocks | None:
    """Hold the pipeline's declared outputs for this run, or say which run writes one.

    Two runs writing the same files at once (the same pipeline started twice, a resume
    while the run still runs) each "succeed" with the other's data mixed into theirs.
    """
    from m27.config import m27_home

    own = _checkpoint_files(pipeline)
    locks = OutputLocks(m27_home(), [*pipeline.output_paths(), *own])
    held = locks.acquire(f"run {run_id} ({pipeline.name})")
    if held is None:
        return locks
    by = held.note or "another run"
    if held.pid is not None:
        by += f", pid {held.pid}"
    what = "checkpoint file" if held.path in own else "output"
    print(
        f"m27: {pipeline.path}: {what} {held.path} is being written by {by}; two runs "
        "writing it at once would mix their files. Wait for that run to end (m27 runs), "
        "cancel it (m27 cancel RUN), or give this run other outputs (--set NAME=...)",
        file=sys.stderr,
    )
    return None


def _checkpoint_files(pipeline: Pipeline) -> list[str]:
    """The files steps that checkpoint themselves write, as absolute paths: the seed
    pipeline's `gmx mdrun -deffnm simulation` declares no output, and two runs of it in
    one folder wrote one simulation.cpt (each resumed the other's trajectory)."""
    found = []
    for step in pipeline.steps:
        plan = plan_for_step(step)
        if plan is not None:
            base = pipeline.workdir_of(step)
            found += [os.path.normpath(base / os.path.expanduser(f)) for f in plan.files]
    return found


def _check_resources(pipeline: Pipeline) -> list[Problem]:
    backend = detect()
    try:
        devices = backend.devices()
    finally:
        backend.close()
    sizes = [d.memory_total for d in devices if d.memory_total is not None]
    largest = max(sizes) if sizes and len(sizes) == len(devices) else None  # known for all
    return _common.beyond_gpus(
        pipeline, len(devices), largest, "this node has", "the largest GPU here has"
    )


def _container_problems(pipeline: Pipeline) -> list[Problem]:
    """Container steps on a node without Apptainer would each fail at their start."""
    steps = [s for s in pipeline.steps if s.container]
    if not steps:
        return []
    from m27.executors.container import find_runtime

    try:
        find_runtime()
    except RunnerError as exc:
        return [_common.step_problem(pipeline, s, f": {exc}") for s in steps]
    return []


def _checkpoint_warnings(pipeline: Pipeline) -> list[str]:
    """`m27 validate`'s warnings about a `checkpoint:` that will save nothing (no recipe
    and no m27.Checkpointer; a LAMMPS script off the convention), said before a run of
    days rather than found after its crash."""
    from m27.cli.commands._explain import explain_checkpoint

    shown = _notes.shown_path(pipeline)
    return [
        f"{shown}:{step.line}: step {name}: {warning}"
        for step, name in _common.once_per_matrix(pipeline.steps)
        for warning in explain_checkpoint(step, pipeline.workdir_of(step)).warnings
    ]


def _resumed_path(resume_of: str | None) -> tuple[str, str] | None:
    """The run a resume goes on from and the PATH it ran with, when it kept it."""
    if resume_of is None:
        return None
    kept = environ.recorded(m27_home(), resume_of)
    if kept is None or "PATH" not in kept.env:
        return None
    return resume_of, kept.env["PATH"]


def run(args: argparse.Namespace) -> int:
    atexit.register(_fast_exit)
    pipeline, overrides, resume_of, plan = prepare(args)
    problems = _check_resources(pipeline) + _common.slurm_problems(pipeline)
    if problems := problems + _container_problems(pipeline):
        print("\n".join(map(str, problems)), file=sys.stderr)
        print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 2
    for note in _notes.shown_notes(_notes.pipeline_notes(pipeline, _resumed_path(resume_of))):
        print(f"m27: note: {note}", file=sys.stderr)
    for warning in _notes.shown_notes(_checkpoint_warnings(pipeline)):
        print(f"m27: warning: {warning}", file=sys.stderr)
    from m27.config import load_settings

    load_settings()  # a bad ~/.m2config or M27_CONFIG: a clean error here, not in the flow
    if args.dry_run:
        print_dry_run(pipeline, plan)
        return 0
    make_home()  # likewise an M27_HOME that cannot be made, before the locks and the service
    run_id = given_run_id() or runids.new_run_id()  # (--detach: the waiting parent's)
    outputs = _claim_outputs(pipeline, run_id)
    if outputs is None:
        return 2
    prefect_defaults(os.environ, verbose=args.verbose)
    waited = _node_service()
    store = _common.store()
    before = store.last_seq()  # the run's events all come after this
    live = sys.stdout.isatty() and not args.plain
    progress = Progress(store, run_id, pipeline, live=live, show_output=not args.quiet)

    def cancel(signum: int) -> None:
        progress.note("cancelling: stopping step processes (Ctrl-C again to abort)")
        store.append([CancelRequested(at=time.time(), run_id=run_id, by="ctrl-c")])

    # The first Ctrl-C cancels from the relay's thread: appending in the handler itself
    # waits forever when the signal lands while the main thread holds the store's lock.
    relay = SignalRelay(cancel)
    presses = itertools.count()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if next(presses):  # the second: abort here and now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            silence_prefect()
            raise KeyboardInterrupt
        relay(signum, frame)

    # Ignored, it stays so: a job started in the background of a script (`m27 run p.yaml &`)
    # is not the one a Ctrl-C at the terminal is meant for.
    previous = signal.getsignal(signal.SIGINT)
    if previous != signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_sigint)
    from flows.pipeline import LINE_SINKS, RUN_ENDED, pipeline_flow

    if not args.verbose:
        quiet_run_loggers()

    released: list[int] = []
    bounds: list[threading.Timer] = []  # (cancelled once the flow has returned)

    def on_end() -> None:
        """The run's end is in the log: its summary now, before Prefect's part of the end
        (a forked run lets its client go: m27.cli.warm.release_client; a run in this
        process waits for that part END_GRACE_S at most)."""
        try:
            result = _common.run_state(store, run_id, before).runs.get(run_id)
        except StoreError:
            return  # the summary comes after the flow, as for any store error
        if result is None or result.status == "running":
            return
        progress.stop()
        outputs.release()  # the next run may write them now, before Prefect's bookkeeping
        code = _summarize(progress, result, waited)
        released.append(code)
        if not warm.release_client(code):
            if not args.verbose:
                silence_prefect()  # its bookkeeping from here on: said below if it fails
            bounds.append(bound_prefect_end(code))

    LINE_SINKS[run_id] = progress.on_lines
    RUN_ENDED[run_id] = on_end
    progress.start()
    notifier = _start_notifier(store)
    flow_state: Any = None
    try:
        with run_settings():
            # (the flow names its run itself: with_options would rebuild its parameter
            # schema, ~0.07 s per run)
            flow_state = pipeline_flow(
                spec_path=str(pipeline.path),
                overrides=overrides,
                run_id=run_id,
                resume_of=resume_of,
                pipeline_name=pipeline.name,
                rerun=args.rerun or None,
                return_state=True,
            )
    except StoreError as exc:  # a full disk, say: one message, and the run's end recorded
        print(f"m27: run {run_id} stopped: {exc}", file=sys.stderr)
        _end_truthfully(store, run_id, f"the event log failed: {exc}")
        return 1
    except BaseException as exc:
        state = _common.run_state(store, run_id)
        if run_id in state.runs and state.runs[run_id].status == "running":
            store.append([_stopped(run_id, exc)])
        elif run_id not in state.runs and isinstance(exc, Exception) and not args.verbose:
            # Prefect's engine failed before the flow began (its API answered, but not
            # as a Prefect server would): one line, nothing recorded; --verbose shows all
            print(f"m27: run {run_id} did not start: {one_line(exc)}", file=sys.stderr)
            return 1
        elif released and isinstance(exc, Exception) and not args.verbose:
            # the run ended and its summary is out; Prefect's part of the end failed
            prefect_late(f"did not take the run's end ({one_line(exc)})")
            _FAST_EXIT.append(released[0])
            return released[0]
        raise
    finally:
        for bound in bounds:
            bound.cancel()
        outputs.release()
        _stop_notifier(notifier)
        progress.stop()
        LINE_SINKS.pop(run_id, None)
        RUN_ENDED.pop(run_id, None)
        signal.signal(signal.SIGINT, previous)
        relay.close()
    if released:  # the client has its exit code and summary already
        _FAST_EXIT.append(released[0])
        return released[0]
    state = _common.run_state(store, run_id, before)
    if run_id not in state.runs:
        message = getattr(flow_state, "message", "") or "the flow did not start"
        print(f"m27: run {run_id} did not start: {message}", file=sys.stderr)
        return 1
    result = state.runs[run_id]
    if result.status == "running":  # the flow ended without recording it (a store error)
        message = getattr(flow_state, "message", "") or "the flow ended without an end event"
        print(f"m27: run {run_id} stopped: {message}", file=sys.stderr)
        if not _end_truthfully(store, run_id, message):
            return 1  # no summary: the log cannot say how the run ended
        result = _common.run_state(store, run_id, before).runs[run_id]
    code = _summarize(progress, result, waited)
    _FAST_EXIT.append(code)
    return code


def _summarize(progress: Progress, result: Any, waited: float) -> int:
    """Print the run's summary; its exit code."""
    progress.summary(result)
    if waited >= 0.05:
        write_out(f"(before the run: {waited:.1f}s starting the node service)\n")
    return 0 if result.status == "succeeded" else 1


#: The exit status of a run that ended normally; set, it lets `_fast_exit` skip teardown.
_FAST_EXIT: list[int] = []


def _fast_exit() -> None:
    """Registered before Prefect is imported, so it runs after Prefect's own exit handlers
    (log and event flushes): flush what is left and end the process at once, skipping the
    interpreter's teardown of Prefect's and pydantic's objects (0.7-1.5 s here)."""
    if not _FAST_EXIT:
        return  # an error path: the normal exit reports it
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_FAST_EXIT[-1])


#: Tries (one second apart) to record a run's end after a store error: space may come back.
END_TRIES = 5


def _end_truthfully(store: Any, run_id: str, reason: str) -> bool:
    """Record the end of a run that stopped on a store error: its steps' processes are
    stopped and every step left running gets StepFailed, then RunCrashed with `reason`
    (m27.node.crash.finalize). When the log still cannot be written, say so; the node
    service records the run crashed once it can (its process is gone by then)."""
    from m27.node.crash import finalize

    last: StoreError | None = None
    for attempt in range(END_TRIES):
        try:
            finalize(store, run_id, reason)
            return True
        except StoreError as exc:
            last = exc
            if attempt + 1 < END_TRIES:
                time.sleep(1.0)
    print(
        f"m27: could not record the end of run {run_id} ({last}); it is recorded as "
        "crashed when the event log can be written again",
        file=sys.stderr,
    )
    return False


def _start_notifier(store: Any) -> Any:
    """Telegram alerts and the bot from inside `m27 run` when configured and no
    `m27 notifier` / `m27 bot` service runs.

    It works from the durable outbox, so what it has not sent when the run ends is sent by
    the next notifier; the run never waits on Telegram for more than a moment."""
    from m27.notify.config import load_config

    config = load_config()
    if not config.enabled:
        return None  # not configured: no Telegram library to import (~0.5 s)
    from m27.notify.bot import start_embedded_bot
    from m27.notify.notifier import start_embedded_notifier

    # The bot answers the lab's chat while the run goes on (short polls, so it stops quickly).
    return [
        start_embedded_notifier(store, config),
        start_embedded_bot(store, config, poll_timeout=2),
    ]


def _stop_notifier(handles: Any) -> None:
    if handles is None:
        return
    notifier, bot = handles
    bot.stop(timeout=3.0)
    # The run's outcome is in the log: wait (bounded) until it is read and sent; what
    # Telegram has not taken by then stays in the outbox for the next notifier.
    notifier.drain(timeout=10.0)
    notifier.stop(timeout=3.0)


#: Why a run aborted by a second Ctrl-C ended: the user stopped it (it was recorded
#: `failed: m27 run stopped: KeyboardInterrupt: `, and paged as a failure).
ABORTED = "aborted by a second Ctrl-C, without waiting for its steps to stop"


def _stopped(run_id: str, exc: BaseException) -> RunCancelled | RunFailed:
    """The end of a run whose flow `exc` stopped: cancelled when it was the user's second
    Ctrl-C (the first had asked for the cancel), failed otherwise."""
    if isinstance(exc, KeyboardInterrupt):
        return RunCancelled(at=time.time(), run_id=run_id, reason=ABORTED)
    reason = f"m27 run stopped: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
    return RunFailed(at=time.time(), run_id=run_id, duration_s=0.0, reason=reason)
