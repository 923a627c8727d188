"""Public names a package imports on first use (PEP 562 module ``__getattr__``).

A package whose full import is slow (the spec parser, python-telegram-bot) names, per
module, what it gives that way, and takes its ``__getattr__`` from :func:`module_getattr`:
a caller that needs only the light names never pays for the heavy modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def module_getattr(
    namespace: dict[str, Any], modules: Mapping[str, tuple[str, ...]]
) -> Callable[[str], object]:
    """The ``__getattr__`` of the package whose ``globals()`` is `namespace`: a name of
    `modules` (module -> the names it gives, written as the imports are) is imported then
    and kept in `namespace`, so the next lookup does not come here; any other name is an
    AttributeError as usual."""
    package = namespace["__name__"]
    module_of = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
