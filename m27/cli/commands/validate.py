"""`m27 validate FILE`: every problem of a pipeline file at once, without running it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from m27._exceptions import SpecError
from m27.cli.commands import _common, _notes
from m27.cli.commands._explain import explain_checkpoint
from m27.cli.commands._options import add_command, add_set_option
from m27.gpu import parse_gpus_env
from m27.spec import Pipeline, Problem, load_pipeline, parse_set_args, problem_lines
from m27.units import count


def _safe(text: str) -> str:
    """`text` with anything stdout could not encode escaped (a lone surrogate, say)."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, errors="backslashreplace").decode(encoding)


def _beyond_sim_gpus(pipeline: Pipeline) -> list[Problem]:
    """With `M27_GPUS=sim:NxSIZE` the node's GPUs are known without opening NVML: a step
    asking for more GPUs or memory than they have is bad input now, not at run time.
    (`m27 run` checks the real GPUs the same way.) A bad M27_GPUS is a ConfigError."""
    value = os.environ.get("M27_GPUS", "")
    if not value.lower().startswith("sim:"):
        return []
    gpus, memory = parse_gpus_env(value)
    sim = f"M27_GPUS={value}"
    return _common.beyond_gpus(pipeline, gpus, memory, f"{sim} has", f"the GPUs of {sim} have")


#: `m27 validate` names at most this many steps on its "order:" line (--json has them all).
ORDER_SHOWN = 12


def _size(pipeline: Pipeline) -> str:
    """`3 steps`, or `8 steps; matrix: md 6, per_seed 2` when a matrix made some."""
    made = Counter(s.group for s in pipeline.steps if s.group is not None)
    size = count(len(pipeline.steps), "step")
    if not made:
        return size
    return size + "; matrix: " + ", ".join(f"{name} {n}" for name, n in made.items())


def _order_line(order: list[str]) -> str:
    """The run order on one line a terminal can hold: a 5,000-step pipeline printed a
    line of 5,000 names. The first and last few, and how many lie between."""
    if len(order) <= ORDER_SHOWN:
        return " -> ".join(order)
    head, tail = order[: ORDER_SHOWN - 2], order[-2:]
    hidden = len(order) - len(head) - len(tail)
    return " -> ".join([*head, f"... ({hidden} more)", *tail])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_command(sub, "validate", run)
    parser.add_argument("file", help="the pipeline YAML file")
    add_set_option(parser, dest="set_vars")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Check a pipeline file: print 'OK' and the step order, or every problem as
    file:line:column: field: message (exit status 2). A note names a step whose program
    is not on PATH here (still OK: an earlier step may install it)."""
    try:
        pipeline = load_pipeline(args.file, parse_set_args(args.set_vars))
    except SpecError as exc:
        problems = exc.context.get("problems", [])
        total = exc.context.get("total", len(problems))
        if args.json:
            found = [p.to_dict() for p in problems]
            print(_safe(json.dumps({"ok": False, "total": total, "problems": found})))
        else:
            # --json keeps the first MAX_PROBLEMS; text shows PRINTED_PROBLEMS of them
            for line in problem_lines(exc):
                print(_safe(line))
            print(f"{total} problem(s) found", file=sys.stderr)
        return 2
    if problems := _beyond_sim_gpus(pipeline) + _common.slurm_problems(pipeline):
        if args.json:
            found = [p.to_dict() for p in problems]
            print(_safe(json.dumps({"ok": False, "total": len(found), "problems": found})))
        else:
            print(_safe("\n".join(map(str, problems))))
            print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 2
    order = pipeline.topo_order()
    notes = _notes.pipeline_notes(pipeline)
    if args.json:
        steps = [
            {
                "name": s.name,
                "type": s.type,
                "argv": list(s.argv),
                "depends_on": list(s.depends_on),
                "outputs": list(s.outputs),
                "gpus": s.gpus,
                "priority": s.priority,
                "line": s.line,
                "matrix": s.group,
                "checkpoint": explain_checkpoint(s, pipeline.workdir_of(s)).to_dict(),
            }
            for s in pipeline.steps
        ]
        result = {
            "ok": True, "pipeline": pipeline.name, "order": order, "steps": steps,
            "on_crash": pipeline.on_crash, "notes": notes,
        }  # fmt: skip
        print(json.dumps(result))
    else:
        print(f"OK: pipeline {pipeline.name!r} ({_size(pipeline)})")
        print("order: " + _order_line(order))
        if pipeline.on_crash == "resume":
            print(
                "on crash: the node service resumes a run whose process died (a power cut, a "
                "reboot), from its checkpoints (on_crash: resume)"
            )
        for s, name in _common.once_per_matrix(pipeline.steps):
            for line in explain_checkpoint(s, pipeline.workdir_of(s)).lines(name):
                print(line)
        for note in _notes.shown_notes(notes):
            print(_safe(f"note: {note}"))
    return 0
