"""The base of every event, the registry of kinds, and their encoding and decoding.

The event classes live in the sibling modules (one per concept) and are all re-exported by
:mod:`m27.events`; importing that package registers every kind.
"""

from __future__ import annotations

import dataclasses
import json
import typing
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


@dataclass(frozen=True)
class Recorded:
    """An event as stored: its gapless sequence number in the node's log, and the event."""

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
    """(kind, version, JSON payload) for storage."""
    return ev.kind, type(ev).version, json.dumps(ev.to_payload(), separators=(",", ":"))


def decode(kind: str, version: int, payload: str | dict[str, Any]) -> Event:
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
    data = _loads(payload) if isinstance(payload, str) else dict(payload)
    spec = _spec(cls)
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


def _loads(payload: str) -> Any:
    """json.loads, through orjson (~2x faster per payload) where it parses the text.

    ``json.dumps`` writes NaN and Infinity, and Python ints of any size; orjson refuses
    those, and the standard parser then reads the payload as it always did.
    """
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


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
            defaults=plain,
            factories=factories,
            fast=not hasattr(cls, "__post_init__"),
        )
        _SPECS[cls] = found
    return found


def _is_tuple(hint: Any) -> bool:
    if hint is None:
        return False
    if typing.get_origin(hint) is tuple:
        return True
    return any(typing.get_origin(a) is tuple for a in typing.get_args(hint))
