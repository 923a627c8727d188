"""The stored rows of the event log: named (a JSON object) and positional (a JSON array).

A payload is one of two formats, told apart by its JSON type:

- *named*: ``{"at": ..., "run_id": ..., ...}``, what :func:`m27.events.encode` writes and
  every older log holds; read through the checked :func:`m27.events.decode` rules.
- *positional*: ``[at, run_id, ...]``, the values in the field order of a *layout*: the
  field names that the log itself records for the row's (kind, version) (the sqlite
  store's ``layouts`` table, see docs/events.md). Written by m27 only, through orjson, and
  only for events whose values are all plain (so no NaN, no int beyond 64 bits, no
  subclass: those stay named), and only where the log's layout is the class's own field
  order. The field names are not repeated in every row, so the payload is about half as
  long and parsing it makes no dict; the event is then built by the kind's builder,
  straight-line code compiled once per class (:func:`_builder`).

Why a layout recorded in the log rather than the class's field order: a later m27 that
reorders or adds fields (a new base class, a field in the middle) must still read the rows
written before, and must not take them for its own order. A row whose layout is not the
class's order is rebuilt by name (zipped with the recorded layout) and checked by
:func:`~m27.events.decode`, like any named payload.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from m27._exceptions import UnknownEventError
from m27.events._base import (
    _PLANS,
    _RECORDED_EVENT,
    _RECORDED_SEQ,
    EVENT_TYPES,
    Event,
    Recorded,
    _plain,
    _plan,
    _spec,
    decode,
)

#: (kind, version) -> the field names of its positional rows, in order.
LayoutMap = Mapping[tuple[str, int], Sequence[str]]


class Layouts:
    """The layouts one log holds, and what follows from them for reading and writing.

    ``writes`` holds the classes whose recorded layout at their current version is their
    field order: those are written positionally. ``fast[kind]`` is the builder of such a
    kind, made at its first positional row: a plain one (:func:`_warming`) that puts the
    compiled one (:func:`_builder`) in its place after a few hundred rows; or one that
    always declines, for a kind that may not skip ``__init__`` (a class that validates
    in ``__post_init__``) or whose recorded layout is not its field order. Made once per
    store (opening it reads the table), not per read; nothing here resolves type hints
    or compiles until a row needs it, so opening a store stays cheap for a short-lived
    command.
    """

    def __init__(self, recorded: LayoutMap) -> None:
        self.fields: dict[tuple[str, int], tuple[str, ...]] = {
            key: tuple(names) for key, names in recorded.items()
        }
        self.writes: frozenset[type[Event]] = frozenset(
            cls
            for kind, cls in EVENT_TYPES.items()
            if self.fields.get((kind, cls.version)) == _names(cls)
        )
        self.fast: dict[str, _Build] = {}

    def builder(self, kind: str) -> _Build:
        """``fast[kind]``, made on first use (see the class)."""
        found = self.fast.get(kind)
        if found is None:
            cls = EVENT_TYPES.get(kind)
            if cls is None:
                return _decline  # not remembered: the kind may be registered later
            found = _decline
            if cls in self.writes and _spec(cls).fast:
                found = _BUILDERS.get(cls) or _warming(cls, self.fast)
            self.fast[kind] = found
        return found

    def __repr__(self) -> str:
        return f"Layouts({len(self.fields)} layouts, {len(self.writes)} written positionally)"


#: Rows of one kind built by the plain builder before its compiled one is made.
_COMPILE_AFTER = 200


def _warming(cls: type[Event], fast: dict[str, _Build]) -> _Build:
    """A builder of `cls` without compiling (a loop, ``__dict__.update(zip(...))``: ~0.4 us
    more per event) that puts the compiled one in `fast` after :data:`_COMPILE_AFTER`
    rows. Compiling costs ~0.2 ms per kind: a command that reads a short log (``m27
    status``: a few rows of a dozen kinds) should not pay it, a replay soon does."""
    spec = _spec(cls)
    names, size, version_now = spec.names, len(spec.names), cls.version
    ints = tuple(names.index(n) for n in spec.ints)
    tuples = tuple(names.index(n) for n in spec.tuples)
    new, set_seq, set_event = object.__new__, _RECORDED_SEQ.__set__, _RECORDED_EVENT.__set__
    uses = 0

    def build(seq: int, version: int, d: list[Any]) -> Recorded | None:
        nonlocal uses
        uses += 1
        if uses == _COMPILE_AFTER:
            fast[cls.__name__] = _builder(cls)
        if version != version_now or len(d) != size:
            return None
        for i in ints:
            if d[i].__class__ is float:
                return None
        for i in tuples:
            v = d[i]
            if v.__class__ is list:
                d[i] = tuple(map(tuple, v)) if v and v[0].__class__ is list else tuple(v)
        ev = new(cls)
        ev.__dict__.update(zip(names, d, strict=True))
        record = new(Recorded)
        set_seq(record, seq)
        set_event(record, ev)
        return record

    return build


def _decline(seq: int, version: int, values: list[Any]) -> None:
    """The builder of a kind whose positional rows all take the checked path."""
    return None


_NAMES: dict[type[Event], tuple[str, ...]] = {}


def _names(cls: type[Event]) -> tuple[str, ...]:
    """The field names of `cls` in order (without resolving type hints, unlike _spec)."""
    found = _NAMES.get(cls)
    if found is None:
        found = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return found


#: (seq, version, values) -> the row's Recorded, or None when the row must take the
#: checked path (another version, another number of values, a float in an int field).
_Build = Callable[[int, int, list[Any]], Recorded | None]
_BUILDERS: dict[type[Event], _Build] = {}


def _builder(cls: type[Event]) -> _Build:
    """The positional builder of `cls`, compiled once per class (as dataclasses compiles
    ``__init__``): straight-line code, one statement per field, no loop and no call.

    Why generated: the instance dict is filled by item assignment in field order, the
    order ``__init__`` uses, so it stays a compact key-sharing dict (104-168 bytes here,
    not ~460) and is freed faster; zipping names and values into ``__dict__.update`` cost
    ~0.4 us more per event, a loop over the tuple and int fields more again (1M replay,
    CPU, measured on this VM). Field names are the dataclass's identifiers: the source
    holds them as ``repr`` literals only.
    """
    found = _BUILDERS.get(cls)
    if found is not None:
        return found
    spec = _spec(cls)
    names = spec.names
    lines = [
        "def build(seq, version, d):",
        f"    if version != {int(cls.version)} or len(d) != {len(names)}:",
        "        return None",
    ]
    for name in spec.ints:  # orjson reads an int beyond 64 bits as a float: see _base._loads
        lines += [f"    if d[{names.index(name)}].__class__ is float:", "        return None"]
    lines += ["    ev = new(cls)", "    dd = ev.__dict__"]
    for i, name in enumerate(names):
        if name in spec.tuples:
            lines += [
                f"    v = d[{i}]",
                "    if v.__class__ is list:",
                "        v = tuple(map(tuple, v)) if v and v[0].__class__ is list else tuple(v)",
                f"    dd[{name!r}] = v",
            ]
        else:
            lines.append(f"    dd[{name!r}] = d[{i}]")
    lines += [
        "    record = new(Recorded)",
        "    set_seq(record, seq)",
        "    set_event(record, ev)",
        "    return record",
    ]
    namespace: dict[str, Any] = {
        "new": object.__new__,
        "cls": cls,
        "Recorded": Recorded,
        "set_seq": _RECORDED_SEQ.__set__,
        "set_event": _RECORDED_EVENT.__set__,
    }
    source = "\n".join(lines)
    exec(compile(source, f"<m27 positional builder of {cls.__name__}>", "exec"), namespace)
    found = typing.cast(_Build, namespace["build"])
    _BUILDERS[cls] = found
    return found


def current_layouts() -> dict[tuple[str, int], tuple[str, ...]]:
    """(kind, version) -> field names of every registered kind: what a log records."""
    return {(kind, cls.version): _names(cls) for kind, cls in EVENT_TYPES.items()}


def encode_positional(ev: Event) -> tuple[str, int, str] | None:
    """(kind, version, JSON array of the values in field order), or None where the event
    must be written named (a value that is not plain, or that orjson refuses)."""
    cls = type(ev)
    values = ev.__dict__
    spec = _spec(cls)
    if len(values) == len(spec.names) and _plain(values.values()):
        try:
            return cls.__name__, cls.version, orjson.dumps(_getter(cls)(values)).decode()
        except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a surrogate
            return None
    return None


_GETTERS: dict[type[Event], Callable[[dict[str, Any]], Any]] = {}


def _getter(cls: type[Event]) -> Callable[[dict[str, Any]], Any]:
    """The values of an event's ``__dict__`` in field order, as a tuple (one C call)."""
    found = _GETTERS.get(cls)
    if found is None:
        names = _spec(cls).names
        get = operator.itemgetter(*names)
        found = get if len(names) > 1 else (lambda values: (get(values),))
        _GETTERS[cls] = found
    return found


def decode_records(
    rows: Iterable[tuple[int, str, int, str]], layouts: Layouts | None = None
) -> list[Recorded]:
    """``Recorded(seq, event)`` for each stored row, named or positional (`layouts`: the
    log's, needed for positional rows).

    For rows m27 wrote itself (a replay reads a million of them) the plan of each kind is
    looked up once per row in one dict, and the event and its ``Recorded`` are built
    without any ``__init__``:

    - a positional row of a kind written positionally, at its current version, with one
      value per field, by the kind's builder (:meth:`Layouts.builder`); an ``int`` field
      holding a float (orjson reads an int beyond 64 bits so: m27 never writes one
      positionally) sends it through the checked path;
    - a named payload that names exactly the fields of its kind, as before.

    Every other row (an unknown kind, a newer version, an older layout or payload, a
    class that validates in ``__post_init__``, a garbled row) goes through :func:`decode`
    and fails with an :class:`~m27.UnknownEventError`, or is filled with defaults.
    """
    out: list[Recorded] = []
    append = out.append
    plans = _PLANS
    fast: dict[str, _Build] = layouts.fast if layouts is not None else {}
    new = object.__new__
    set_seq, set_event = _RECORDED_SEQ.__set__, _RECORDED_EVENT.__set__
    loads, bad_json = orjson.loads, orjson.JSONDecodeError
    for seq, kind, version, payload in rows:
        ev: Event
        try:
            data = loads(payload)
        except bad_json:
            data = None  # NaN, Infinity (json.dumps writes them), or not JSON at all
        if data.__class__ is list:
            build = fast.get(kind)
            if build is None and layouts is not None:
                build = layouts.builder(kind)
            if build is not None:
                record = build(seq, version, data)
                if record is not None:
                    append(record)
                    continue
            ev = _positional(kind, version, payload, layouts)
        elif data.__class__ is dict:
            plan = plans.get(kind) or _plan(kind)
            if plan is None or version > plan[1]:
                ev = decode(kind, version, data)
            else:
                cls, _, known, named_ints, named_tuples = plan
                for name in named_ints:
                    if data.get(name).__class__ is float:  # see _base._loads
                        data = json.loads(payload)
                        break
                for name in named_tuples:
                    value = data.get(name)
                    if value.__class__ is list:
                        data[name] = (
                            tuple(map(tuple, value))
                            if value and value[0].__class__ is list
                            else tuple(value)
                        )
                if data.keys() == known:
                    ev = new(cls)
                    # update, not an assignment of ``__dict__``: measured 0.7-0.9 us per
                    # event faster in a 1M replay (the instance keeps its own compact dict)
                    ev.__dict__.update(data)
                else:
                    ev = decode(kind, version, data)
        else:
            ev = _checked(kind, version, payload, layouts)
        record = new(Recorded)
        set_seq(record, seq)
        set_event(record, ev)
        append(record)
    return out


def decode_group(
    first: int, kinds: str, payloads: str, count: int, layouts: Layouts
) -> list[Recorded] | None:
    """The records of seqs ``first + 1 ... first + count`` from one span's rows joined by
    the store: `kinds` their kinds separated by spaces, `payloads` their payloads as one
    JSON array (``[p1,p2,...]``), all at version 1; None unless every row is a positional
    one its kind's builder builds (the caller then reads the span row by row).

    Why joined: a row then costs sqlite3 no tuple and no payload string, and orjson one
    call per span instead of one per row: ~0.3 us per event less in a 300k replay on this
    VM. A row that is not one value of its own (garbled text) makes the array invalid,
    or its length or an element's shape wrong, and so sends the span to the checked path.
    """
    if not payloads.startswith("[["):
        return None  # a named first row (an older log's): not parsed twice
    try:
        values = orjson.loads(payloads)
    except orjson.JSONDecodeError:
        return None
    names = kinds.split(" ")
    if len(values) != count or len(names) != count:
        return None
    out: list[Recorded] = []
    append = out.append
    fast = layouts.fast
    seq = first
    for kind, data in zip(names, values, strict=True):
        seq += 1
        try:
            build = fast[kind]
        except KeyError:
            build = layouts.builder(kind)
        if data.__class__ is not list:
            return None
        record = build(seq, 1, data)
        if record is None:
            return None
        append(record)
    return out


def decode_row(kind: str, version: int, payload: str, layouts: Layouts | None = None) -> Event:
    """One stored row, named or positional, through the checked path (errors name what
    is wrong with the row)."""
    return _checked(kind, version, payload, layouts)


def _checked(kind: str, version: int, payload: str, layouts: Layouts | None) -> Event:
    text = payload.lstrip() if isinstance(payload, str) else payload
    if isinstance(text, str) and text.startswith("["):
        return _positional(kind, version, payload, layouts)
    return decode(kind, version, payload)


def _positional(kind: str, version: int, payload: str, layouts: Layouts | None) -> Event:
    """A positional row through the checked path: the values named by the log's layout
    (with the standard parser, which reads big ints exactly and NaN), then :func:`decode`."""
    cls = EVENT_TYPES.get(kind)
    if cls is None or version > cls.version:
        return decode(kind, version, payload)  # the unknown kind or version is the error
    try:
        values = json.loads(payload)
    except ValueError as exc:
        raise UnknownEventError(
            f"event {kind} payload is not valid JSON: {exc}", kind=kind, version=version
        ) from exc
    fields = layouts.fields.get((kind, version)) if layouts is not None else None
    if fields is None:
        raise UnknownEventError(
            f"event {kind} version {version} is stored positionally, but the log records"
            " no layout (field order) for it",
            kind=kind,
            version=version,
        )
    if not isinstance(values, list) or len(values) != len(fields):
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise UnknownEventError(
            f"event {kind} positional payload has {got} values, its layout has"
            f" {len(fields)} fields ({', '.join(fields)})",
            kind=kind,
            version=version,
        )
    return decode(kind, version, dict(zip(fields, values, strict=True)))
