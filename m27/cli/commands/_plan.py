"""What `m27 run` will do before it starts: a resume's plan (which steps run, which are
skipped as done, which start over and why) and `m27 run --dry-run`'s account of it, with
the checkpoint each step that runs would go on from."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from m27 import tables
from m27.checkpoint import scan
from m27.checkpoint.files import capture_dir, matched, newer_than_captures
from m27.config import m27_home
from m27.executors.engines import plan_for_step, recipe_named
from m27.paths import join_under
from m27.spec import Pipeline, Step
from m27.store.chain import chain, gone_note, rerun_note, successes
from m27.tables import Col

if TYPE_CHECKING:
    from m27.store.sqlite import SqliteEventStore


@dataclass(frozen=True)
class ResumePlan:
    """A resume's steps: those that run (file order), those skipped (with the run each
    succeeded in), those `--rerun` runs again and those run again for their gone outputs
    (both from the start; `asked`: the steps `--rerun` named, a matrix entry's name its
    steps), the notes said before it starts, and the chain of runs it resumes (newest
    first)."""

    notes: list[str]
    runs: list[str]
    done: dict[str, str]
    rerun: frozenset[str]
    asked: tuple[str, ...]
    outputs_gone: dict[str, list[str]]
    chain: list[str]


def resume_plan(
    st: SqliteEventStore, run_id: str, pipeline: Pipeline, rerun: list[str]
) -> ResumePlan:
    """What a resume of run `run_id` with `--rerun` `rerun` does, and its notes.

    A note for the steps `rerun` names (:meth:`Pipeline.rerun_steps`), and for each step
    that succeeded in `run_id` (or a run it resumed) that the resume runs again, its
    outputs gone (:meth:`Pipeline.rerun_for_outputs`), or does not run again though
    `pipeline` now gives it another command: a fix made to it in the file would otherwise
    be silently left out."""
    runs_chain = chain(st, run_id)
    found = successes(st, runs_chain)
    forced = pipeline.rerun_steps(rerun)
    again = pipeline.rerun_for_outputs(found.keys() - set(forced))
    runs = {*forced, *again}
    left = [s.name for s in pipeline.steps if s.name not in found or s.name in runs]
    done = {name: s.run_id for name, s in found.items() if name not in runs}
    asked = [s.name for s in pipeline.steps if s.name in rerun or s.group in rerun]
    lines = [rerun_note(rerun, forced, asked)] if forced else []
    lines += [gone_note(name, gone, found[name].run_id) for name, gone in again.items()]
    for step in pipeline.steps:
        was = found.get(step.name)
        if was is None or not was.command or step.name in runs:
            continue
        if (now := shlex.join(step.argv)) != was.command:
            lines.append(
                f"step {step.name} succeeded in run {was.run_id} as `{was.command}`; the file "
                f"now says `{now}`, and a resume does not run it again unless asked to "
                f"(--rerun {step.name} runs it and the steps after it)"
            )
    if not left:  # nothing runs, so nothing needs them: said, not run again
        lines += [
            f"step {step.name}'s {'output' if len(gone) == 1 else 'outputs'} "
            f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone, and no step left "
            f"to run needs {'it' if len(gone) == 1 else 'them'} (--rerun {step.name} makes "
            f"{'it' if len(gone) == 1 else 'them'} again)"
            for step in pipeline.steps
            if (gone := pipeline.missing_outputs(step.name))
        ]
    return ResumePlan(lines, left, done, frozenset(forced), tuple(asked), dict(again), runs_chain)


def _checkpoint_of(step: str, runs: list[str]) -> str | None:
    """Where a resumed step would go on from: the newest valid checkpoint (or capture of
    its own files) in the runs of the chain, newest run first, as the flow looks."""
    root = m27_home() / "checkpoints"
    for run_id in runs:
        folder = join_under(root, run_id, step)
        for where in (folder, capture_dir(folder)):
            valid = [e.info for e in scan(where) if e.valid and e.info is not None]
            if valid:
                at = valid[-1].engine_step if where != folder else valid[-1].sim_step
                return f"run {run_id}'s checkpoint" + (f" at step {at}" if at is not None else "")
    return None


def _resumes_from(pipeline: Pipeline, step: Step, runs: list[str]) -> str | None:
    """Where a resumed step would go on from, as the runner will find it: the program's
    own checkpoint file in the workdir when it is complete and newer than every capture
    (the program wrote it after m27's last capture), else :func:`_checkpoint_of`."""
    found = _checkpoint_of(step.name, runs)
    plan = plan_for_step(step) if found is not None else None
    recipe = recipe_named(plan.recipe) if plan is not None else None
    if plan is None or recipe is None or not plan.files:
        return found
    root = m27_home() / "checkpoints"
    captures = [capture_dir(join_under(root, run_id, step.name)) for run_id in runs]
    workdir = pipeline.workdir_of(step)
    if not newer_than_captures(captures, workdir, plan.files, recipe.valid_file):
        return found
    names = matched(workdir, plan.files)
    try:  # the least, as a capture says it: how far every file (each replica's) got
        steps = [recipe.recorded_step(n, (workdir / n).read_bytes()) for n in names]
        at = min((s for s in steps if s is not None), default=None)
    except OSError:
        at = None
    here = f" at step {at}" if at is not None else ""
    return f"{', '.join(names)} in the workdir{here} (complete, newer than {found})"


def print_dry_run(pipeline: Pipeline, plan: ResumePlan | None) -> None:
    """`m27 run --dry-run`: each step and what the run would do with it; nothing starts."""
    rows = []
    for step in pipeline.steps:
        name = step.name
        if plan is None:
            will = "run"
        elif name in plan.done:
            will = f"skip: succeeded in run {plan.done[name]}"
        elif name in plan.asked:
            will = "run, from the start (--rerun)"
        elif name in plan.rerun:
            will = "run, from the start (it waits on a step --rerun runs)"
        elif name in plan.outputs_gone:
            will = f"run again, from the start: {', '.join(plan.outputs_gone[name])} gone"
        else:
            found = _resumes_from(pipeline, step, plan.chain)
            will = f"run, from {found}" if found else "run, from the start"
        rows.append((name, step.type, will))
    what = f"a resume of run {plan.chain[0]}" if plan else "a new run"
    print(f"m27 run --dry-run: {pipeline.name} ({what}); nothing is started")
    tables.show([Col("STEP", wrap=True), Col("TYPE"), Col("WILL", wrap=True)], rows, indent=2)
    if plan is not None and not plan.runs:
        print("nothing would run: every step succeeded (--rerun STEP runs one again)")
