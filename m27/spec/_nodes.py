"""Reading typed values out of YAML nodes while collecting problems with positions.

The spec is read from `yaml.compose` nodes rather than loaded Python objects so that every
problem can point at a line and column. Text fields take the scalar exactly as written
(`sleep 5.10` stays `5.10`, `command: true` is the program `true`), since YAML's number and
boolean guesses are never what a command line meant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from m27.spec._limits import RENDERED_FIELD_MAX, RENDERED_TOTAL_MIN
from m27.spec._model import Problem
from m27.spec._template import Placeholder, scan
from m27.units import QUOTE_MAX, closest, parse_duration, parse_size, quoted

T = TypeVar("T")
N = TypeVar("N", int, float)

_TAG = "tag:yaml.org,2002:"
NULL, BOOL, INT, FLOAT, MERGE = (_TAG + t for t in ("null", "bool", "int", "float", "merge"))
_PLAIN_TAGS = frozenset({NULL, BOOL, INT, FLOAT, _TAG + "str", _TAG + "timestamp"})
#: Problems kept per file: enough to fix, bounded so 5 MB of unknown keys stays cheap.
MAX_PROBLEMS = 1000
#: Longest duration accepted (a year): beyond it a timer overflows or never means anything.
MAX_DURATION_S = 366 * 86400.0
#: Largest size accepted before the node's own GPUs are known (no GPU holds a PiB).
MAX_SIZE = 1024**5


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == NULL


def describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == NULL:
        return "nothing"
    return quoted(node.value)


def suggest(word: str, choices: Collection[str]) -> str:
    """`; did you mean 'x'?` for the closest choice, or ''."""
    close = closest(word, choices)
    return f"; did you mean {close!r}?" if close else ""


#: Where a list variable (`vars: {TEMPS: [300, 310]}`) may stand, said where it may not.
LIST_ONLY = (
    "is a list variable: it can stand only as a whole, unquoted argument of a command "
    "without a shell (`-multidir {{TEMPS}}` gives one argument per value) or as a matrix's "
    "values"
)


@dataclass
class Template:
    """A templated text field: where it is, its placeholders, and whether it can render."""

    node: Node
    field: str
    text: str
    placeholders: list[Placeholder]
    ok: bool


@dataclass
class Reader:
    """Typed access to nodes; every failure becomes a Problem and the reader goes on."""

    file: str
    values: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)  # variables whose definition was invalid
    used: set[str] = field(default_factory=set)  # variables some {{placeholder}} names
    declared: set[str] = field(default_factory=set)  # variables `vars:` names, valued or not
    source: str = ""  # the file's text: marks index into it (the C loader keeps no buffer)
    dropped: int = 0  # problems found beyond MAX_PROBLEMS, counted and not kept
    rendered: int = 0  # characters the templated fields so far render to, all together
    matrix_names: dict[str, str] = field(default_factory=dict)  # name -> its step's name
    matrix_made: int = 0  # steps every matrix so far made, all together
    lists: set[str] = field(default_factory=set)  # variables whose `vars:` value is a list

    def __post_init__(self) -> None:
        self._constructor = yaml.constructor.SafeConstructor()
        #: mappings already read (merges flattened, duplicate keys reported), by id
        self._flattened: set[int] = set()

    def add(self, node: Node, where: str, message: str, offset: int | None = None) -> None:
        if self.full:
            self.dropped += 1
            return
        line, column = _locate(node, offset, self.source)
        self.problems.append(Problem(self.file, line, column, where, message))

    @property
    def full(self) -> bool:
        """True once MAX_PROBLEMS are kept: later ones are only counted."""
        return len(self.problems) >= MAX_PROBLEMS

    def mapping(
        self, node: Node, where: str, known: Collection[str] | None = None
    ) -> dict[str, tuple[Node, Node]] | None:
        """Key -> (key node, value node); reports duplicates and, given `known`, unknown keys."""
        if not isinstance(node, MappingNode):
            self.add(node, where, f"must be a mapping, got {describe(node)}")
            return None
        seen: dict[str, Node] = {}
        for key, _ in [] if id(node) in self._flattened else node.value:
            if isinstance(key, ScalarNode) and key.tag != MERGE:
                if key.value in seen:
                    first = seen[key.value].start_mark.line + 1
                    self.add(key, _join(where, key.value), f"duplicate key (first on line {first})")
                seen[key.value] = key
        try:
            self._constructor.flatten_mapping(node)  # `<<: *defaults` merges
        except yaml.constructor.ConstructorError as exc:
            self.add(node, where, f"bad merge: {exc.problem}")
            return None
        # read again (each step a matrix makes), the merged keys are the node's own now
        self._flattened.add(id(node))
        out: dict[str, tuple[Node, Node]] = {}
        for key, value in node.value:
            if not isinstance(key, ScalarNode) or key.tag == NULL:
                self.add(key, where, f"keys must be plain names, got {describe(key)}")
                continue
            if known is not None and key.value not in known:
                if self.full:  # no suggestion (difflib) for a problem that is only counted
                    self.dropped += 1
                    continue
                hint = suggest(key.value, known) or f" (known keys: {', '.join(known)})"
                self.add(key, _join(where, key.value), f"unknown key {quoted(key.value)}{hint}")
                continue
            out[key.value] = (key, value)
        return out

    def text(self, node: Node, where: str) -> str | None:
        if isinstance(node, ScalarNode) and node.tag not in _PLAIN_TAGS:
            self.add(node, where, f"unsupported YAML tag {node.tag!r}; write plain text")
            return None
        if isinstance(node, ScalarNode) and node.tag != NULL:
            value = str(node.value)
            if not representable(value):
                self.add(node, where, "holds a lone surrogate (e.g. \\ud800), not valid text")
                return None
            return value
        if isinstance(node, MappingNode) and node.flow_style:
            source = self.source[node.start_mark.index : node.end_mark.index]
            if source.startswith("{{"):
                self.add(
                    node,
                    where,
                    "a value that starts with '{{' must be quoted, "
                    f'e.g. "{source}" (YAML reads a bare {{{{...}}}} as a mapping)',
                )
                return None
        self.add(node, where, f"must be a string, got {describe(node)}")
        return None

    def plain(self, node: Node, where: str) -> str | None:
        """text() for a value used as written (a name, an image, a bind): no NUL byte, which
        no path, argument or environment variable can carry."""
        value = self.text(node, where)
        if value is not None and "\0" in value:
            self.add(node, where, "holds a NUL byte, which no path or argument can carry")
            return None
        return value

    def texts(self, node: Node, where: str) -> list[tuple[str, Node, str]] | None:
        """A string or a list of strings, as (text, node, field path) triples."""
        if isinstance(node, SequenceNode):
            out = []
            for i, item in enumerate(node.value):
                value = self.text(item, f"{where}[{i}]")
                if value is not None:
                    out.append((value, item, f"{where}[{i}]"))
            return out
        value = self.text(node, where)
        return None if value is None else [(value, node, where)]

    def integer(
        self, node: Node, where: str, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        if not (isinstance(node, ScalarNode) and node.tag == INT):
            self.add(node, where, f"must be a whole number, got {describe(node)}")
            return None
        if len(node.value) > 30:  # int() of a huge literal is slow and never a sane value
            self.add(node, where, f"is far too large ({len(node.value)} digits)")
            return None
        value = int(self._constructor.construct_object(node))
        if minimum is not None and value < minimum:
            self.add(node, where, f"must be >= {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.add(node, where, f"must be <= {maximum}, got {value}")
            return None
        return value

    def boolean(self, node: Node, where: str) -> bool | None:
        if not (isinstance(node, ScalarNode) and node.tag == BOOL):
            self.add(node, where, f"must be true or false, got {describe(node)}")
            return None
        return bool(self._constructor.construct_object(node))

    def duration(self, node: Node, where: str) -> float | None:
        value = self._unit(node, where, parse_duration, "a duration like 300s, 5m or 50ms")
        if value is not None and not math.isfinite(value):
            self.add(node, where, f"must be a finite duration, got {quoted(node.value)}")
            return None
        return self._positive(node, where, value, "longer", MAX_DURATION_S, "366d")

    def size(self, node: Node, where: str) -> int | None:
        value = self._unit(node, where, parse_size, "a size like 512MiB or 8GiB")
        return self._positive(node, where, value, "larger", MAX_SIZE, "1PiB")

    def _positive(
        self, node: Node, where: str, value: N | None, more: str, most: N, most_text: str
    ) -> N | None:
        """`value` if it is above zero and at most `most`, else None with the problem added
        (`more`: "longer" or "larger" than zero; `most_text`: `most` as the user writes it)."""
        if value is None:
            return None
        if value <= 0:
            self.add(node, where, f"must be {more} than zero, got {quoted(node.value)}")
            return None
        if value > most:
            self.add(node, where, f"must be at most {most_text}, got {quoted(node.value)}")
            return None
        return value

    def raw(self, node: Node, where: str) -> Any:
        """The value as plain Python data, for sections stored as written (slurm:)."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.add(node, where, f"cannot read: {exc}")
            return None

    def template(self, node: Node, where: str, text: str, lists: bool = False) -> Template:
        """Scan `text` for placeholders; report malformed and undefined ones, and those of
        list variables unless the field takes them (`lists`: a command without a shell,
        a matrix's values)."""
        placeholders, malformed = scan(text)
        for bad in malformed:
            self.add(node, where, bad.message, bad.offset)
        ok = not malformed
        for ph in placeholders:
            self.used.add(ph.name)
            if ph.name in self.broken:
                ok = False
            elif ph.name in self.lists and not lists:
                ok = False
                self.add(node, where, f"{{{{{ph.name}}}}} {LIST_ONLY}", ph.start)
            elif ph.name not in self.values:
                ok = False
                close = closest(ph.name, self.values)
                hint = f" (did you mean {close!r}?)" if close else ""
                name = ph.name if len(ph.name) <= QUOTE_MAX else "NAME"
                message = (
                    f"undefined variable {quoted(ph.name)}{hint}; define it with "
                    f"`--set {name}=...` or under vars:"
                )
                if ph.name in self.matrix_names:  # another step's matrix
                    message = (
                        f"undefined variable {quoted(ph.name)}: it is a name of the matrix "
                        f"of step {self.matrix_names[ph.name]!r}, which only that step's "
                        "fields see"
                    )
                if ph.name in self.declared:  # `vars: {INPUT:}` declares a required one
                    message = (
                        f"variable {quoted(ph.name)} has no value: `vars:` declares it "
                        f"without one, so each run must give it (`--set {name}=...`, or "
                        "a deployment's run in its overrides)"
                    )
                self.add(node, where, message, ph.start)
        if ok and placeholders and not self._fits(node, where, text, placeholders):
            ok = False
        return Template(node, where, text, placeholders, ok)

    def _fits(self, node: Node, where: str, text: str, placeholders: list[Placeholder]) -> bool:
        """Whether `text` with its values put in stays within what one field, and the whole
        file, may expand to; reported (the file's total once) before anything is built."""
        size = len(text) + sum(len(self.values[p.name]) - (p.end - p.start) for p in placeholders)
        if size > RENDERED_FIELD_MAX:
            message = (
                f"its variables make it {size:,} characters long; no command, path or "
                f"environment value can be longer than {RENDERED_FIELD_MAX:,}: pass large "
                "data in a file"
            )
            self.add(node, where, message)
            return False
        budget = max(RENDERED_TOTAL_MIN, 10 * len(self.source))
        before, self.rendered = self.rendered, self.rendered + size
        if self.rendered > budget:
            if before <= budget:
                message = (
                    f"variables make this file's fields {self.rendered:,} characters long "
                    f"up to here, more than the {budget:,} a file of this size may expand to: "
                    "pass large data in a file"
                )
                self.add(node, where, message)
            return False
        return True

    def _unit(self, node: Node, where: str, parse: Callable[[Any], T], what: str) -> T | None:
        if not isinstance(node, ScalarNode) or node.tag in (NULL, BOOL):
            self.add(node, where, f"must be {what}, got {describe(node)}")
            return None
        try:
            if node.tag in (INT, FLOAT):
                return parse(self._constructor.construct_object(node))
            return parse(str(node.value))
        except ValueError as exc:
            self.add(node, where, str(exc))
            return None


def _join(where: str, key: str) -> str:
    key = key if len(key) <= QUOTE_MAX else f"{key[:QUOTE_MAX]}..."
    return f"{where}.{key}" if where else key


def representable(text: str) -> bool:
    """True when `text` can be written as UTF-8 (no lone surrogate from a `\\ud800` escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _locate(node: Node, offset: int | None, text: str) -> tuple[int, int]:
    """1-based line and column of `offset` in the node's value, where the source shows it.

    Exact for one-line plain or quote-free quoted scalars and for `|` blocks; otherwise
    the node's start.
    """
    start, end = node.start_mark, node.end_mark
    here = (start.line + 1, start.column + 1)
    if offset is None or not isinstance(node, ScalarNode) or not text:
        return here
    source = text[start.index : end.index]
    value = node.value
    if start.line == end.line:
        for skip in (0, 1):
            if source[skip : skip + len(value)] == value:
                return here[0], here[1] + skip + offset
    elif node.style == "|":
        lines = source.split("\n")[1:]
        body = [line for line in lines if line.strip()]
        indent = len(body[0]) - len(body[0].lstrip(" ")) if body else 0
        row = value.count("\n", 0, offset)
        column = offset - (value.rfind("\n", 0, offset) + 1)
        wanted = value.split("\n")[row]
        if row < len(lines) and lines[row][indent:] == wanted:
            return start.line + 2 + row, indent + column + 1
    return here
