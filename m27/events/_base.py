"""The base of every event, the registry of kinds, and their encoding and decoding.

The event classes live in the sibling modules (one per concept) and are all re-exported by
:mod:`m27.events`; importing that package registers every kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from m27._exceptions import UnknownEventError

#: kind name -> event class; filled by the @event decorator.
EVENT_TYPES: dict[str, type[Event]] = {}


@dataclass(frozen=True)
class Event:
    """Base of every event; ``kind`` is the class name and ``version`` its schema version."""

    version: ClassVar[int] = 1

    at: float

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_payload(self) -> dict[str, Any]:
        """The event's fields as JSON-able values (tuples are written as lists by json).

        Shallow on purpose: events hold only plain values (numbers, strings, tuples, flat
        dicts), and ``dataclasses.asdict``'s deep copy was most of the cost of an append
        (~14 us of ~22 us per event on a loaded 2-core VM).
        """
        values = self.__dict__
        return {name: values[name] for name in _spec(type(self)).names}


@dataclass(frozen=True)
class RunEvent(Event):
    """Base of the events about one run: they all name it first (after ``at``)."""

    run_id: str


@dataclass(frozen=True)
class StepEvent(RunEvent):
    """Base of the events about one step of a run (``run_id``, then ``step``).

    Field order is the serialized order and the positional order: ``at, run_id, step``
    then the event's own fields, as before the bases existed, so stored payloads and
    ``StepFailed(now, run_id, step, ...)`` calls are unchanged.
    """

    step: str


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event as stored: its gapless sequence number in the node's log, and the event.

    Slotted: a replay makes one per event, and a slotted one is smaller and set up in a
    third of the time (:func:`m27.events.decode_records` sets its two slots directly).
    """

    seq: int
    event: Event


_E = typing.TypeVar("_E", bound=type[Event])


def event(cls: _E) -> _E:
    """Register an event class under its name so it can be decoded from the log."""
    if cls.__name__ in EVENT_TYPES:
        raise TypeError(f"event kind {cls.__name__} registered twice")
    EVENT_TYPES[cls.__name__] = cls
    return cls


def encode(ev: Event) -> tuple[str, int, str]:
    """(kind, version, JSON payload) for storage.

    Written by orjson (~10x faster than ``json.dumps`` per payload, most of an append's
    cost) when every value is a plain one that both libraries write alike: an exact str,
    int, bool, None, finite float, or a tuple, list or dict of those. Anything else (NaN,
    a subclass, a live object, an int orjson cannot hold) takes ``json.dumps`` as before,
    so it is written, or refused with a TypeError, exactly as it always was. The texts of
    the two differ only in spelling (orjson writes UTF-8 where json writes ``\\u`` escapes);
    both decode to the same values.
    """
    cls = type(ev)
    values = ev.__dict__
    if len(values) == len(_spec(cls).names) and _plain(values.values()):
        with contextlib.suppress(TypeError):  # orjson.JSONEncodeError: e.g. a surrogate
            return cls.__name__, cls.version, orjson.dumps(values).decode()
    return cls.__name__, cls.version, json.dumps(ev.to_payload(), separators=(",", ":"))


_PLAIN_TYPES = frozenset({str, int, bool, type(None)})


def _plain(values: Iterable[Any]) -> bool:
    """Whether orjson writes `values` exactly as ``json.dumps`` would (see :func:`encode`)."""
    for value in values:
        cls = type(value)
        if cls in _PLAIN_TYPES:
            continue
        if cls is float:
            if value - value != 0.0:  # NaN or an infinity: orjson would write null
                return False
        elif cls is tuple or cls is list:
            if not _plain(value):
                return False
        elif cls is dict:
            if not _plain(value.values()) or any(type(k) is not str for k in value):
                return False
        else:
            return False
    return True


def decode(kind: str, version: int, payload: str | bytes | dict[str, Any]) -> Event:
    """Rebuild an event from storage; unknown kinds and newer versions fail loudly."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise UnknownEventError(f"unknown event kind {kind!r} in the log", kind=kind)
    if version > cls.version:
        raise UnknownEventError(
            f"event {kind} has schema version {version}, this m27 knows up to {cls.version}",
            kind=kind,
            version=version,
        )
    spec = _spec(cls)
    if isinstance(payload, str | bytes):
        try:
            data = _loads(payload, spec.ints)
        except ValueError as exc:
            raise UnknownEventError(
                f"event {kind} payload is not valid JSON: {exc}", kind=kind, version=version
            ) from exc
    else:
        data = payload
    if not isinstance(data, dict):
        raise UnknownEventError(
            f"event {kind} payload is a JSON {type(data).__name__}, not an object of its"
            " fields (a positional row is read through its log's layouts)",
            kind=kind,
            version=version,
        )
    data = dict(data)
    for name in spec.tuples:
        value = data.get(name)
        if isinstance(value, list):
            # Tuple fields hold plain values or (homogeneous) tuples of them.
            data[name] = (
                tuple(map(tuple, value)) if value and isinstance(value[0], list) else (tuple(value))
            )
    keys = data.keys()
    if spec.fast and keys == spec.known:
        # The common case (the payload names every field, as encode writes it), without
        # the dataclass __init__ and its object.__setattr__ per field: about half of the
        # cost of a decode, and a replay of the log is mostly decodes.
        ev = object.__new__(cls)
        ev.__dict__.update(data)
        return ev
    if spec.fast and spec.required <= keys and keys <= spec.known:
        ev = object.__new__(cls)  # an older payload: fields added since take defaults
        ev.__dict__.update(spec.defaults)
        for name, factory in spec.factories:
            ev.__dict__[name] = factory()
        ev.__dict__.update(data)
        return ev
    kwargs: dict[str, Any] = {}
    for name, is_tuple in _fields(cls):
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, list) and is_tuple:
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UnknownEventError(f"event {kind} payload does not fit: {exc}", kind=kind) from exc


#: The slot descriptors of Recorded: setting through them skips the frozen __setattr__.
_RECORDED_SEQ: Any = Recorded.__dict__["seq"]
_RECORDED_EVENT: Any = Recorded.__dict__["event"]


class _Plan(typing.NamedTuple):
    """What :func:`m27.events.decode_records` needs of one kind whose named payloads may
    skip ``__init__`` (a tuple: unpacked at once in the loop)."""

    cls: type[Event]
    version: int
    known: frozenset[str]
    ints: tuple[str, ...]
    tuples: tuple[str, ...]


_PLANS: dict[str, _Plan | None] = {}


def _plan(kind: str) -> _Plan | None:
    """The plan of `kind`, made once (None: unknown kind or a class that validates)."""
    if kind in _PLANS:
        return _PLANS[kind]
    cls = EVENT_TYPES.get(kind)
    found = None
    if cls is not None:
        spec = _spec(cls)
        if spec.fast:
            found = _Plan(cls, cls.version, spec.known, spec.ints, spec.tuples)
    if cls is not None:  # unknown kinds are not remembered: one may be registered later
        _PLANS[kind] = found
    return found


def _loads(payload: str | bytes, ints: tuple[str, ...] = ()) -> Any:
    """json.loads, through orjson (~2x faster per payload) where it parses the text.

    ``json.dumps`` writes NaN and Infinity, and Python ints of any size. orjson refuses
    NaN and Infinity, and the standard parser then reads the payload as it always did; an
    int beyond 64 bits it silently reads as a float, so a float in one of the event's
    `ints` fields sends the payload to the standard parser too.
    """
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)
    if data.__class__ is not dict:
        return data  # not an event's payload: decode says so
    for name in ints:
        if data.get(name).__class__ is float:
            return json.loads(payload)
    return data


_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {}


def _fields(cls: type[Event]) -> tuple[tuple[str, bool], ...]:
    """(field name, is a tuple) per field; resolving type hints is slow, so once per class."""
    found = _FIELDS.get(cls.__name__)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = tuple((f.name, _is_tuple(hints.get(f.name))) for f in dataclasses.fields(cls))
        _FIELDS[cls.__name__] = found
    return found


@dataclass(frozen=True)
class _Spec:
    """How to build one event class fast from a decoded payload (computed once per class)."""

    names: tuple[str, ...]
    known: frozenset[str]
    required: frozenset[str]
    tuples: tuple[str, ...]
    #: fields typed ``int`` (or ``int | None``): a float there means orjson read a big int
    ints: tuple[str, ...]
    defaults: dict[str, Any]
    factories: tuple[tuple[str, Any], ...]
    #: False for a class that validates in ``__post_init__``: it always takes ``__init__``
    fast: bool


_SPECS: dict[type[Event], _Spec] = {}


def _spec(cls: type[Event]) -> _Spec:
    found = _SPECS.get(cls)
    if found is None:
        fields = dataclasses.fields(cls)
        plain = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        factories = tuple(
            (f.name, f.default_factory)
            for f in fields
            if f.default_factory is not dataclasses.MISSING
        )
        needed = {f.name for f in fields} - set(plain) - {n for n, _ in factories}
        found = _Spec(
            names=tuple(f.name for f in fields),
            known=frozenset(f.name for f in fields),
            required=frozenset(needed),
            tuples=tuple(name for name, is_tuple in _fields(cls) if is_tuple),
            ints=_int_fields(cls),
            defaults=plain,
            factories=factories,
            fast=not hasattr(cls, "__post_init__"),
        )
        _SPECS[cls] = found
    return found


def prepare_codecs() -> None:
    """Work out every event class's codec plan now rather than at its first encode or
    decode (resolving type hints costs ~1.5 ms a class): a process that forks many short
    ones, the warm runner, does it once for all of them."""
    for cls in EVENT_TYPES.values():
        _spec(cls)
        _fields(cls)


def _int_fields(cls: type[Event]) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if hints.get(f.name) is int
        or (not _is_tuple(hints.get(f.name)) and int in typing.get_args(hints.get(f.name)))
    )


def _is_tuple(hint: Any) -> bool:
    if hint is None:
        return False
    if typing.get_origin(hint) is tuple:
        return True
    return any(typing.get_origin(a) is tuple for a in typing.get_args(hint))
