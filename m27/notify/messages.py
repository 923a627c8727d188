"""Events -> short Telegram messages (HTML parse mode), readable on a phone.

Pure: the text depends only on the event and the run facts folded up to and including it,
so every kind has a golden file (tests/unit/golden/notify/). Everything that came from a
user or a process (run ids, reasons, log lines) is HTML-escaped; a message stays well
under Telegram's 4096-character limit by trimming the log tail first.
"""

from __future__ import annotations

import html
import signal as _signal
from dataclasses import dataclass

from m27 import events as ev
from m27.notify.facts import NodeFacts, RunFacts
from m27.units import format_duration

#: Telegram rejects longer texts; keep a margin for the header and links.
MAX_TEXT = 4000
LOG_LINES = 10
LOG_LINE_CHARS = 200


@dataclass(frozen=True)
class Message:
    """One text for the chats; ``kind`` drives filters and quiet hours."""

    kind: str
    text: str


def esc(value: object) -> str:
    return html.escape(str(value), quote=False)


def resume_command(run_id: str) -> str:
    # --detach: pasted into an ssh session from a phone, the run outlives that session
    return f"m27 run --resume {run_id} --detach"


def _signal_name(num: int) -> str:
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _how_it_ended(exit_code: int | None, sig: int | None, reason: str = "") -> str:
    """How a failed attempt ended; an exit 0 that still failed (a declared output missing)
    reads `exited 0, but ...`, not `exit code 0` with the reason on another line."""
    if sig is not None:
        return f"killed by {_signal_name(sig)}"
    if exit_code == 0 and reason:
        return f"exited 0, but {reason}"
    if exit_code is not None:
        return f"exit code {exit_code}"
    return "no exit status (process lost)"


def _log_block(tail: str, budget: int) -> str:
    lines = [line[:LOG_LINE_CHARS] for line in tail.rstrip("\n").splitlines()[-LOG_LINES:]]
    while lines:
        block = "<pre>" + esc("\n".join(lines)) + "</pre>"
        if len(block) <= budget:
            return block
        lines = lines[1:]
    return ""


def _prefect_link(run: RunFacts | None) -> list[str]:
    if run is None or not run.prefect_url:
        return []
    return [f'<a href="{html.escape(run.prefect_url, quote=True)}">Open in Prefect</a>']


def _header(icon: str, title: str, node: str) -> str:
    where = f" <i>[{esc(node)}]</i>" if node else ""
    return f"{icon} <b>{title}</b>{where}"


def _energy(joules: float | None) -> str:
    if joules is None:
        return ""
    kwh = joules / 3.6e6
    return f" · {kwh:.2f} kWh" if kwh >= 0.01 else f" · {joules / 3600:.1f} Wh"


def _join(lines: list[str]) -> str:
    return "\n".join(line for line in lines if line)


def _run_line(run_id: str, run: RunFacts) -> str:
    """How a message names a run: its id (tap to copy) and its pipeline."""
    return f"<code>{esc(run_id)}</code> · {esc(run.pipeline or '?')}"


def _step_line(run_id: str, step: str) -> str:
    """How a message names a step: its run's id and the step in bold."""
    return f"<code>{esc(run_id)}</code> / <b>{esc(step)}</b>"


def _resume_line(run_id: str) -> str:
    """The command that resumes the run, ready to copy."""
    return f"Resume: <code>{esc(resume_command(run_id))}</code>"


def _run_succeeded(e: ev.RunSucceeded, run: RunFacts, node: str) -> Message:
    total = len(run.steps)
    lines = [
        _header("✅", "Run succeeded", node),
        _run_line(e.run_id, run),
        f"{run.steps_done}/{total} steps · {format_duration(e.duration_s)}",
        f"{run.gpu_seconds / 3600:.2f} GPU-h{_energy(run.energy_j)}"
        if run.gpu_seconds or run.energy_j is not None
        else "",
        *_prefect_link(run),
    ]
    return Message("run_succeeded", _join(lines))


def _run_failed(e: ev.RunFailed, run: RunFacts, node: str) -> Message:
    failure = run.last_failure
    crashed = failure is not None and failure.signal is not None
    lines = [
        _header("💥" if crashed else "❌", "Run crashed" if crashed else "Run failed", node),
        f"{_run_line(e.run_id, run)} · {format_duration(e.duration_s)}",
    ]
    steps = list(e.failed_steps) or ([failure.step] if failure else [])
    if failure is not None:
        how = _how_it_ended(failure.exit_code, failure.signal, failure.reason)
        lines.append(f"step <b>{esc(failure.step)}</b> (attempt {failure.attempt}): {esc(how)}")
        if failure.reason and failure.reason not in how:
            lines.append(f"reason: {esc(failure.reason)}")
    elif steps:
        lines.append("failed: " + ", ".join(f"<b>{esc(s)}</b>" for s in steps))
    if e.reason and (failure is None or e.reason != failure.reason):
        lines.append(esc(e.reason))
    tail_lines = [
        f"log: <code>{esc(failure.log_path)}</code>" if failure and failure.log_path else "",
        _resume_line(e.run_id),
        *_prefect_link(run),
    ]
    if failure is not None and failure.log_tail:
        used = len(_join(lines + tail_lines)) + 2
        lines.append(_log_block(failure.log_tail, MAX_TEXT - used))
    return Message("run_failed", _join(lines + tail_lines))


def _run_crashed(e: ev.RunCrashed, run: RunFacts, node: str) -> Message:
    """The run's own process died (kill -9, OOM, power cut): no exit code to show."""
    running = [name for name, s in run.steps.items() if s.status == "running"]
    lines = [
        _header("💥", "Run crashed", node),
        _run_line(e.run_id, run),
        esc(e.reason) if e.reason else "",
        ("was running: " + ", ".join(f"<b>{esc(s)}</b>" for s in running)) if running else "",
        # the node service resumes it: a /resume now would be refused while that runs
        "The node resumes it by itself (<code>on_crash: resume</code>) unless it was a "
        "resume that got no further; /runs shows the new run."
        if run.on_crash == "resume"
        else _resume_line(e.run_id),
        *_prefect_link(run),
    ]
    return Message("run_failed", _join(lines))


def _auto_resume_skipped(e: ev.AutoResumeSkipped, run: RunFacts, node: str) -> Message:
    """`on_crash: resume`, but the node did not resume it (the crash message said it
    would): a person has to, so it counts as a failure to be told."""
    lines = [
        _header("⚠️", "Crashed run not resumed", node),
        _run_line(e.run_id, run),
        esc(e.reason),
        _resume_line(e.run_id),
    ]
    return Message("run_failed", _join(lines))


def _run_cancelled(e: ev.RunCancelled, run: RunFacts, node: str) -> Message:
    by = run.cancel_requested_by
    lines = [
        _header("⏹", "Run cancelled", node),
        _run_line(e.run_id, run),
        f"by {esc(by)}" if by else "",
        esc(e.reason) if e.reason else "",
        _resume_line(e.run_id),
    ]
    return Message("run_cancelled", _join(lines))


def _step_retried(e: ev.StepFailed, node: str) -> Message:
    lines = [
        _header("🔁", "Step retried", node),
        _step_line(e.run_id, e.step),
        f"attempt {e.attempt} failed after {format_duration(e.duration_s)}: "
        f"{esc(_how_it_ended(e.exit_code, e.signal, e.reason))}",
        f"reason: {esc(e.reason)}" if e.reason and e.exit_code != 0 else "",
        f"attempt {e.attempt + 1} follows",
    ]
    return Message("step_retried", _join(lines))


def _restored_how(e: ev.CheckpointRestored) -> str:
    where = f"<code>{esc(e.path)}</code>"
    if not e.files:
        return f"resumed at step {e.sim_step} from {where}"
    at = f" at step {e.engine_step}" if e.engine_step is not None else ""
    return f"restored {esc(', '.join(e.files))}{at} from {where}"


def _checkpoint_restored(e: ev.CheckpointRestored, node: str) -> Message:
    lines = [
        _header("♻️", "Checkpoint restored", node),
        _step_line(e.run_id, e.step),
        _restored_how(e),
    ]
    return Message("checkpoint_restored", _join(lines))


def _gpu_lost(e: ev.GpuLost, node: str) -> Message:
    uuid = f" (<code>{esc(e.uuid)}</code>)" if e.uuid else ""
    lines = [
        _header("🚨", f"GPU {e.gpu} lost", node) + uuid,
        esc(e.reason) if e.reason else "",
        "its steps are requeued from their last checkpoint",
    ]
    return Message("gpu_lost", _join(lines))


def _gpu_hot(e: ev.GpuOverheated, node: str) -> Message:
    lines = [
        _header("🌡", f"GPU {e.gpu} hot", node),
        f"{e.temperature_c:.0f} °C (alert at {e.threshold_c:.0f} °C)",
    ]
    return Message("gpu_hot", _join(lines))


def _gpu_throttled(e: ev.GpuThrottled, node: str) -> Message:
    reasons = ", ".join(esc(r) for r in e.reasons) or "unknown reason"
    lines = [_header("🐢", f"GPU {e.gpu} throttled", node), reasons]
    return Message("gpu_throttled", _join(lines))


def _agent_restarted(e: ev.AgentStarted, node: str) -> Message:
    where = f" on {esc(e.host)}" if e.host else ""
    detail = f"pid {e.pid}" + (f" · {e.gpus} GPUs" if e.gpus else "")
    detail += f" · {esc(e.backend)}" if e.backend else ""
    lines = [
        _header("🔄", "Agent restarted" + where, node),
        detail,
        "unfinished steps resume from their last checkpoint",
    ]
    return Message("agent_restarted", _join(lines))


def render(event: ev.Event, facts: NodeFacts, node: str = "") -> Message | None:
    """The message for `event`, or None when it is not worth a phone buzz.

    `facts` must already include `event` (apply first, then render).
    """
    run = facts.runs.get(str(getattr(event, "run_id", "")))
    if isinstance(event, ev.RunSucceeded) and run is not None:
        return _run_succeeded(event, run, node)
    if isinstance(event, ev.RunFailed) and run is not None:
        return _run_failed(event, run, node)
    if isinstance(event, ev.RunCancelled) and run is not None:
        return _run_cancelled(event, run, node)
    if isinstance(event, ev.RunCrashed) and run is not None:
        return _run_crashed(event, run, node)
    if isinstance(event, ev.AutoResumeSkipped) and run is not None:
        return _auto_resume_skipped(event, run, node)
    if isinstance(event, ev.StepFailed) and event.will_retry:
        return _step_retried(event, node)
    if isinstance(event, ev.CheckpointRestored):
        return _checkpoint_restored(event, node)
    if isinstance(event, ev.AgentStarted):
        return _agent_restarted(event, node) if facts.agent_starts > 1 else None
    if isinstance(event, ev.GpuLost):
        return _gpu_lost(event, node)
    if isinstance(event, ev.GpuOverheated):
        return _gpu_hot(event, node)
    if isinstance(event, ev.GpuThrottled):
        return _gpu_throttled(event, node)
    return None


def hello_message(host: str, when: str) -> Message:
    lines = [
        "👋 <b>m27 test message</b>",
        f"from <code>{esc(host)}</code> at {esc(when)}",
        "Notifications for this chat work.",
    ]
    return Message("test", _join(lines))
