"""What the agent does while the event log cannot be written (a full disk, an I/O error).

The agent records what it did (grants, pauses, promotions) in the log after it did it,
and its book learns only from the log. So a batch it could not append is kept, in order,
and appended before anything else once the log takes writes again; meanwhile the agent
decides nothing new (a second decision from the same unchanged book would grant the same
lease twice). Steps that already run go on; steps that ask for a GPU wait. Before, the
first failed append ended the agent's thread, and the node service stopped with it.

Said on the service log when it starts, once a minute while it lasts, and when it ends.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from m27._exceptions import StoreError
from m27.clock import Clock, SystemClock
from m27.events import Event

__all__ = ["Outage", "Repeats"]

log = logging.getLogger(__name__)


class Outage:
    """The batches the agent could not append, and when the log failed."""

    #: seconds between two tries to append the kept batch
    RETRY_S = 1.0
    #: seconds between two "still failing" lines on the service log
    SAY_EVERY_S = 60.0

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.unsaved: list[Event] = []
        self.since: float | None = None  # monotonic time of the first failure
        self._said = 0.0

    def keep(self, batch: Sequence[Event]) -> None:
        """`batch` could not be appended: it goes first when the log works again."""
        self.unsaved.extend(batch)

    def failed(self, exc: StoreError) -> None:
        now = self.clock.monotonic()
        if self.since is None:
            self.since, self._said = now, now
            log.warning(
                "m27 agent: %s; the agent decides nothing new until the log can be written "
                "(running steps go on; %d event(s) kept)",
                exc,
                len(self.unsaved),
            )
        elif now - self._said >= self.SAY_EVERY_S:
            self._said = now
            log.warning(
                "m27 agent: the event log still fails after %.0fs: %s", now - self.since, exc
            )

    def recovered(self, appended: int) -> None:
        if self.since is not None:
            log.warning(
                "m27 agent: the event log takes writes again after %.1fs; %d kept event(s) "
                "appended",
                self.clock.monotonic() - self.since,
                appended,
            )
        self.since = None


class Repeats:
    """Says a line, then the same line again at most once per `every` seconds, with how
    often it came meanwhile: a failure that recurs at every pass (a full disk, twice a
    second) is one line a minute on the service log, not thousands."""

    def __init__(
        self, say: Callable[[str], None], every: float = 60.0, clock: Clock | None = None
    ) -> None:
        self.say = say
        self.every = every
        self.clock = clock or SystemClock()
        self._last: str | None = None
        self._at = -math.inf
        self._held = 0

    def __call__(self, line: str) -> None:
        now = self.clock.monotonic()
        if line == self._last and now - self._at < self.every:
            self._held += 1
            return
        if self._held:  # the count of the line held back, said before what comes next
            again = f"again {self._held} time(s) in the last {now - self._at:.0f}s"
            self.say(f"{self._last} ({again})")
        if line != self._last or not self._held:
            self.say(line)
        self._last, self._at, self._held = line, now, 0
