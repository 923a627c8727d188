"""How each step of a run ended, and which waiting steps that makes ready or doomed.

The flow's walk decides, pass after pass, which waiting step to submit (all its
dependencies succeeded) and which to skip (one of them did not). Asking every waiting step
about every dependency on each pass cost time cubic in a dense pipeline: 1,000 steps,
each after every step before it, spent 35 s of the flow's thread on it, and delayed each
step's start by up to 70 ms. Here each outcome updates the steps that wait on it once, so
a pass asks each waiting step two questions of constant cost.
"""

from __future__ import annotations

from collections.abc import Iterable

#: outcomes after which a step's dependents cannot run
NOT_DONE = ("failed", "skipped", "cancelled")


class Outcomes:
    """`outcome` maps each step that ended to succeeded, failed, skipped or cancelled."""

    def __init__(self, steps: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        self.outcome: dict[str, str] = {}
        self._deps: dict[str, tuple[str, ...]] = {}
        self._dependents: dict[str, list[str]] = {}
        self._waiting: dict[str, int] = {}  # dependencies not yet succeeded
        self._doomed: set[str] = set()  # steps with a dependency that did not succeed
        for name, deps in steps:
            unique = tuple(dict.fromkeys(deps))
            self._deps[name] = unique
            self._waiting[name] = len(unique)
            for dep in unique:
                self._dependents.setdefault(dep, []).append(name)

    def settle(self, name: str, result: str) -> None:
        """Record how `name` ended; its dependents learn it now."""
        self.outcome[name] = result
        for waiting in self._dependents.get(name, ()):
            if result == "succeeded":
                self._waiting[waiting] -= 1
            elif result in NOT_DONE:
                self._doomed.add(waiting)

    def ready(self, name: str) -> bool:
        """Whether every dependency of `name` succeeded."""
        return self._waiting[name] == 0 and name not in self._doomed

    def first_failed(self, name: str) -> str | None:
        """The first dependency of `name`, in the order it lists them, that did not
        succeed; None while none has ended so."""
        if name not in self._doomed:
            return None
        return next(d for d in self._deps[name] if self.outcome.get(d) in NOT_DONE)
