"""`m27 status [RUN]`: a run's steps in detail, or what is live on the node."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import Counter
from typing import Any

from m27 import tables
from m27._exceptions import M27Error
from m27.cli import detach
from m27.cli.commands import _common
from m27.cli.commands._options import add_command
from m27.config import m27_home
from m27.events.state import NodeState, RunState, StepState
from m27.executors.logtail import last_line
from m27.monitoring.energy import energy_by_run, energy_by_step, format_energy
from m27.tables import Col
from m27.units import cpu_list, format_duration, listed, printable


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "status", run)
    p.add_argument("run_id", nargs="?", metavar="RUN")
    p.add_argument("--json", action="store_true", help="JSON, for scripts")


class _Energy:
    """Joules per step and per run, as the exporter recorded them (empty without one)."""

    def __init__(self, state: NodeState) -> None:
        self.by_step = energy_by_step(state)
        self.by_run = energy_by_run(state)


def step_status(r: RunState, s: StepState) -> str:
    """A step's status as users need it: `crashed` (not `running`, `failed` or `lost`) for
    a step whose run's process died under it."""
    if s.status == "running" and _common.shown_status(r) == "crashed":
        return "crashed"
    if s.status == "failed" and s.reason.startswith("run crashed"):
        return "crashed"
    if s.status == "failed" and s.reason.startswith("lost") and r.crashed:
        # the agent found it before the crash watcher (a node starting after a power
        # cut): the same end, told by the other witness
        return "crashed"
    if s.done_before:
        return "succeeded"  # done in the run this one resumes (the note says so)
    return s.status


def retry_note(s: dict[str, Any], now: float) -> str:
    """For a step waiting out its `retry_delay` after a failed attempt: when the next
    attempt asks for its lease. It showed `queued` while `m27 queue` said the queue was
    empty, and nothing said why or for how long."""
    at = s.get("retry_at")
    if at is None or at <= now:
        return ""
    return f"attempt {s['attempts'] + 1} in {format_duration(at - now)} (retry_delay)"


def crash_truth(state: NodeState) -> None:
    """A run whose process died and that no one has closed yet: start the node service,
    whose crash watcher closes it in the log and marks it Crashed in Prefect."""
    if not any(
        r.status == "running" and _common.shown_status(r) == "crashed" for r in state.runs.values()
    ):
        return
    from m27.config import m27_home
    from m27.node.service import ensure_service

    try:
        ensure_service(m27_home())
    except M27Error as exc:  # what the log says is shown all the same
        print(f"m27: {exc}", file=sys.stderr)


def primaries(state: NodeState) -> dict[int, tuple[str, str]]:
    """Each GPU's primary step now, as (run id, step), from the leases its guests do not hold."""
    found: dict[int, tuple[str, str]] = {}
    for key, gpus in state.leases.items():
        if key not in state.guests:
            for gpu in gpus:
                found[gpu] = key
    return found


def _guest(s: StepState, primary: dict[int, tuple[str, str]]) -> dict[str, Any] | None:
    """A running guest's GPU, whether it is held, and beside which step; None otherwise."""
    if s.done or s.tier != "guest" or s.guest_gpu is None:
        return None
    beside = primary.get(s.guest_gpu)
    return {
        "gpu": s.guest_gpu,
        "paused": s.paused,
        "primary": f"{beside[0]}/{beside[1]}" if beside else None,
    }


def _run_dict(
    r: RunState,
    energy: _Energy,
    primary: dict[int, tuple[str, str]] | None = None,
    resumed_by: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    resumed_by = resumed_by or {}
    status = _common.shown_status(r)
    return {
        "run_id": r.run_id,
        "pipeline": r.pipeline,
        "status": status,
        # how it ended (`step b failed`, `SIGTERM received`), "" while it runs
        "reason": r.reason.removeprefix(f"{status}: ") if r.status != "running" else "",
        "spec_path": r.spec_path,
        "vars": dict(r.vars),
        "submitted_at": r.submitted_at,
        "ended_at": r.ended_at,
        "duration_s": r.duration_s,
        "resume_of": r.resume_of,
        "rerun": list(r.rerun),
        # the runs that resume this one (by hand, or the node service's `on_crash: resume`)
        "resumed_by": list(resumed_by.get(r.run_id, ())),
        "on_crash": r.on_crash or "stop",
        # the node service's decision once it crashed: "started", "skipped" (and why), None
        "auto_resume": r.auto_resume or None,
        "auto_resume_reason": r.auto_resume_reason or None,
        "prefect_url": r.prefect_url,
        "flow_run_id": r.flow_run_id,
        # a run started with --detach: what `m27 run` printed (`m27 logs RUN` shows it)
        "output": str(out) if (out := detach.out_path(m27_home(), r.run_id)).is_file() else None,
        "energy_j": energy.by_run.get(r.run_id),
        "steps": {
            name: {
                "type": s.type,
                "status": step_status(r, s),
                "attempts": s.attempts,
                "started_at": s.started_at,
                "ended_at": s.ended_at,
                "exit_code": s.exit_code,
                "signal": s.signal,
                "reason": s.reason,
                "gpus": list(s.gpus or ()),
                "cpus": list(s.cpus),
                "host": s.host,
                "slurm_job_id": s.slurm_job_id,
                "slurm_state": s.slurm_state,
                "slurm_reason": s.slurm_reason,
                "log_path": s.log_path,
                "retry_at": s.retry_at,
                "last_checkpoint": s.last_checkpoint,
                "checkpoint_step": s.checkpoint_step,
                "energy_j": energy.by_step.get((r.run_id, name)),
                "outputs": list(s.outputs),
                "guest": _guest(s, primary or {}),
                "matrix": s.group or None,
                # `m27 cancel RUN STEP` asked it to stop (by whom), None if no one did
                "cancel_requested_by": s.cancel_requested_by or None,
                # a running step's last line of output and when its log was last written
                **_last_output(s if step_status(r, s) == "running" else None),
            }
            for name, s in r.steps.items()
        },
    }


def _last_output(s: StepState | None) -> dict[str, Any]:
    """`last_output` (the last line the running step `s` printed; None before any) and
    `last_output_at` (its log's last write), for a running step only."""
    found = last_line(s.log_path) if s is not None and s.log_path else None
    if found is None:
        return {"last_output": None, "last_output_at": None}
    return {"last_output": found[0], "last_output_at": found[1]}


def _where(s: dict[str, Any]) -> str:
    """GPUs here (`0 (cores 0-7)`: the cores their share confined it to), `cpu`, or the
    Slurm job and node; empty before the step first started."""
    gpus = ",".join(map(str, s["gpus"]))
    if s["slurm_job_id"]:
        on = f" on {s['host']}" if s["host"] else ""
        return f"job {s['slurm_job_id']}{on}" + (f" GPU {gpus}" if gpus else "")
    if gpus and s["cpus"]:
        return f"{gpus} (cores {cpu_list(s['cpus'])})"
    return gpus or ("cpu" if s["started_at"] is not None else "")


def run(args: argparse.Namespace) -> int:
    """Without RUN: runs still in progress. With RUN (an id, a unique prefix, or `last`):
    each step's state, attempts, time, exit."""
    st = _common.store()
    known = _common.outline(st)
    crash_truth(known)
    found = None if args.run_id is None else _common.find_run(known, args.run_id).run_id
    state = _common.in_full(st, known, [found] if found else [])
    energy = _Energy(state)
    primary = primaries(state)
    later: dict[str, list[str]] = {}  # run -> the runs that resume it
    for x in state.runs.values():
        if x.resume_of:
            later.setdefault(x.resume_of, []).append(x.run_id)
    if found is None:
        live = [r for r in state.runs.values() if _common.shown_status(r) == "running"]
        if args.json:
            _common.print_json([_run_dict(r, energy, primary, later) for r in live])
            return 0
        if not live:
            print("no runs in progress (history: `m27 runs`)")
        for r in live:
            _print_run(r, energy, primary, later)
        return 0
    r = state.runs[found]
    if args.json:
        _common.print_json(_run_dict(r, energy, primary, later))
        return 0
    _print_run(r, energy, primary, later)
    return 0


def _print_run(
    r: RunState,
    energy: _Energy,
    primary: dict[int, tuple[str, str]],
    later: dict[str, list[str]],
) -> None:
    d = _run_dict(r, energy, primary, later)
    now = time.time()
    took = format_duration(d["duration_s"]) if d["duration_s"] is not None else "-"
    if d["status"] == "running" and r.submitted_at:
        took = f"for {format_duration(max(0.0, now - r.submitted_at))}"
    shown = d["status"] + (f": {d['reason']}" if d["reason"] else "")  # cancelled: why
    if d["status"] == "cancelled" and d["reason"] == "SIGHUP received":
        shown += " (its terminal closed; `m27 run --resume RUN -d` goes on after that)"
    print(f"run {r.run_id}  pipeline {printable(r.pipeline)}  {shown}  ({took})")
    print(f"  file: {printable(str(r.spec_path))}")
    if r.vars:
        # as `--set` takes them: `SEEDS='1 2'` reads as one value, not two words
        print("  vars: " + " ".join(f"{k}={shlex.quote(printable(v))}" for k, v in r.vars.items()))
    if r.resume_of:
        again = f" (--rerun {' '.join(r.rerun)})" if r.rerun else ""
        print(f"  resumes: {r.resume_of}{again}")
    if d["resumed_by"]:
        print(f"  resumed by: {', '.join(d['resumed_by'])}")
    elif d["auto_resume"] == "started":
        print("  resumed by: the node service is starting it (on_crash: resume)")
    elif d["auto_resume"] == "skipped":
        print(f"  not resumed by the node service (on_crash: resume): {d['auto_resume_reason']}")
    if r.prefect_url:
        print(f"  prefect: {r.prefect_url}")
    if d["output"]:
        print(f"  output: {d['output']} (m27 logs {r.run_id})")
    if d["energy_j"]:
        print(f"  energy: {format_energy(d['energy_j'])} on GPUs")
    rows = []
    for name, s in d["steps"].items():
        took = ""
        if s["started_at"] is not None:
            end = s["ended_at"] if s["ended_at"] is not None else None
            took = format_duration(end - s["started_at"]) if end is not None else "..."
            if end is None and s["status"] == "running":  # so far
                took = format_duration(max(0.0, now - s["started_at"]))
        where = _where(s)
        note = s["reason"] or ""
        if s["slurm_job_id"] and s["status"] in ("queued", "running"):
            why = f" ({s['slurm_reason']})" if s["slurm_reason"] else ""
            note = f"Slurm {s['slurm_state']}{why} {note}".strip()
        if s["status"] == "failed":
            note = _common.how_it_failed(s["exit_code"], s["signal"], s["reason"])
        if s["status"] == "queued" and (retry := retry_note(s, now)):
            note = f"{note}; {retry}" if note else retry
        if d["status"] == "running" and (cancel := cancel_note(s)) is not None:
            note = f"{cancel}; {note}" if note else cancel
        if (guest := s["guest"]) is not None:
            note = f"{_guest_note(r.run_id, guest)} {note}".strip()
        if s["energy_j"]:
            note = f"{note} {format_energy(s['energy_j'])}".strip()
        if s["last_checkpoint"]:
            # "; ": `cancelled checkpoint@985` read as if the checkpoint had been cancelled
            saved = f"checkpoint@{s['checkpoint_step']}"
            note = f"{note}; {saved}" if note else saved
        rows.append((name, s["type"], s["status"], s["attempts"], took, where, note))
    cols = [
        Col("STEP", wrap=True),
        Col("TYPE"),
        Col("STATUS"),
        Col("TRY", right=True),
        Col("TIME", right=True),
        Col("WHERE"),
        Col("NOTE", wrap=True),
    ]
    tables.show(cols, rows, indent=2)
    for line in _matrix_lines(d["steps"]):
        print(line)
    for line in _said_lines(d["steps"], now):
        print(line)
    outputs = [o for s in d["steps"].values() for o in s["outputs"]]
    if outputs:
        print("  outputs: " + listed(outputs, OUTPUTS_SHOWN))


#: outputs `m27 status` names before `and N more` (a sweep's 500 filled the screen)
OUTPUTS_SHOWN = 20
#: running steps whose last output `m27 status` shows, and how much of each line
SAID_SHOWN, SAID_WIDTH = 10, 120


def _said_lines(steps: dict[str, dict[str, Any]], now: float) -> list[str]:
    """`md said 4s ago: step 55900, will finish ...` for each running step that printed
    something: its progress, or a line hours old that says it hangs."""
    said = [(name, s) for name, s in steps.items() if s["last_output"] is not None]
    lines = []
    for name, s in said[:SAID_SHOWN]:
        text = printable(s["last_output"].strip())
        if len(text) > SAID_WIDTH:
            text = text[: SAID_WIDTH - 3] + "..."
        ago = format_duration(max(0.0, now - s["last_output_at"]))
        lines.append(f"  {name} said {ago} ago: {text}")
    if len(said) > SAID_SHOWN:
        lines.append(f"  ... and {len(said) - SAID_SHOWN} more running steps (m27 logs RUN STEP)")
    return lines


def _matrix_lines(steps: dict[str, dict[str, Any]]) -> list[str]:
    """`matrix md: 97 succeeded, 2 running, 1 failed`: each `matrix:` entry's steps by
    status, below the table, where a sweep's hundred rows do not show how it goes."""
    groups: dict[str, Counter[str]] = {}
    for s in steps.values():
        if s["matrix"]:
            groups.setdefault(s["matrix"], Counter())[s["status"]] += 1
    return [
        f"  matrix {name}: " + ", ".join(f"{n} {status}" for status, n in counts.most_common())
        for name, counts in groups.items()
    ]


def cancel_note(s: dict[str, Any]) -> str | None:
    """For a step `m27 cancel RUN STEP` asked to stop that has not ended yet: that it will
    not start (it waits on others, and the run reaches it later) or is being stopped."""
    by = s["cancel_requested_by"]
    if not by or s["status"] in ("succeeded", "failed", "cancelled", "crashed", "skipped"):
        return None
    if s["status"] == "running":
        return f"cancel requested ({by}): stopping"
    return f"cancel requested ({by}): it will not start"


def _guest_note(run_id: str, guest: dict[str, Any]) -> str:
    """`guest beside sim, paused while it computes`: a guest's STATUS alone said running."""
    beside = guest["primary"]
    if beside is None:
        return f"guest on GPU {guest['gpu']}" + (", paused" if guest["paused"] else "")
    if beside.startswith(f"{run_id}/"):
        beside = beside.split("/", 1)[1]  # a step of this run: its name is enough
    if guest["paused"]:
        return f"guest beside {beside}, paused while it computes"
    return f"guest beside {beside}, running in its I/O wait"
