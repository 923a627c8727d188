"""Public names a package imports on first use (PEP 562 ``__getattr__``).

A package whose full import is slow (the spec parser, python-telegram-bot) lists those
names in a table and answers ``__getattr__`` with :func:`load`, so a caller that needs
only the light names never pays for the heavy modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping


def load(
    package: str, table: Mapping[str, str], namespace: MutableMapping[str, object], name: str
) -> object:
    """`name` from the module `table` names for it, kept in `namespace` (the package's
    ``globals()``) so the next lookup does not come here; AttributeError as usual else."""
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
