"""The `checkpoint:` field: an interval, or what a self-checkpointing program writes.

`checkpoint: 300s` stays what it always was (the interval m27.Checkpointer and engine
recipes read). The mapping form tells m27 about a program that checkpoints itself:

    checkpoint:
      every: 5m                      # optional; recipes turn it into program options
      files: [simulation.cpt]        # globs relative to the step's workdir, captured
      resume: [-cpi, simulation.cpt] # arguments added when the step resumes
      signal: TERM                   # what the program checkpoints on (TERM, USR1, INT)

What a recipe (``m27.executors.engines``) adds is decided later, from the rendered argv.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from m27.spec._nodes import describe, is_null, suggest
from m27.units import parse_duration, quoted

if TYPE_CHECKING:
    from m27.spec._check import Checker

KEYS = ("every", "files", "resume", "signal")
SIGNALS = ("TERM", "USR1", "INT")


@dataclass(frozen=True)
class CheckpointField:
    """What `checkpoint:` said, read and checked."""

    every: float | None = None
    files: tuple[str, ...] = ()
    resume: tuple[str, ...] | None = None
    signal: str | None = None


def read_checkpoint(checker: Checker, node: Node, where: str) -> CheckpointField | None:
    """The field's value; problems go to `checker` (None when nothing usable was read)."""
    if _bare_placeholder(node):
        checker.add(
            node,
            where,
            "a value that starts with '{{' must be quoted, e.g. \"{{CHECKPOINT}}\" "
            "(YAML reads a bare {{...}} as a mapping)",
        )
        return None
    if not isinstance(node, MappingNode):
        interval = _duration(checker, node, where)
        return None if interval is None else CheckpointField(every=interval)
    keys = checker.mapping(node, where, KEYS)
    if keys is None:
        return None
    before = len(checker.problems)
    every: float | None = None
    files: list[str] = []
    resume: tuple[str, ...] | None = None
    signal: str | None = None
    if (entry := keys.get("every")) is not None and not is_null(entry[1]):
        every = _duration(checker, entry[1], f"{where}.every")
    if (entry := keys.get("files")) is not None and not is_null(entry[1]):
        files = _files(checker, entry[1], f"{where}.files")
    if (entry := keys.get("resume")) is not None and not is_null(entry[1]):
        resume = _resume(checker, entry[1], f"{where}.resume")
    if (entry := keys.get("signal")) is not None and not is_null(entry[1]):
        signal = _signal(checker, entry[1], f"{where}.signal")
    if len(checker.problems) > before:
        return None
    if every is None and not files and resume is None and signal is None:
        # `checkpoint: {}` (or only nulls) ran the step with no checkpoint at all, silently
        checker.add(
            node,
            where,
            "says nothing: give an interval (checkpoint: 300s) or at least one of "
            f"{', '.join(KEYS)} (an engine's recipe fills in the rest), or leave it out",
        )
        return None
    return CheckpointField(every, tuple(files), resume, signal)


def _bare_placeholder(node: Node) -> bool:
    """`checkpoint: {{X}}` unquoted: YAML's flow mapping whose only key is a mapping."""
    return (
        isinstance(node, MappingNode)
        and bool(node.flow_style)
        and len(node.value) == 1
        and isinstance(node.value[0][0], MappingNode)
    )


#: Checkpoints further apart than this, at least: each one is a pass over the state (or a
#: copy of the program's files), and `checkpoint: 5ms` is more often a typo for `5m`.
MIN_EVERY_S = 1.0


def _duration(checker: Checker, node: Node, where: str) -> float | None:
    """A duration, where `"{{CHECKPOINT}}"` takes its value from the variables."""
    text = str(node.value) if isinstance(node, ScalarNode) else ""
    value: float | None
    if isinstance(node, ScalarNode) and "{{" in text:
        rendered = _rendered(checker, node, where)
        if rendered is None:
            return None
        try:
            parsed = parse_duration(rendered)
        except ValueError as exc:
            checker.add(node, where, f"{quoted(rendered)} (from {quoted(node.value)}): {exc}")
            return None
        if not parsed > 0 or parsed == float("inf"):
            checker.add(node, where, f"must be longer than zero, got {quoted(rendered)}")
            return None
        text, value = rendered, parsed
    else:
        value = checker.duration(node, where)
    if value is not None and value < MIN_EVERY_S:
        ms = text.strip().removesuffix("ms")
        typo = f" (did you mean {ms + 'm'!r}?)" if ms.isdigit() and int(ms) <= 60 else ""
        checker.add(
            node,
            where,
            f"a checkpoint every {text.strip()!r} is more often than once a second: each one "
            f"is a pass over the state or a copy of the program's files{typo}",
        )
        return None
    return value


def _rendered(checker: Checker, node: Node, where: str) -> str | None:
    text = checker.text(node, where)
    if text is None:
        return None
    return checker.render_plain(checker.template(node, where, text))


def _files(checker: Checker, node: Node, where: str) -> list[str]:
    out: list[str] = []
    items = node.value if isinstance(node, SequenceNode) else [node]
    for i, item in enumerate(items):
        path = f"{where}[{i}]" if isinstance(node, SequenceNode) else where
        value = _rendered(checker, item, path)
        if value is None:
            continue
        pure = PurePosixPath(value)
        if not value.strip():
            checker.add(item, path, "must not be empty")
        elif pure.is_absolute() or value.startswith("~"):
            relative = "must be relative to the step's workdir (a glob like *.cpt)"
            checker.add(item, path, f"{quoted(value)} {relative}")
        elif ".." in pure.parts:
            inside = "must stay inside the step's workdir (no '..')"
            checker.add(item, path, f"{quoted(value)} {inside}")
        else:
            out.append(value)
    return out


def _resume(checker: Checker, node: Node, where: str) -> tuple[str, ...] | None:
    if isinstance(node, SequenceNode):
        args = []
        for i, item in enumerate(node.value):
            value = _rendered(checker, item, f"{where}[{i}]")
            if value is not None:
                args.append(value)
        return tuple(args)
    # one string: split like a command without a shell (a value stays one argument)
    text = checker.text(node, where)
    if text is None:
        return None
    return checker.split_words(node, where, text, checker.template(node, where, text), "it")


def _signal(checker: Checker, node: Node, where: str) -> str | None:
    if not isinstance(node, ScalarNode):
        checker.add(node, where, f"must be one of {', '.join(SIGNALS)}, got {describe(node)}")
        return None
    raw = str(node.value).strip().upper()
    name = raw[3:] if raw.startswith("SIG") else raw
    if name not in SIGNALS:
        hint = suggest(name, SIGNALS) or f" (use one of {', '.join(SIGNALS)})"
        checker.add(node, where, f"unknown signal {quoted(node.value)}{hint}")
        return None
    return name
