"""Pipeline files: YAML in, a validated and rendered :class:`Pipeline` out.

Validation reports every problem at once, each with file:line:column and a field path
(`pipeline[1].depends_on[0]`), because a user fixing a file wants the whole list, not one
error per run. `{{NAME}}` variables come from `vars:` defaults and `--set NAME=value`
overrides, and are substituted so that a value can never become shell syntax or extra
arguments: see docs/pipelines.md and :mod:`m27.spec._template`.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import yaml
from yaml.nodes import Node

from m27._exceptions import SpecError
from m27.paths import not_a_file
from m27.spec._check import Checker
from m27.spec._limits import FILE_BYTES_MAX, SLURM_KEYS
from m27.spec._model import EXECUTORS, STEP_TYPES, Pipeline, Problem, Step
from m27.spec._nodes import MAX_PROBLEMS
from m27.spec._shape import shape_problem
from m27.spec._template import VAR_NAME
from m27.units import quoted

__all__ = [
    "EXECUTORS",
    "FILE_BYTES_MAX",
    "FLOW_PARAMETERS",
    "MAX_DEPTH",
    "MAX_PROBLEMS",
    "PRINTED_PROBLEMS",
    "SLURM_KEYS",
    "STEP_TYPES",
    "Pipeline",
    "Problem",
    "SpecError",
    "Step",
    "load_pipeline",
    "overrides_from",
    "parse_pipeline",
    "parse_set_args",
    "problem_lines",
    "yaml_shape_problem",
]

#: Problems a person is shown as text; the rest are counted ("... and K more"), so a file
#: with 200,000 unknown keys prints 51 lines, whichever command read it.
PRINTED_PROBLEMS = 50
#: Deepest nesting of lists and mappings a pipeline file may have (steps need about 4).
MAX_DEPTH = 64
#: libyaml when present: the pure-Python loader takes ~2.5 us per character (12 s for 5 MB).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Up to this size a file libyaml rejects is parsed again for the pure-Python message.
_RETRY_LIMIT = 256 * 1024


def load_pipeline(
    path: str | Path,
    overrides: Mapping[str, str] | None = None,
    *,
    each_run: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Pipeline:
    """Read, validate and render the pipeline file at `path`; raises SpecError. With
    `each_run`, a variable `vars:` declares without a value is no problem: it is left to
    each run (`Pipeline.unset`), as a deployment's runs give it. `$NAME` in `env:`,
    `workdir:` and `output:` is read from `environ` (default: this process's)."""
    try:
        data = _read(Path(path))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if str(path) == "-" and not Path(path).exists():
            # the pipeline's folder is its steps' default workdir and `--resume` reads the
            # file again: a pipeline from stdin would have neither
            reason = "m27 reads a pipeline from a file, not from stdin (`-`); save it first"
        problem = Problem(str(path), 0, 0, "", f"cannot read the pipeline file: {reason}")
        raise _error([problem], path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error([_not_utf8(str(path), data, exc)], path) from None
    return parse_pipeline(text, path, overrides, each_run=each_run, environ=environ)


def _read(path: Path) -> bytes:
    """The file's bytes. A FIFO, `/dev/zero` or a socket is refused before it is opened
    (opening a FIFO waits for a writer; `/dev/zero` never ends), and a file of more than
    FILE_BYTES_MAX before it is read whole."""
    kind = not_a_file(path)
    if kind == "a folder":
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if kind == "a pipe":  # `<(generate.sh)` too: the file is needed again (above)
        raise OSError(
            errno.EINVAL, "it is a pipe; m27 reads a pipeline from a file (save it first)"
        )
    if kind is not None:
        raise OSError(errno.EINVAL, f"it is {kind}, not a pipeline file")
    with path.open("rb") as f:
        data = f.read(FILE_BYTES_MAX + 1)
    if len(data) > FILE_BYTES_MAX:
        mib = FILE_BYTES_MAX // (1024 * 1024)
        raise OSError(errno.EFBIG, f"it is larger than {mib} MiB: not a pipeline file")
    return data


def parse_pipeline(
    text: str,
    path: str | Path,
    overrides: Mapping[str, str] | None = None,
    *,
    each_run: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Pipeline:
    """Validate and render pipeline `text`; `path` names it in problems and anchors
    relative paths and the default name. Raises SpecError listing every problem."""
    with _collector_paused():
        return _parse(text, path, overrides, each_run, environ)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a document's nodes are built and read:
    a million live YAML nodes make each full collection slower, which made 100,000 steps
    take 2.6 times as long. The nodes are freed by reference counting afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse(
    text: str,
    path: str | Path,
    overrides: Mapping[str, str] | None,
    each_run: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Pipeline:
    checker = Checker(str(path), Path(path), overrides or {}, each_run, environ)
    checker.source = text
    try:
        root = _compose(text)
    except RecursionError:  # the pure-Python composer recurses once per nesting level
        raise _error([_too_deep(str(path), text)], path) from None
    except yaml.MarkedYAMLError as exc:
        raise _error([_syntax_problem(str(path), exc, text)], path) from None
    except yaml.YAMLError as exc:  # a reader error: a character YAML does not allow
        line, column = _position(text, getattr(exc, "position", 0))
        reason = str(exc).splitlines()[0]
        problem = Problem(str(path), line, column, "", f"YAML syntax error: {reason}")
        raise _error([problem], path) from None
    if root is not None and (bad := shape_problem(root, text, MAX_DEPTH)) is not None:
        node, message = bad
        where = (node.start_mark.line + 1, node.start_mark.column + 1)
        raise _error([Problem(str(path), *where, "", message)], path)
    pipeline = checker.pipeline(root)
    if pipeline is None:
        problems = sorted(checker.problems, key=lambda p: (p.line, p.column))
        raise _error(problems, path, len(problems) + checker.dropped)
    return pipeline


def parse_set_args(items: Sequence[str]) -> dict[str, str]:
    """`["NAME=value", ...]` from the command line; the value is taken verbatim (it is never
    read as YAML or as a template); a later NAME wins. Raises SpecError for a bad item."""
    out: dict[str, str] = {}
    problems = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            message = "expected NAME=VALUE, e.g. --set INPUT_FILE=x.pdb"
        elif not VAR_NAME.match(name):
            message = f"bad variable name {quoted(name)} (use letters, digits and _)"
        else:
            out[name] = value
            continue
        problems.append(Problem("command line", 0, 0, f"--set {item}", message))
    if problems:
        raise _error(problems, "command line")
    return out


def yaml_shape_problem(text: str) -> str | None:
    """`LINE:COLUMN: why` when a YAML document nests too deep, holds itself through an
    alias or expands past its limit through aliases (see :mod:`m27.spec._shape`), for
    other YAML files m27 reads (the site's slurm.yaml); None when it is fine to load."""
    try:
        root = _compose(text)
    except RecursionError:
        return f"1:1: nesting deeper than {MAX_DEPTH} levels"
    if root is None or (bad := shape_problem(root, text, MAX_DEPTH)) is None:
        return None
    node, message = bad
    return f"{node.start_mark.line + 1}:{node.start_mark.column + 1}: {message}"


#: Where a problem with a flow run's parameters is said to be (Prefect's UI edits them).
FLOW_PARAMETERS = "flow parameters"


def overrides_from(value: object) -> dict[str, str]:
    """The `{{VAR}}` values of a flow run: its `overrides` parameter, which a deployment
    holds and Prefect's UI lets a person edit as JSON. Text is taken as it is, a number or
    true/false as JSON writes it (`5`, `2.5`, `true`); anything else raises SpecError
    naming the entry, instead of a TypeError deep in validation."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        message = f"must be a mapping of NAME to value, got {type(value).__name__}"
        raise _error([Problem(FLOW_PARAMETERS, 0, 0, "overrides", message)], FLOW_PARAMETERS)
    out: dict[str, str] = {}
    problems = []
    for name, item in value.items():
        if isinstance(item, str):
            out[str(name)] = item
        elif isinstance(item, bool):
            out[str(name)] = "true" if item else "false"
        elif isinstance(item, int | float) and math.isfinite(item):
            out[str(name)] = json.dumps(item)
        else:
            shown = (
                "null"
                if item is None
                else repr(item)
                if isinstance(item, float)
                else type(item).__name__
            )
            message = f"must be text or a number, got {shown}"
            problems.append(Problem(FLOW_PARAMETERS, 0, 0, f"overrides.{name}", message))
    if problems:
        raise _error(problems, FLOW_PARAMETERS)
    return out


def problem_lines(exc: SpecError, limit: int = PRINTED_PROBLEMS) -> list[str]:
    """What a person sees of `exc`: its first `limit` problems, then how many more."""
    problems: list[Problem] = list(exc.context.get("problems") or [])
    if not problems:
        return str(exc).splitlines()
    total = int(exc.context.get("total", len(problems)))
    lines = [str(p) for p in problems[:limit]]
    if total > len(lines):
        lines.append(f"... and {total - len(lines)} more problem(s)")
    return lines


def _error(problems: list[Problem], path: str | Path, total: int | None = None) -> SpecError:
    """The SpecError for `problems`; `total` counts those found beyond the ones kept."""
    total = len(problems) if total is None else total
    message = "\n".join(map(str, problems))
    if total > len(problems):
        message += f"\n... and {total - len(problems)} more problem(s)"
    # a lone surrogate in a key or field path must not make printing the message fail
    message = message.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return SpecError(message, problems=problems, file=str(path), total=total)


def _compose(text: str) -> Node | None:
    """The document's node tree with libyaml; a file it rejects is read again by the
    pure-Python loader (when not huge), whose messages name the YAML rule that failed."""
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError:
        if _LOADER is yaml.SafeLoader or len(text) > _RETRY_LIMIT:
            raise
    return yaml.compose(text, Loader=yaml.SafeLoader)


def _too_deep(file: str, text: str) -> Problem:
    """Where nesting first passes MAX_DEPTH, from the parser's events (which do not recurse)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH and (mark := event.start_mark) is not None:
                    message = f"nesting deeper than {MAX_DEPTH} levels"
                    return Problem(file, mark.line + 1, mark.column + 1, "", message)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        pass
    return Problem(file, 1, 1, "", f"nesting deeper than {MAX_DEPTH} levels")


def _not_utf8(file: str, data: bytes, exc: UnicodeDecodeError) -> Problem:
    """line:column (in characters) of the first byte that is not UTF-8."""
    start = data.rfind(b"\n", 0, exc.start) + 1
    line = data.count(b"\n", 0, exc.start) + 1
    column = len(data[start : exc.start].decode("utf-8", errors="replace")) + 1
    byte = data[exc.start]
    message = f"not UTF-8 text: byte 0x{byte:02x} cannot be decoded; save the file as UTF-8"
    return Problem(file, line, column, "", message)


def _syntax_problem(file: str, exc: yaml.MarkedYAMLError, text: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    message = f"YAML syntax error: {exc.problem or exc.context}"
    if exc.context and exc.problem and exc.context_mark:
        message += f" ({exc.context} on line {exc.context_mark.line + 1})"
    source = _line(text, line)
    if (bare := _BARE_TEMPLATE.search(source)) is not None:
        value = source[bare.start(1) :].strip()
        message += (
            f"; a value that starts with '{{{{' must be quoted, e.g. \"{value}\" "
            "(YAML reads a bare {{...}} as a mapping)"
        )
    elif exc.problem == "mapping values are not allowed here" and (
        (keyed := _KEYED_VALUE.match(source)) is not None
    ):
        message += (
            f"; the value of {quoted(keyed.group(1))} holds ': ', which YAML reads as a new "
            "key: put "
            f"the whole value in quotes, or write `{keyed.group(1)}: >-` and the value on the "
            "next line, indented"
        )
    elif "'\\t'" in message and source[: column - 1].strip() == "":
        message += "; YAML indents with spaces, not tabs: replace the tab with spaces"
    return Problem(file, line, column, "", message)


#: `key: value` (or `- key: value`) on a line: the key whose unquoted value holds a `: `.
_KEYED_VALUE = re.compile(r"\s*(?:-\s+)?([A-Za-z_][\w.-]*):\s+[^\s'\"]")
#: `key: {{X}}...` or `- {{X}}...` with the template unquoted, as a syntax error's line shows it.
_BARE_TEMPLATE = re.compile(r"(?:^|:|-)\s+(\{\{[^'\"]*)$")


def _line(text: str, number: int) -> str:
    """Line `number` (1-based) of `text`, found without splitting the whole text."""
    start = 0
    for _ in range(number - 1):
        start = text.find("\n", start) + 1
        if start == 0:
            return ""
    end = text.find("\n", start)
    return text[start:] if end == -1 else text[start:end]


def _position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1
