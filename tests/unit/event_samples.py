"""One instance of any event type, every field set to a non-default value (for round trips
and "every kind is handled" checks)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from m27.events import Event


def _sample_value(hint: Any, name: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        return _sample_value(next(a for a in args if a is not type(None)), name)
    if origin is tuple:
        return ("a", "b") if args[0] is str else (0, 3)
    if origin is dict:
        return {"K": "v"}
    return {str: f"{name}-x", int: 7, float: 1.5, bool: True}[hint]


def sample_event(cls: type[Event]) -> Event:
    """An instance of `cls` with every field set to a non-default value."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _sample_value(hints[f.name], f.name) for f in dataclasses.fields(cls)}
    return cls(**kwargs)
