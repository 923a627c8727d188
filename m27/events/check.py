"""Which stored event does not hold the types of its fields: a log edited by hand.

Decoding does not check types: a replay of a million events would pay for it on every
row, and m27 only reads back what it wrote. A row changed by hand or by another program
(`sqlite3 events.db "update events ..."`, a ``"slow"`` where a duration was) then decodes
into an event whose `attempt` is a string, and the command that reads it fails far from
the cause, in a comparison or a format. So the check runs only after such a failure
(:mod:`m27.cli.main`): it finds the first event that does not fit, and the user is told
which row of which file to fix or move aside instead of being asked to report a bug.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from m27.events._base import Event, Recorded

__all__ = ["Misfit", "first_misfit", "first_misfit_in", "misfit"]


@dataclass(frozen=True)
class Misfit:
    """A stored event with a field whose value is not of the field's type."""

    seq: int
    kind: str
    field: str
    value: Any
    expected: str

    def __str__(self) -> str:
        return (
            f"event #{self.seq} ({self.kind}): {self.field} is {self.value!r:.80}, "
            f"not {self.expected}"
        )


def first_misfit(records: Iterable[Recorded]) -> Misfit | None:
    """The first of `records` whose event does not fit its fields' types, else None."""
    for record in records:
        found = misfit(record.event)
        if found is not None:
            field, value, expected = found
            kind = type(record.event).__name__
            return Misfit(record.seq, kind, field, value, expected)
    return None


def first_misfit_in(
    read: Callable[[int, int], list[Recorded]], chunk: int = 20_000
) -> Misfit | None:
    """:func:`first_misfit` of a whole log, read `chunk` events at a time with `read(after,
    limit)` (a store's ``read``): a log of millions is not held at once."""
    after = 0
    while chunk_read := read(after, chunk):
        found = first_misfit(chunk_read)
        if found is not None:
            return found
        after = chunk_read[-1].seq
    return None


def misfit(ev: Event) -> tuple[str, Any, str] | None:
    """(field, value, the type it should be) of the first field of `ev` whose value does
    not fit its annotation, else None."""
    for name, hint in _hints(type(ev)):
        value = getattr(ev, name, None)
        if not _fits(value, hint):
            return name, value, _spell(hint)
    return None


_HINTS: dict[str, tuple[tuple[str, Any], ...]] = {}


def _hints(cls: type[Event]) -> tuple[tuple[str, Any], ...]:
    """(name, resolved annotation) of each field of `cls`, worked out once per kind."""
    if cls.__name__ not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls.__name__] = tuple(
            (f.name, hints[f.name]) for f in fields(cls) if f.name in hints
        )
    return _HINTS[cls.__name__]


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float)  # JSON writes 2.0 as 2.0, a hand 2
    if hint in (int, bool):
        return isinstance(value, int)  # a bool is an int: both as Python wrote them
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(item, args[0]) for item in value)
        return len(args) == len(value) and all(map(_fits, value, args))
    if origin in (frozenset, set, list):
        return isinstance(value, tuple | list | set | frozenset) and all(
            _fits(item, args[0]) for item in value
        )
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items()
        )
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a type this check does not know: not the event's fault


def _spell(hint: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if hint in names:
        return names[hint]
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        other = next(a for a in args if a is not type(None))
        return f"{_spell(other)} or null"
    if typing.get_origin(hint) in (tuple, list, frozenset, set):
        return "a list"
    if typing.get_origin(hint) is dict:
        return "an object"
    return str(hint)
