"""The Slurm executor: a step runs as a Slurm job, supervised by the same Prefect task.

:func:`run_slurm_step` has the shape of :func:`m27.executors.local.run_step` and records the same
events (``StepStarted``, ``StepSucceeded``/``StepFailed``, ``StepCancelled``) plus
``SlurmJobSubmitted`` and ``SlurmJobStateChanged``, so ``m27 status``, ``m27 logs`` and the
notifier need not know where a step ran. Per attempt it writes an sbatch script
(:mod:`m27.executors.slurm._script`), submits it, follows the job with ``scontrol``
(:mod:`m27.executors.slurm._jobs`), tails the job's output files into the step log and the
caller's ``on_lines``, and turns cancellation into ``scancel``.

Why plain ``sbatch``/``scontrol``/``scancel`` and not submitit (which works with this
Slurm): submitit pickles a Python callable and runs it in a fresh interpreter, while an
m27 step is an arbitrary command line; its requeue machinery (``Checkpointable``) lives
inside that pickled callable, whereas m27 steps checkpoint with their own Checkpointer;
and its output files are read after the job ends, while m27 streams lines as they come.
What m27 needs is a generated script, four commands and a state poll; that is less code
than adapting submitit, and the script is readable (and golden-tested) as it is.

Requeue and resume: jobs are submitted with ``--requeue --signal=B:USR1@N``. The batch
script passes USR1 on to the step, which saves a checkpoint and exits non-zero (see
:func:`watch_preemption`); the script then requeues its own job. Every start of the job
(first, after that requeue, after a preemption or a node failure that Slurm requeued)
picks the newest valid checkpoint of the step's directory as ``M27_RESUME_FROM``.
See docs/slurm.md.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m27.clock import Clock
from m27.events import SlurmJobSubmitted
from m27.executors.local import (
    AttemptEnd,
    Guarded,
    Sink,
    StepLaunch,
    StepResult,
    begin_attempt,
    child_env,
    open_guard,
    run_in_step_log,
    stopped_early_end,
)
from m27.executors.slurm._follow import Follower, FollowResult, StepJobs
from m27.executors.slurm._jobs import JobInfo, SlurmCli, SlurmError, SubprocessSlurm
from m27.executors.slurm._script import (
    ScriptInput,
    SlurmOptions,
    load_site_options,
    parse_options,
    render_script,
)
from m27.paths import join_under
from m27.signals import STOP_SIGNALS, watch_stop
from m27.store import EventStore

#: Exit code for a step that saved a checkpoint on USR1/TERM and wants to be requeued
#: (BSD's EX_TEMPFAIL). Any non-zero code after USR1 requeues; this one says why.
REQUEUE_EXIT_CODE = 75

#: Variables of an enclosing Slurm job that must not leak into a job m27 submits (sbatch
#: reads SBATCH_* as options, and SLURM_* describe the wrong job).
_DROP_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")
_KEEP = ("SLURM_CONF",)


def watch_preemption(signals: Iterable[signal.Signals] = STOP_SIGNALS) -> threading.Event:
    """:func:`m27.watch_stop` under the name Slurm users look for: an event set when Slurm
    asks the step to stop (USR1 ``signal_before`` seconds before the time limit, passed on
    by the batch script; TERM on ``scancel`` and on preemption). Call it from the main
    thread::

        stop = m27.executors.slurm.watch_preemption()
        for i in range(start, n):
            ...
            if stop.is_set():
                ck.save(state, i); ck.flush()
                sys.exit(m27.executors.slurm.REQUEUE_EXIT_CODE)

    The event is set from a thread of its own (:func:`m27.signals.stop_event`): a handler
    that set it directly deadlocked when slurmstepd's TERM and the batch script's forwarded
    TERM arrived together, and Slurm SIGKILLed the step before it could save.
    """
    return watch_stop(signals)


def scrub_env(env: Mapping[str, str], wants_gpus: bool) -> dict[str, str]:
    """The environment sbatch exports to the job (``--export=ALL``).

    When Slurm hands the job GPUs it sets CUDA_VISIBLE_DEVICES itself, so m27's (empty,
    for local CPU steps) value must not reach the job; without GPUs the empty value stays
    and CUDA cannot pick a GPU behind the scheduler's back.
    """
    out = {k: v for k, v in env.items() if k in _KEEP or not k.startswith(_DROP_PREFIXES)}
    if wants_gpus:
        out.pop("CUDA_VISIBLE_DEVICES", None)
    return out


def check_options(
    options: Mapping[str, Any],
    *,
    timeout: float | None = None,
    step: str = "",
    gpus: int = 0,
    site: Mapping[str, Any] | None = None,
) -> SlurmOptions:
    """A step's ``slurm:`` options merged with the site file's (`site` when given) and its
    tier's, every value checked, as its job will be submitted: `m27 validate` and `m27
    run` call it before a run starts. Raises SpecError naming the key, or ConfigError for
    a bad site file."""
    site_options = load_site_options() if site is None else site
    return parse_options(options, site=site_options, timeout=timeout, step=step, gpus=gpus)


def run_slurm_step(
    launch: StepLaunch,
    store: EventStore,
    *,
    options: Mapping[str, Any],
    clock: Clock | None = None,
    on_lines: Callable[[str, list[str]], None] | None = None,
    cancel: threading.Event | None = None,
    resume_from: Callable[[], str | None] | None = None,
    cli: SlurmCli | None = None,
    site: Mapping[str, Any] | None = None,
    python: str | None = None,
    gpus: int = 0,
) -> StepResult:
    """Run the step as Slurm jobs (one per attempt) and wait for the last one to end.

    `options` is the step's ``slurm:`` mapping, `gpus` the step's own GPU count (asked
    from Slurm when the options name none); `site` defaults to the site file (see
    :func:`m27.executors.slurm._script.load_site_options`). `cli` and `python` (the interpreter the
    batch script runs ``m27.executors.slurm._resume`` with) are for tests and unusual clusters.
    """

    def attempts(clock: Clock, sink: Sink, log_path: Path) -> Callable[[int], AttemptEnd]:
        opts = check_options(
            options, timeout=launch.timeout, step=launch.step, gpus=gpus, site=site
        )
        slurm = cli or SubprocessSlurm()
        job = _Job(
            launch, store, clock, sink, slurm, opts, log_path, python or sys.executable or "python3"
        )
        return lambda n: job.attempt(n, cancel, resume_from)

    return run_in_step_log(launch, store, clock, on_lines, cancel, attempts)


@dataclass(frozen=True)
class _Job(StepJobs):
    """One step's attempts: script, submission, following, judging. `python` runs
    ``m27.executors.slurm._resume`` in the batch script."""

    python: str

    def attempt(
        self,
        attempt: int,
        cancel: threading.Event | None,
        resume_from: Callable[[], str | None] | None,
    ) -> AttemptEnd:
        launch, sink = self.launch, self.sink
        opened = begin_attempt(launch, sink, attempt, resume_from)
        if isinstance(opened, AttemptEnd):
            return opened
        g = open_guard(launch, opened[0], self.store, self.clock, sink.note)
        argv, resume = g.argv, opened[1] or g.resume_path
        job_dir = join_under(self.log_path.parent, f"{launch.step}.slurm", f"attempt-{attempt}")
        try:
            script = self._write_script(job_dir, attempt, argv, g.resume_path is None)
        except OSError as exc:
            sink.note(f"cannot write the batch script: {exc}")
            return AttemptEnd(False, f"cannot write the batch script: {exc}", retryable=False)
        env = scrub_env(child_env(launch, attempt, resume), self.opts.wants_gpus)
        try:
            job_id = self.cli.submit(script, env)
        except SlurmError as exc:
            sink.note(str(exc))
            return AttemptEnd(False, str(exc), retryable=exc.transient)  # names sbatch
        self.store.append(
            [
                SlurmJobSubmitted(
                    **launch.head(self.clock.now()),
                    job_id=job_id,
                    attempt=attempt,
                    slurm_conf=env.get("SLURM_CONF", ""),
                )
            ]
        )
        sink.write(f"=== attempt {attempt}: Slurm job {job_id} ({script}) ===\n")
        sink.flush()
        follower = Follower(self, job_id=job_id, job_dir=job_dir, attempt=attempt, argv=argv)
        with g.watching():  # a shared workdir: the program's checkpoints are captured here
            followed = follower.follow(cancel)
        return self._judge(followed, g)

    def _write_script(
        self, job_dir: Path, attempt: int, argv: tuple[str, ...], add_resume: bool = True
    ) -> Path:
        job_dir.mkdir(parents=True, exist_ok=True)
        for name in ("stdout", "stderr", "starts"):  # left by an earlier run of this attempt
            (job_dir / name).unlink(missing_ok=True)
        text = render_script(
            ScriptInput(
                run_id=self.launch.run_id,
                step=self.launch.step,
                attempt=attempt,
                argv=argv,
                job_dir=job_dir.absolute(),
                workdir=self.launch.workdir.absolute() if self.launch.workdir else None,
                python=self.python,
                options=self.opts,
                **_self_checkpoint_script(self.launch, add_resume),
            )
        )
        path = job_dir / "job.sh"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
        return path.absolute()

    def _judge(self, r: FollowResult, g: Guarded) -> AttemptEnd:
        if r.cancelled:
            code, sig = _code_signal(r.info)
            return AttemptEnd(False, "cancelled", code, sig, cancelled=True)
        if r.lost is not None:
            return AttemptEnd(False, r.lost)
        info = r.info
        assert info is not None
        code, sig = _code_signal(info)
        state = info.state
        if state == "COMPLETED" and code == 0:
            # the batch script passes Slurm's time-limit signal on and requeues: a program
            # stopped by a signal here is the script's doing, -maxh is the program's own
            early = stopped_early_end(self.launch, self.sink.tail, g, signalled=False)
            if early is not None:
                return AttemptEnd(False, early[0], code, sig, retryable=early[1])
            if missing := self.launch.missing_outputs():
                return AttemptEnd(
                    False, f"declared output missing: {', '.join(missing)}", code, sig
                )
            return AttemptEnd(True, "succeeded", code, sig)
        how = (
            f"killed by {_signame(sig)}"
            if sig is not None
            else f"exited with code {code}"
            if code is not None
            else "no exit code"
        )
        detail = {
            "TIMEOUT": f"reached its time limit ({self.opts.time or 'default'} min)",
            "OUT_OF_MEMORY": f"went over its memory limit ({self.opts.mem or 'default'})",
            "NODE_FAIL": f"its node {info.node or ''} failed".replace("  ", " "),
            "PREEMPTED": "preempted by a higher-priority job",
            "CANCELLED": "cancelled outside m27 (scancel)",
            "DEADLINE": "missed its deadline",
            "BOOT_FAIL": "its node failed to boot",
        }.get(state, how)
        if state == "COMPLETED":
            state = "FAILED"  # COMPLETED with a non-zero code cannot happen; be safe
        reason = f"Slurm {state}: {detail}"
        if detail != how and state not in ("TIMEOUT", "CANCELLED"):
            reason += f", {how}"
        # Someone cancelled the job by hand: they meant it, do not submit it again.
        return AttemptEnd(False, reason, code, sig, retryable=state != "CANCELLED")


def _self_checkpoint_script(launch: StepLaunch, add_resume: bool) -> dict[str, Any]:
    """A program that checkpoints itself gets its signal on USR1, and its restarts resume
    from the file it wrote (unless this submission already resumes from a capture)."""
    spec = launch.self_checkpoint
    if spec is None or not spec.files:
        return {}
    return {
        "resume_args": spec.resume if add_resume else (),
        "recipe": spec.recipe or "",
        "child_signal": spec.signal,
        "requeue_on_clean_exit": True,
    }


def _code_signal(info: JobInfo | None) -> tuple[int | None, int | None]:
    """(exit code, signal); the batch script exits 128+N when its step died of signal N."""
    if info is None:
        return None, None
    code, sig = info.exit_code, info.signal
    if sig is None and code is not None and 128 < code < 128 + 65:
        return None, code - 128
    return code, sig


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def cancel_job(job_id: str, slurm_conf: str = "") -> None:
    """``scancel JOB``, for `m27 cancel` on a run whose process died (pid 0 steps), with
    the ``SLURM_CONF`` the job was submitted with (`slurm_conf`; "": this environment's)."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SlurmError(f"not a Slurm job id: {job_id!r}")
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    SubprocessSlurm(env).cancel(job_id)


__all__ = [
    "REQUEUE_EXIT_CODE",
    "SlurmOptions",
    "cancel_job",
    "check_options",
    "load_site_options",
    "run_slurm_step",
    "scrub_env",
    "watch_preemption",
]
