"""`m27 validate FILE`: every problem of a pipeline file at once, without running it."""

from __future__ import annotations

import argparse
import json
import sys

from m27._exceptions import SpecError
from m27.spec import load_pipeline, parse_set_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "validate",
        help="check a pipeline file and list every problem",
        description="Check a pipeline file: print 'OK' and the step order, or every problem "
        "as file:line:column: field: message (exit status 2).",
    )
    parser.add_argument("file", help="the pipeline YAML file")
    parser.add_argument(
        "--set",
        dest="set_vars",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="give a {{NAME}} variable a value (repeatable; the value is taken verbatim)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        pipeline = load_pipeline(args.file, parse_set_args(args.set_vars))
    except SpecError as exc:
        problems = exc.context.get("problems", [])
        if args.json:
            print(json.dumps({"ok": False, "problems": [p.to_dict() for p in problems]}))
        else:
            for problem in problems:
                print(problem)
            print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 2
    order = pipeline.topo_order()
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
            }
            for s in pipeline.steps
        ]
        result = {"ok": True, "pipeline": pipeline.name, "order": order, "steps": steps}
        print(json.dumps(result))
    else:
        print(f"OK: pipeline {pipeline.name!r} ({len(pipeline.steps)} steps)")
        print("order: " + " -> ".join(order))
    return 0
