"""A flow run's parameters, checked before the run is recorded.

`m27 run` hands the flow values it made itself, but a deployment's run takes them from
Prefect, whose UI lets a person edit them as JSON ("Custom run"): `overrides` with a
number in it, a `run_id` another run already has (its events would mix with that run's),
a `resume_of` that names no run (every step would start over while the run says it
resumes). Each is a problem with the run's input, said in one line in the run's log and
its Failed state, not a traceback.
"""

from __future__ import annotations

import socket

from m27 import liveness
from m27.events import RunSubmitted
from m27.events.state import RunState, fold
from m27.paths import name_problem, same_file
from m27.runids import RunIdError, resolve
from m27.spec import FLOW_PARAMETERS, Pipeline, Problem, SpecError, load_pipeline, overrides_from
from m27.store import EventStore


def _refuse(field: str, message: str) -> SpecError:
    problem = Problem(FLOW_PARAMETERS, 0, 0, field, message)
    return SpecError(str(problem), problems=[problem], file=FLOW_PARAMETERS, total=1)


def pipeline_of(spec_path: object, overrides: object) -> Pipeline:
    """The validated pipeline; SpecError for a bad parameter or pipeline file."""
    if not isinstance(spec_path, str) or not spec_path:
        raise _refuse("spec_path", "must be the path of a pipeline file")
    return load_pipeline(spec_path, overrides_from(overrides))


def fresh_run_id(store: EventStore, run_id: object) -> str:
    """`run_id` when no run in the log has it yet; SpecError otherwise."""
    if not isinstance(run_id, str):
        raise _refuse("run_id", f"must be a run id, got {type(run_id).__name__}")
    if (why := name_problem(run_id)) is not None:  # it names folders under $M27_HOME
        raise _refuse("run_id", f"{run_id!r} is not a run id: it {why}")
    if any(isinstance(r.event, RunSubmitted) for r in store.read_runs((run_id,))):
        raise _refuse("run_id", f"run {run_id} is already in the event log; leave run_id empty")
    return run_id


def resumed_run(store: EventStore, resume_of: object, pipeline: Pipeline) -> str | None:
    """The run `resume_of` names (an id, a unique prefix or `last`, as `m27 run --resume`
    takes), or None; SpecError when it names none or several, or a run of another
    pipeline (its succeeded steps would be skipped wherever `pipeline` has a step of the
    same name; the same file with its `name:` edited is the same pipeline)."""
    if resume_of is None or resume_of == "":
        return None
    if not isinstance(resume_of, str):
        raise _refuse("resume_of", f"must be a run id, got {type(resume_of).__name__}")
    runs = fold(store.read_runs((), outline=True)).runs
    try:
        found = resolve(resume_of, runs)
    except RunIdError as exc:
        raise _refuse("resume_of", str(exc)) from None
    old = runs[found]
    renamed = same_file(pipeline.path, old.spec_path)  # the same file, its `name:` edited
    if old.pipeline and old.pipeline != pipeline.name and not renamed:
        message = f"run {found} is of pipeline {old.pipeline!r}, not {pipeline.name!r}"
        raise _refuse("resume_of", message)
    if _still_running(old):
        raise _refuse(
            "resume_of",
            f"run {found} is still running (pid {old.pid} on {old.host}); resuming it now "
            "would run its steps twice; wait for it to end, or cancel it, then resume",
        )
    later = next((r for r in runs.values() if r.resume_of == found and _still_running(r)), None)
    if later is not None:
        raise _refuse(
            "resume_of",
            f"run {later.run_id} resumes {found} and is still running (pid {later.pid} on "
            f"{later.host}); resuming {found} again would run its steps twice",
        )
    return found


def _still_running(run: RunState) -> bool:
    """Whether `run` has no end and its process may still run it: alive here, or on
    another node (whose own crash watcher records its end, if it died)."""
    if run.status != "running" or run.crashed or not run.pid:
        return False
    if run.host != socket.gethostname():
        return True
    return liveness.alive(run.pid, run.pid_started)


def rerun_steps(rerun: object, resume_of: str | None, pipeline: Pipeline) -> list[str]:
    """The step names `rerun` gives (a list of them, none for None), each once; SpecError
    for a name `pipeline` lacks, or any without `resume_of` (a run that resumes nothing
    runs every step anyway)."""
    if rerun is None or rerun == []:
        return []
    if not isinstance(rerun, list) or not all(isinstance(n, str) for n in rerun):
        raise _refuse("rerun", f"must be a list of step names, got {rerun!r:.200}")
    if resume_of is None:
        raise _refuse("rerun", "needs resume_of: a run that resumes none runs every step")
    try:
        pipeline.rerun_steps(rerun)
    except KeyError as exc:
        raise _refuse("rerun", str(exc.args[0])) from None
    return list(dict.fromkeys(rerun))
