"""Big reads and folds build many objects: Python's cyclic collector is paused meanwhile."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic collector while a big read builds its events (or a big fold
    its state: runs and steps hold no cycles either).

    Decoding a million rows makes a few million new objects; each 700 of them trigger a
    collection, and the older generations are rescanned over the growing list again and
    again: replaying 300k events took 1.5-2.5x longer with it running. Events hold no
    reference cycles, so nothing is left for the collector to find; it runs again after.

    Re-enabled as is, it would still scan every new object once, at the next allocation
    (all of them are in the youngest generation): 2-3 us per event here, as much as the
    decode itself. ``gc.freeze()`` then ``gc.unfreeze()`` moves every tracked object to
    the oldest generation without a scan, where a full collection (rare, and the cost a
    long-lived result pays anyway) sees them. Skipped when the program froze objects
    itself (``gc.get_freeze_count()``): unfreezing would undo that.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()
