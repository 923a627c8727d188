"""Whether a step that saves its own state with `m27.Checkpointer` has saved any.

The runner gives such a step `M27_CHECKPOINT_DIR` and `M27_CHECKPOINT_INTERVAL` (its
`checkpoint: 5m`) and can do nothing more: the program saves when it calls
`ck.maybe_save(...)`. One that never does (the call left out of the loop, a `directory=`
of its own, a program that does not use m27 at all) ran unprotected without a word, and
the crash that found nothing to restore, days in, was how anyone learnt it. The watcher
here looks at the step's checkpoint folder while it runs and says so, once, when two
intervals have passed without a new manifest, as :class:`~m27.checkpoint.files.FileGuard`
does for programs that write checkpoint files themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from m27.checkpoint._format import manifests, parse_name
from m27.clock import Clock
from m27.units import format_duration


def _newest(directory: Path) -> int:
    """The newest save's number in `directory` (0: none, or a folder it cannot read: the
    watcher only ever says something, it never stops a step)."""
    try:
        found = manifests(directory)
    except OSError:
        return 0
    parsed = parse_name(found[-1]) if found else None
    return parsed[0] if parsed else 0


#: A program's Checkpointer counts its interval from its own start, after the imports
#: and the loading of its data: with `checkpoint: 2s` that came after two intervals on a
#: busy machine. The note waits at least this much longer than one interval.
STARTUP_SLACK_S = 30.0


class SaveWatch:
    """Says, once, when the step has saved no checkpoint for two of its intervals (and at
    least :data:`STARTUP_SLACK_S` more than one)."""

    def __init__(
        self, directory: Path, every: float, *, clock: Clock, warn: Callable[[str], None]
    ) -> None:
        self.directory = directory
        self._every = every
        self._clock = clock
        self._warn = warn
        self._before = 0
        self._started: float | None = None
        self._done = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: Callable[[], float] | None = None
        self._held_before = 0.0

    def baseline(self) -> None:
        """The saves already there (an earlier attempt's, a resumed run's) are not this
        attempt's; the interval counts from now, as the program's Checkpointer does."""
        self._before = _newest(self.directory)
        self._started = self._clock.monotonic()

    def saved(self) -> bool:
        """Whether this attempt has made a checkpoint durable (its manifest is in place)."""
        return _newest(self.directory) > self._before

    def overdue(self) -> str | None:
        """The note, once, after two intervals with no save; None before, after a save,
        and after it was said (the watcher has nothing more to look for then)."""
        if self._done or self._started is None:
            return None
        waited = self._clock.monotonic() - self._started
        if self._held is not None:  # a guest held by the agent had no chance to save
            waited -= self._held() - self._held_before
        if waited < max(2 * self._every, self._every + STARTUP_SLACK_S):
            return None
        self._done = True
        if self.saved():
            return None
        every = format_duration(self._every)
        return (
            f"no checkpoint after {format_duration(waited)}: nothing was saved to "
            f"{self.directory} (M27_CHECKPOINT_DIR; m27.Checkpointer saves there at most "
            f"every {every}, M27_CHECKPOINT_INTERVAL, when the program calls "
            "`ck.maybe_save(state, step)`); a crash now loses all of this attempt's work"
        )

    def start(self, poll: float, held: Callable[[], float] | None = None) -> None:
        """Look every `poll` seconds on a thread until it has said its piece or :meth:`stop`;
        `held()`: seconds the step has been held as a guest, which the note leaves out."""
        if self._started is None:
            self.baseline()
        self._held = held
        self._held_before = held() if held is not None else 0.0

        def loop() -> None:
            while not self._done and not self._stop.wait(poll):
                if (line := self.overdue()) is not None:
                    self._warn(line)

        self._thread = threading.Thread(target=loop, name="m27-save-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop looking (the program has exited)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
