"""Pipeline files: YAML in, a validated and rendered :class:`Pipeline` out.

Validation reports every problem at once, each with file:line:column and a field path
(`pipeline[1].depends_on[0]`), because a user fixing a file wants the whole list, not one
error per run. `{{NAME}}` variables come from `vars:` defaults and `--set NAME=value`
overrides, and are substituted so that a value can never become shell syntax or extra
arguments: see docs/pipelines.md and :mod:`m27.spec._template`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from m27._exceptions import SpecError
from m27.spec._check import Checker
from m27.spec._model import EXECUTORS, STEP_TYPES, Pipeline, Problem, Step
from m27.spec._template import VAR_NAME

__all__ = [
    "EXECUTORS",
    "STEP_TYPES",
    "Pipeline",
    "Problem",
    "SpecError",
    "Step",
    "load_pipeline",
    "parse_pipeline",
    "parse_set_args",
]


def load_pipeline(path: str | Path, overrides: Mapping[str, str] | None = None) -> Pipeline:
    """Read, validate and render the pipeline file at `path`; raises SpecError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem = Problem(str(path), 0, 0, "", f"cannot read the pipeline file: {reason}")
        raise _error([problem], path) from None
    return parse_pipeline(text, path, overrides)


def parse_pipeline(
    text: str, path: str | Path, overrides: Mapping[str, str] | None = None
) -> Pipeline:
    """Validate and render pipeline `text`; `path` names it in problems and anchors
    relative paths and the default name. Raises SpecError listing every problem."""
    checker = Checker(str(path), Path(path), overrides or {})
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise _error([_syntax_problem(str(path), exc)], path) from None
    except yaml.YAMLError as exc:  # a reader error: a character YAML does not allow
        line, column = _position(text, getattr(exc, "position", 0))
        reason = str(exc).splitlines()[0]
        problem = Problem(str(path), line, column, "", f"YAML syntax error: {reason}")
        raise _error([problem], path) from None
    pipeline = checker.pipeline(root)
    if pipeline is None:
        problems = sorted(checker.problems, key=lambda p: (p.line, p.column))
        raise _error(problems, path)
    return pipeline


def parse_set_args(items: Sequence[str]) -> dict[str, str]:
    """`["NAME=value", ...]` from the command line; the value is taken verbatim (it is never
    read as YAML or as a template); a later NAME wins. Raises SpecError for a bad item."""
    out: dict[str, str] = {}
    problems = []
    for index, item in enumerate(items):
        name, sep, value = item.partition("=")
        if not sep:
            message = f"expected NAME=VALUE, got {item!r}"
        elif not VAR_NAME.match(name):
            message = f"bad variable name {name!r} (use letters, digits and _)"
        else:
            out[name] = value
            continue
        problems.append(Problem("--set", 0, 0, f"--set[{index}]", message))
    if problems:
        raise _error(problems, "--set")
    return out


def _error(problems: list[Problem], path: str | Path) -> SpecError:
    return SpecError("\n".join(map(str, problems)), problems=problems, file=str(path))


def _syntax_problem(file: str, exc: yaml.MarkedYAMLError) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    message = f"YAML syntax error: {exc.problem or exc.context}"
    if exc.context and exc.problem and exc.context_mark:
        message += f" ({exc.context} on line {exc.context_mark.line + 1})"
    return Problem(file, line, column, "", message)


def _position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1
