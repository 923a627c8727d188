"""What several commands share: the node's log and state, run-id lookup, liveness, output."""

from __future__ import annotations

import json
import socket
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from m27 import liveness, runids
from m27._exceptions import ConfigError, SpecError
from m27.cli.commands._notes import shown_path
from m27.config import m27_home
from m27.events.state import NodeState, RunState, fill_in, fold, live_runs
from m27.store.sqlite import SqliteEventStore, open_store
from m27.units import closest, format_size, listed, quoted

if TYPE_CHECKING:  # the commands that need no pipeline file do not import yaml
    from m27.spec import Pipeline, Problem, Step


def store() -> SqliteEventStore:
    return open_store(m27_home())


def outline(st: SqliteEventStore) -> NodeState:
    """Every run as a whole (status, times, process, vars), the node's own facts, and no
    step's progress: what finding or listing runs needs, from a few events per run rather
    than the whole log (480k events took 1.3 s to fold; see ``EventStore.read_runs``)."""
    return fold(st.read_runs((), outline=True))


def in_full(st: SqliteEventStore, known: NodeState, run_ids: Iterable[str]) -> NodeState:
    """`known` (an :func:`outline`) with the runs `run_ids` and every run still running
    (a step's GPU may be shared with any of them) filled in from their own events."""
    wanted = {*run_ids, *(r.run_id for r in live_runs(known))}
    return fill_in(known, fold(st.read_runs(wanted)), wanted)


def run_state(st: SqliteEventStore, run_id: str, after: int = 0) -> NodeState:
    """The state of run `run_id` alone, from its events after `after` (those of a run
    this process started then, or all): what waiting for one run's end needs."""
    return fold(st.read_runs((run_id,), after=after))


def step_problem(pipeline: Pipeline, step: Step, message: str, key: str = "") -> Problem:
    """A problem found after parsing, named as the file's own problems are: at the value
    of the step's `key` (`FILE:LINE:COLUMN: pipeline[0].gpus: step 'x' ...`), else at
    the step's line, the file as the user gave it (relative to here)."""
    from m27.spec import Problem  # called with a pipeline: spec is loaded

    line, column = step.marks.get(key, (step.line, 0))
    field = f"{step.where}.{key}" if key in step.marks and step.where else ""
    return Problem(shown_path(pipeline), line, column, field, f"step {step.name!r}{message}")


def beyond_gpus(
    pipeline: Pipeline, count: int, largest: int | None, gpus_are: str, memory_is: str
) -> list[Problem]:
    """One problem per step that asks for more GPUs than `count`, or more GPU memory than
    `largest` (None: not known), each ending in what the node has ("this node has 2",
    "the largest GPU here has 80.0GiB"): such a step would wait in the queue forever."""
    problems = []
    for step in pipeline.steps:
        if step.executor == "slurm":
            continue  # Slurm gives its GPUs, on its nodes
        if step.uses_gpu and step.gpus > count:
            problems.append(
                step_problem(pipeline, step, f" needs {step.gpus} GPUs; {gpus_are} {count}", "gpus")
            )
        elif step.uses_gpu and largest is not None and (step.gpu_memory or 0) > largest:
            asks = format_size(step.gpu_memory or 0)
            problems.append(
                step_problem(
                    pipeline,
                    step,
                    f" asks for gpu_memory {asks}; {memory_is} {format_size(largest)}",
                    "gpu_memory",
                )
            )
    return problems


def slurm_problems(pipeline: Pipeline) -> list[Problem]:
    """One line per Slurm step whose options (with the site file's and its tier's) sbatch
    would refuse or m27 cannot read, found before the run instead of at its step."""
    slurm_steps = [s for s in pipeline.steps if s.executor == "slurm"]
    if not slurm_steps:
        return []
    from m27.executors.slurm import check_options, load_site_options  # only when used

    try:
        site = load_site_options()
    except ConfigError as exc:
        from m27.spec import Problem

        return [Problem(shown_path(pipeline), 0, 0, "", str(exc))]
    problems = []
    for step in slurm_steps:
        options = dict(step.slurm)
        while True:  # each key's problem: the check stops at the first, so drop that key
            try:
                check_options(
                    options, timeout=step.timeout, step=step.name, gpus=step.gpus, site=site
                )
                break
            except SpecError as exc:
                problems.append(step_problem(pipeline, step, f": {exc}"))
                if exc.context.get("key") not in options:
                    break
                del options[exc.context["key"]]
    return problems


def find_run(state: NodeState, prefix: str) -> RunState:
    return state.runs[runids.resolve(prefix, state.runs.keys())]


def shown_status(run: RunState) -> str:
    """The run's status, with `crashed` for a run whose process died: closed by the node
    service's crash watcher (``RunCrashed``), or not yet closed (no end event)."""
    if run.crashed:
        return "crashed"
    if run.status != "running":
        return run.status
    if (
        run.pid
        and run.host == socket.gethostname()
        and not liveness.alive(run.pid, run.pid_started)
    ):
        return "crashed"
    return "running"


def made_by(entry: str, steps: Iterable[str]) -> list[str]:
    """The steps of a run that a `matrix:` entry called `entry` made (`md.1`, `md.2`), by
    name: what `m27 cancel`, `m27 bump` and `m27 logs` take the entry's name for."""
    return [n for n in steps if n.startswith(entry + ".")]


def no_such_step(run_id: str, step: str, steps: Iterable[str]) -> str:
    """`run R has no step 'anlyse' (did you mean 'analyse'? its steps: ...)`: what `m27
    logs` and `m27 bump` say of a step name the run lacks (the first 20 of a wide run's);
    for the name of a `matrix:` entry, the steps it made (`md` -> `md.1`, `md.2`)."""
    names = list(steps)
    if members := made_by(step, names):
        return (
            f"run {run_id} has no step {quoted(step)}; its matrix made the steps "
            f"{listed(members, 20)}: name one"
        )
    hint = closest(step, names)
    maybe = f"did you mean {hint!r}? " if hint else ""
    return f"run {run_id} has no step {quoted(step)} ({maybe}its steps: {listed(names, 20)})"


def once_per_matrix(steps: Sequence[Step]) -> list[tuple[Step, str]]:
    """Each step with the name to say it by, a `matrix:` entry's steps once (its first,
    as `md.* (100 steps)`): what validation says of one replica it says of all, and a
    sweep of 100 printed every line 100 times."""
    sizes = Counter(s.group for s in steps if s.group is not None)
    out: list[tuple[Step, str]] = []
    said: set[str] = set()
    for s in steps:
        if s.group is None or sizes[s.group] == 1:
            out.append((s, s.name))
        elif s.group not in said:
            said.add(s.group)
            out.append((s, f"{s.group}.* ({sizes[s.group]} steps)"))
    return out


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def how_it_failed(exit_code: int | None, signal: int | None, reason: str) -> str:
    """Why a step failed, in one phrase: the reason, with the exit code where it adds one.

    The reason already says how it ended ("exited with code 3", "killed by SIGKILL",
    "timed out after 2.0s"); the summary and `m27 status` used to put the code before it
    as well (`exit 3 exited with code 3`, `signal 9 timed out after 2.0s`)."""
    if not reason:
        if exit_code is not None:
            return f"exit {exit_code}"
        return f"signal {signal}" if signal else ""
    if exit_code == 0:  # e.g. a declared output missing
        return f"exited 0, but {reason}"
    if exit_code is not None and str(exit_code) not in reason:
        return f"{reason} (exit {exit_code})"
    return reason
