"""How long a guest step has been held, from its events.

The agent holds a guest (its gate closed, or SIGSTOP) while its GPU's primary computes:
GuestPaused starts a hold, GuestResumed or Promoted ends it, and so does the step's end.
`m27 run` says the total (`succeeded in 6.0s (held 4.0s as a guest)`), so does the step's
Prefect state, and the runner leaves it out of the step's `timeout:`; each reads it here,
from the events it already follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from m27.events._agent import GuestPaused, GuestResumed, Promoted
from m27.events._base import Event
from m27.events._step import StepCancelled, StepFailed, StepRequeued, StepSucceeded

#: The events that end a hold: the guest computes again, or its attempt is over.
_HOLD_ENDS = (GuestResumed, Promoted, StepSucceeded, StepFailed, StepCancelled, StepRequeued)


@dataclass
class Hold:
    """One step's holds so far: apply its events in order, read :meth:`seconds`."""

    #: seconds of the holds that have ended
    done: float = 0.0
    #: when the hold going on now began (None: not held)
    since: float | None = None

    def apply(self, ev: Event) -> None:
        """Fold one of the step's events in (others leave it as it is)."""
        if isinstance(ev, GuestPaused):
            if self.since is None:  # a pause said again is the same hold
                self.since = ev.at
        elif isinstance(ev, _HOLD_ENDS) and self.since is not None:
            self.done += max(0.0, ev.at - self.since)
            self.since = None

    @property
    def held(self) -> bool:
        return self.since is not None

    def seconds(self, now: float | None = None) -> float:
        """Seconds held: the ended holds, and the one going on up to `now` if given."""
        going = max(0.0, now - self.since) if now is not None and self.since is not None else 0.0
        return self.done + going
