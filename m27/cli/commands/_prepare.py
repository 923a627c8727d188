"""What `m27 run` reads before anything starts: the pipeline file, its `--set` values,
and for `--resume` the run it resumes, what that run leaves to do (`--rerun` adds to
it), and every reason not to resume it (still running, another pipeline, nothing left)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple

from m27._exceptions import SpecError
from m27.cli.commands import _common, _notes
from m27.cli.commands._plan import ResumePlan, resume_plan
from m27.events.state import RunState
from m27.paths import same_file
from m27.spec import Pipeline, load_pipeline, parse_set_args


class Prepared(NamedTuple):
    """The pipeline `m27 run` runs, its variables, the run it resumes and the resume's
    plan (None, None: a new run)."""

    pipeline: Pipeline
    overrides: dict[str, str]
    resume_of: str | None
    plan: ResumePlan | None


def prepare(args: argparse.Namespace) -> Prepared:
    """What `m27 run` runs; SystemExit for bad input (2) or a resume with nothing left to
    run (0; with --dry-run that is shown as any plan)."""
    overrides = given = parse_set_args(args.sets)
    resume_of: str | None = None
    plan: ResumePlan | None = None
    file = args.file
    args.rerun = list(dict.fromkeys(args.rerun))  # each once, as given (the flow gets these)
    if args.rerun and not args.resume:
        print(
            "m27 run: --rerun needs --resume RUN_ID (a new run runs every step): m27 run "
            f"--resume last --rerun {args.rerun[0]}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if args.resume:
        known = _common.outline(_common.store())
        old = _common.find_run(known, args.resume)
        if _common.shown_status(old) == "running" and old.pid:
            print(
                f"m27 run: run {old.run_id} is still running (pid {old.pid}); resuming it "
                "now would run its steps twice. Wait for it to end, or cancel it "
                f"(m27 cancel {old.run_id}), then resume",
                file=sys.stderr,
            )
            raise SystemExit(2)
        later = next(
            (r for r in known.runs.values()
             if r.resume_of == old.run_id and _common.shown_status(r) == "running" and r.pid),
            None,
        )  # fmt: skip
        if later is not None:
            # the node service's `on_crash: resume` (or a person) got there first
            print(
                f"m27 run: run {later.run_id} resumes {old.run_id} and is still running (pid "
                f"{later.pid}); resuming {old.run_id} again would run its steps twice. Follow "
                f"it (m27 status {later.run_id}), or cancel it (m27 cancel {later.run_id}) "
                "and resume that one",
                file=sys.stderr,
            )
            raise SystemExit(2)
        resume_of = old.run_id
        changed = sorted(k for k, v in overrides.items() if k in old.vars and old.vars[k] != v)
        if changed:
            were = ", ".join(f"{k}={old.vars[k]!r}" for k in changed)
            print(
                f"m27 run: note: run {old.run_id} had {were}; the steps that succeeded there "
                "are not run again with the new value",
                file=sys.stderr,
            )
        overrides = {**old.vars, **overrides}
        if not file and old.spec_path and not os.path.exists(old.spec_path):
            print(
                f"m27 run: {old.spec_path}, the pipeline file of run {old.run_id}, is gone; "
                f"if it moved, give its new path: m27 run --resume {old.run_id} FILE",
                file=sys.stderr,
            )
            raise SystemExit(2)
        file = file or old.spec_path
    if not file:
        print("m27 run: give a pipeline FILE (or --resume RUN_ID)", file=sys.stderr)
        raise SystemExit(2)
    try:
        pipeline = load_pipeline(file, overrides)
    except SpecError:
        if args.resume:
            # the run's `--set` values fit its own pipeline, not this file: that it is
            # another pipeline is the problem to name, not "no variable 'X'"
            _refuse_another_pipeline(old, file, load_pipeline(file, given, each_run=True))
        raise
    if args.resume:
        _refuse_another_pipeline(old, file, pipeline)
    if resume_of is not None:
        try:
            pipeline.rerun_steps(args.rerun)
        except KeyError as exc:
            print(f"m27 run: --rerun: {exc.args[0]}", file=sys.stderr)
            raise SystemExit(2) from None
        plan = resume_plan(_common.store(), resume_of, pipeline, args.rerun)
        for note in _notes.shown_notes(plan.notes):
            print(f"m27 run: note: {note}", file=sys.stderr)
        if (
            not plan.runs and not args.dry_run
        ):  # a run that only skips: nothing for the log, Prefect or the GPUs
            print(
                f"m27 run: every step of run {resume_of} has succeeded (there or in a run it "
                f"resumed): nothing to resume. To run the pipeline again: m27 run {file}; "
                f"to run a step and those after it again: m27 run --resume {resume_of} "
                "--rerun STEP"
            )
            raise SystemExit(0)
    return Prepared(pipeline, overrides, resume_of, plan)


def _refuse_another_pipeline(old: RunState, file: str, pipeline: Pipeline) -> None:
    """SystemExit(2) when `file` is another pipeline than run `old` ran. `--resume last`
    after another pipeline ran: that run's succeeded steps would be skipped here wherever
    a step has the same name (prep, train), and their checkpoints restored into other
    programs."""
    if (
        not old.pipeline
        or pipeline.name == old.pipeline
        or same_file(str(pipeline.path), old.spec_path)
    ):
        return
    print(
        f"m27 run: run {old.run_id} is of pipeline {old.pipeline!r} ({old.spec_path}), "
        f"{file} is pipeline {pipeline.name!r}; resume a run of {pipeline.name!r} (m27 "
        f"runs), or, if {file} is {old.pipeline!r} renamed, give it `name: "
        f"{old.pipeline}`",
        file=sys.stderr,
    )
    raise SystemExit(2)
