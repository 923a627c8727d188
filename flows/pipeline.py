"""The Prefect flow that runs one m27 pipeline: a flow run per pipeline run, a task run per step.

The flow takes only JSON-able parameters, so the same function runs from `m27 run` (in
process, on Prefect's temporary server or `PREFECT_API_URL`) and from a Prefect deployment
picked up by a worker. Everything m27 knows about the run goes through the node's event
log first; Prefect shows the same run in its UI (states, logs, checkpoint artifacts).

Scheduling inside a run is a plain DAG walk: a step is submitted when all its dependencies
succeeded, and waits for its resources in the node's lease (CPU slot or GPUs). When a step
fails, its dependents are recorded as skipped (task runs named after them, in a Failed
state named ``UpstreamFailed``) while independent branches finish.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Completed, Failed

from flows import _logging, _params, summary
from flows._outcomes import Outcomes
from flows._run import (
    CANCEL_SIGNALS,
    _launch,
    _PrefectOutput,
    _Run,
    _StepLog,
    _watch_cancel,
    cancel_on_signals,
    record_failed,
    waiting_line,
)
from m27 import ConfigError, M27Error, RunnerError, SpecError, StoreError, liveness, runids
from m27.config import load_settings, m27_home
from m27.events import (
    Event,
    RunCancelled,
    RunFailed,
    RunSubmitted,
    RunSucceeded,
    StepCancelled,
    StepFailed,
    StepQueued,
    StepSkipped,
    StepSucceeded,
)
from m27.events.state import fold
from m27.executors import environ
from m27.executors.local import StepResult
from m27.executors.slurm import run_slurm_step
from m27.node.embed import ensure_agent
from m27.node.lease import AgentLease, run_leased
from m27.paths import join_under
from m27.spec import Pipeline, Step, problem_lines
from m27.store import EventStore
from m27.store.chain import chain, gone_note, rerun_note, successes
from m27.store.sqlite import open_store
from m27.units import format_duration

_logging.install()  # no bogus "NoneType: None" under a failed step's Prefect error line

#: run id -> callable(step, stream, lines); lets `m27 run` print step output live.
LINE_SINKS: dict[str, Callable[[str, str, list[str]], None]] = {}
#: run id -> callable(); called once the run's end is in the event log, before Prefect's
#: part of the end (summary artifact, final state): a forked `m27 run` lets its client go.
RUN_ENDED: dict[str, Callable[[], None]] = {}


def _now() -> float:
    return time.time()


def _step_body(run: _Run, step: Step) -> State:
    logger = get_run_logger()
    sink = LINE_SINKS.get(run.run_id)
    told = _StepLog(run, step.name, logger)
    to_prefect = _PrefectOutput(logger, run.prefect_log_limit, run.run_id, step.name)

    def on_lines(stream: str, lines: list[str]) -> None:
        told.before_output()
        to_prefect.add(stream, lines)
        if sink is not None:
            sink(step.name, stream, lines)

    def supervise(start: Callable[[], StepResult]) -> StepResult:
        with ThreadPoolExecutor(1, thread_name_prefix=f"m27-{step.name}") as pool:
            fut: Future[StepResult] = pool.submit(start)
            # Wake on the step's end at once (following the log instead could sleep up to
            # the timeout after the step's last event); checkpoints are registered meanwhile.
            while not wait([fut], timeout=0.5).done:
                told.catch_up()
            result = fut.result()
            told.catch_up()
        return result

    try:
        launch = _launch(run, step, ())
    except RunnerError as exc:  # e.g. a container step on a node without apptainer
        run.append(
            StepFailed(
                at=_now(),
                run_id=run.run_id,
                step=step.name,
                attempt=1,
                duration_s=0.0,
                reason=str(exc),
            )
        )
        return Failed(message=str(exc))
    if step.executor == "slurm":
        # Slurm allocates the GPUs (gres) and queues the job; the node's agent is not asked.
        result: StepResult | None = supervise(
            partial(
                run_slurm_step,
                launch,
                run.store,
                options=step.slurm,
                gpus=step.gpus,
                on_lines=on_lines,
                cancel=run.stop_of(step.name),
                resume_from=lambda: run.resume_from(step.name),
            )
        )
        return _state_of(result, told.succeeded, told.hold.seconds())
    # The node agent answers the request (StepRequested -> LeaseGranted); a guest (tier
    # "ready") starts with its channel's gate closed and computes when the agent allows.
    result = run_leased(
        run.lease,
        launch,
        step.type,
        cancel=run.stop_of(step.name),
        gpus=step.gpus,
        gpu_memory=step.gpu_memory or 0,
        priority=step.priority,
        owner=getpass.getuser(),
        on_lines=on_lines,
        resume_from=lambda: run.resume_from(step.name),
        supervise=supervise,
        time_limit=step.timeout,
        on_wait=lambda: logger.info("%s", waiting_line(step.name, step.gpus)),
    )
    if result is None and not run.cancel.is_set():  # `m27 cancel RUN STEP` while it queued
        why = "step cancelled before it started (it was queued)"
        run.append(StepCancelled(at=_now(), run_id=run.run_id, step=step.name, reason=why))
    return _state_of(result, told.succeeded, told.hold.seconds())


def _state_of(
    result: StepResult | None, succeeded: StepSucceeded | None = None, held: float = 0.0
) -> State:
    """The Prefect state of a step task from the runner's result; a success says what
    `m27 run` said for it (`succeeded in 6.0s (held 4.0s as a guest)`), and the attempt
    after a retry."""
    if result is None:
        return Cancelled(message="cancelled before it started")
    if result.ok:
        took, attempt = result.duration_s, result.attempts
        if succeeded is not None:
            took, attempt = succeeded.duration_s, succeeded.attempt
        again = f" (attempt {attempt})" if attempt > 1 else ""
        if held >= 0.5:  # as `m27 run` says it
            again += f" (held {format_duration(held)} as a guest)"
        return Completed(message=f"succeeded in {format_duration(took)}{again}")
    if result.cancelled:
        return Cancelled(message="cancelled")
    return Failed(message=result.reason)


#: CancelRequested.by of a cancel from a signal to the flow's process (cancel_on_signals)
SIGNAL_NAMES = frozenset(signal.Signals(s).name for s in CANCEL_SIGNALS)

#: run id -> its shared context, for the step tasks of runs in this process.
_RUNS: dict[str, _Run] = {}


@task(name="step", cache_policy=NO_CACHE, persist_result=False)
def step_task(run_id: str, step: str) -> State:
    """One pipeline step (the task run takes the step's name)."""
    run = _RUNS[run_id]
    try:
        return _step_body(run, run.pipeline.step(step))
    except StoreError as exc:  # the step's end could not be recorded; the run is closed later
        return Failed(message=f"the event log failed: {exc}")
    except Exception as exc:  # a fault of m27's own: the log must not keep the step running
        said = (str(exc).strip().splitlines() or [""])[0]
        said = said if len(said) <= 200 else said[:200] + "..."
        reason = f"m27 error: {type(exc).__name__}: {said}"
        # the traceback, in the task's Prefect log only: what a bug report needs
        get_run_logger().error("%s", reason, exc_info=True)
        with contextlib.suppress(StoreError):
            record_failed(run, step, reason)
        return Failed(message=reason)


@task(name="skipped", cache_policy=NO_CACHE, persist_result=False)
def skipped_task(message: str, done: bool) -> State:
    """A step that will not run, shown in Prefect under its own name."""
    if done:
        return Completed(name="Skipped", message=message)
    return Failed(name="UpstreamFailed", message=message)


def _previous_successes(
    store: EventStore, resume_of: str | None, pipeline: Pipeline, rerun: list[str]
) -> tuple[dict[str, str], list[Path], frozenset[str]]:
    """Steps already done in the run being resumed (and its own ancestors), each with the
    run it succeeded in; their checkpoint folders, newest run first; and the steps that
    run from the start, each logged: those `rerun` names and the steps after them, and
    done steps whose outputs are gone while a step that runs needs them."""
    if not resume_of:
        return {}, [], frozenset()
    runs = chain(store, resume_of)
    found = successes(store, runs)
    forced = pipeline.rerun_steps(rerun)
    if forced:
        get_run_logger().warning("%s", rerun_note(rerun, forced))
    again = pipeline.rerun_for_outputs(found.keys() - set(forced))
    for name, gone in again.items():
        get_run_logger().warning("%s", gone_note(name, gone, found[name].run_id))
    dirs = [join_under(m27_home(), "checkpoints", run_id) for run_id in runs]
    fresh = {*forced, *again}
    done = {name: s.run_id for name, s in found.items() if name not in fresh}
    return done, dirs, frozenset(fresh)


def _ui_url() -> str | None:
    """The flow run's page in Prefect's UI, when a UI address is known."""
    from prefect.runtime import flow_run

    url = flow_run.ui_url
    return url if isinstance(url, str) and url.startswith("http") else None


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    run_id = params.get("run_id") or runids.from_flow_run(str(flow_run.id))
    name = params.get("pipeline_name") or Path(str(params.get("spec_path", "pipeline"))).stem
    return f"{name}/{run_id}"


@flow(
    name="m27-pipeline",
    flow_run_name=_flow_run_name,
    persist_result=False,
    log_prints=True,
    validate_parameters=False,
)
def pipeline_flow(
    spec_path: str,
    overrides: Mapping[str, str] | None = None,
    run_id: str | None = None,
    resume_of: str | None = None,
    pipeline_name: str | None = None,
    rerun: list[str] | None = None,
) -> State | dict[str, Any]:
    """Run the pipeline in `spec_path` with `overrides` for its {{VARS}}; with
    `resume_of`, skip the steps that succeeded there, except those `rerun` names and the
    steps after them."""
    from prefect.runtime import flow_run

    try:  # the input's problems end the run here, each in one line: no traceback
        pipeline = _params.pipeline_of(spec_path, overrides)
        home = m27_home()
        settings = load_settings()  # a bad ~/.m2config fails the run before anything starts
        store = open_store(home)
        if run_id:
            run_id = _params.fresh_run_id(store, run_id)
        resume_of = _params.resumed_run(store, resume_of, pipeline)
        rerun = _params.rerun_steps(rerun, resume_of, pipeline)
    except (SpecError, ConfigError, StoreError) as exc:
        return _refused(exc)
    run_id = run_id or runids.from_flow_run(str(flow_run.id))
    done, resume_dirs, fresh = _previous_successes(store, resume_of, pipeline, rerun)
    # The node's agent: this process embeds one unless another process runs it.
    agent = ensure_agent(home)
    run = _Run(run_id, pipeline, store, home, AgentLease(store, home), resume_dirs, fresh)
    run.prefect_log_limit = settings.prefect_log_limit
    started = _now()
    submitted: list[Event] = [
        RunSubmitted(
            at=started,
            run_id=run_id,
            pipeline=pipeline.name,
            spec_path=str(pipeline.path),
            steps=tuple(s.name for s in pipeline.steps),
            step_types=tuple(s.type for s in pipeline.steps),
            step_commands=tuple(shlex.join(s.argv) for s in pipeline.steps),
            step_groups=tuple(s.group or "" for s in pipeline.steps),
            vars=dict(pipeline.vars),
            owner=getpass.getuser(),
            priority=pipeline.priority,
            resume_of=resume_of,
            rerun=tuple(rerun),
            on_crash=pipeline.on_crash,
            flow_run_id=str(flow_run.id),
            prefect_url=_ui_url(),
            pid=os.getpid(),
            host=socket.gethostname(),
            pid_started=liveness.own_start_time(),
        )
    ]
    run.first_seq = store.last_seq()
    store.append(submitted)
    environ.record(home, run_id)  # what a resume from Telegram runs in
    _RUNS[run_id] = run
    stop_watch = threading.Event()
    watcher = threading.Thread(target=_watch_cancel, args=(run, stop_watch), daemon=True)
    watcher.start()
    restore_signals = cancel_on_signals(run)
    try:
        outcome = _walk(run, pipeline, done)
    except StoreError as exc:  # a full disk, say: `m27 run` or the crash watcher closes the run
        return Failed(message=f"the event log failed: {exc}")  # a state: no traceback logged
    finally:
        restore_signals()
        # The followers end at the next event: the run's end, appended below (joining them
        # here would wait out a poll, 0.05-0.1 s of every run's exit).
        stop_watch.set()
        _RUNS.pop(run_id, None)
        run.lease.close(wait=False)
        if agent is not None:
            agent.stop()
    duration = _now() - started
    failed = tuple(s.name for s in pipeline.steps if outcome.get(s.name) == "failed")
    # steps `m27 cancel RUN STEP` stopped: the run did not do all its work
    stopped = tuple(s.name for s in pipeline.steps if outcome.get(s.name) == "cancelled")
    cancelled = run.cancel.is_set()
    why = f"{run.cancelled_by} received" if run.cancelled_by in SIGNAL_NAMES else ""
    if cancelled:
        _finish(run, RunCancelled(at=_now(), run_id=run_id, reason=why or "cancel requested"))
    elif failed or stopped:
        _finish(
            run,
            RunFailed(
                at=_now(),
                run_id=run_id,
                duration_s=duration,
                failed_steps=failed + stopped,
                reason="; ".join(
                    _failed_text(names, how)
                    for names, how in ((failed, "failed"), (stopped, "cancelled"))
                    if names
                ),
            ),
        )
    else:
        _finish(run, RunSucceeded(at=_now(), run_id=run_id, duration_s=duration))
    watcher.join(timeout=2)
    run.lease.close()
    if cancelled:
        return Cancelled(message=f"run {run_id} cancelled" + (f": {why}" if why else ""))
    if failed or stopped:
        return Failed(
            message=f"run {run_id}: step(s) {', '.join(failed + stopped)} did not succeed"
        )
    return {"run_id": run_id, "steps": outcome}


def _failed_text(failed: tuple[str, ...], how: str = "failed") -> str:
    """`step a failed`, `steps a, b failed`, `steps a, b, c and 4 more failed`: every
    failed step (the first alone said the run failed of it when others had too); `how`:
    `cancelled` for the steps `m27 cancel RUN STEP` stopped."""
    if len(failed) == 1:
        return f"step {failed[0]} {how}"
    more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    return f"steps {', '.join(failed[:3])}{more} {how}"


def _refused(exc: M27Error) -> State:
    """The Failed state of a run whose input is wrong, each problem a line in its log."""
    lines = problem_lines(exc) if isinstance(exc, SpecError) else str(exc).splitlines()
    logger = get_run_logger()
    for line in lines:
        logger.error("%s", line)
    more = f" (and {len(lines) - 1} more: see the log)" if len(lines) > 1 else ""
    return Failed(message=f"{lines[0] if lines else exc}{more}")


def _finish(run: _Run, end: Event) -> None:
    """Record the run's end, then show its summary and plots in Prefect (flows/summary.py)."""
    run.append(end)  # (wakes the cancel watcher and the lease follower: they end now)
    ended = RUN_ENDED.get(run.run_id)
    if ended is not None:
        ended()
    state = fold(run.store.read_runs((run.run_id,), after=run.first_seq))
    summary.publish(state, run.run_id, run.pipeline.workdir)


def _walk(run: _Run, pipeline: Pipeline, done: Mapping[str, str]) -> dict[str, str]:
    """Submit each step once its dependencies succeeded; returns step -> outcome."""
    settled = Outcomes((s.name, s.depends_on) for s in pipeline.steps)
    outcome = settled.outcome  # (read here; written only through settled.settle)
    futures: dict[str, Any] = {}
    order = pipeline.topo_order()
    for name in order:
        if name in done:
            settled.settle(name, "succeeded")
            why = StepSkipped.done_in(done[name])
            run.append(StepSkipped(at=_now(), run_id=run.run_id, step=name, reason=why))
            skipped_task.with_options(name=name, task_run_name=name).submit(why, True).wait()
    while len(outcome) < len(order):
        for name in order:
            if name in outcome or name in futures:
                continue
            step = pipeline.step(name)
            bad = settled.first_failed(name)
            if bad is not None:
                settled.settle(name, "skipped")
                why = f"upstream step {bad} did not succeed"
                run.append(StepSkipped(at=_now(), run_id=run.run_id, step=name, reason=why))
                skipped_task.with_options(name=name, task_run_name=name).submit(why, False).wait()
            elif settled.ready(name):
                if run.stop_of(name).is_set():
                    settled.settle(name, "cancelled")
                    whose = "run" if run.cancel.is_set() else "step"
                    run.append(
                        StepCancelled(
                            at=_now(),
                            run_id=run.run_id,
                            step=name,
                            reason=f"{whose} cancelled before the step started",
                        )
                    )
                    continue
                run.append(
                    StepQueued(
                        at=_now(),
                        run_id=run.run_id,
                        step=name,
                        type=step.type,
                        priority=step.priority,
                        gpus=step.gpus,
                        gpu_memory=step.gpu_memory or 0,
                        depends_on=tuple(step.depends_on),
                    )
                )
                upstream = [futures[d] for d in step.depends_on if d in futures]
                futures[name] = step_task.with_options(name=name, task_run_name=name).submit(
                    run.run_id, name, wait_for=upstream, return_state=False
                )
        running = [f for n, f in futures.items() if n not in outcome]
        if not running:
            continue  # the pass above decided more steps; loop until all have an outcome
        _wait_any(running)
        for name, fut in futures.items():
            if name not in outcome and fut.wrapped_future.done() and fut.state.is_final():
                st = fut.state
                settled.settle(
                    name,
                    "succeeded"
                    if st.is_completed()
                    else "cancelled"
                    if st.is_cancelled()
                    else "failed",
                )
    return outcome


def _wait_any(futures: list[Any]) -> None:
    """Block until at least one Prefect future is final.

    A finished future takes its final state from the task engine's own return value
    (``wait(0)``); reading ``.state`` before that asks the API, which learns the state only
    when the server's task-run recorder has persisted it: ~0.5 s per step on SQLite.
    """
    wrapped = [f.wrapped_future for f in futures]
    wait(wrapped, return_when=FIRST_COMPLETED)
    for f in futures:
        if f.wrapped_future.done():
            with contextlib.suppress(Exception):  # an engine error: .state below tells
                f.wait(0)
    while not any(f.state.is_final() for f in futures):  # state lands just after the future
        time.sleep(0.01)
