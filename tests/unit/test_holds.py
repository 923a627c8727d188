"""A guest's time held, folded from its events: what `m27 run`, the step's Prefect state
and the runner's timeout each read (m27.events.holds)."""

from __future__ import annotations

from m27 import events as ev
from m27.events.holds import Hold


def test_holds_add_up_from_pause_to_resume_promotion_or_the_attempts_end() -> None:
    hold = Hold()
    for e in [
        ev.GuestPaused(10.0, "r", "ana", 0),
        ev.GuestPaused(12.0, "r", "ana", 0, how="signal"),  # escalated: the same hold
        ev.GuestResumed(15.0, "r", "ana", 0),
        ev.CheckpointWritten(16.0, "r", "ana", "/c", 1, 1, 1, 0.1),  # not about holds
        ev.GuestPaused(20.0, "r", "ana", 0),
    ]:
        hold.apply(e)
    assert hold.held and hold.seconds() == 5.0 and hold.seconds(now=21.5) == 6.5
    hold.apply(ev.StepFailed(22.0, "r", "ana", 1, 12.0, "exited with code 1", will_retry=True))
    assert not hold.held and hold.seconds(now=99.0) == 7.0  # the attempt's end ends it
    hold.apply(ev.GuestResumed(23.0, "r", "ana", 0))  # a late word: nothing held to end
    assert hold.seconds() == 7.0
