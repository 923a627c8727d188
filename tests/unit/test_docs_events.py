"""docs/events.md names every event kind m27 knows, with the fields it carries."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from m27.events import EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
ROW = re.compile(r"^\| `(\w+)` \| ([^|]*) \|", re.MULTILINE)


def _documented() -> dict[str, str]:
    return {kind: fields for kind, fields in ROW.findall(DOC.read_text())}


def test_every_event_kind_has_a_row_in_docs_events_md_and_no_row_is_stale() -> None:
    rows = _documented()
    missing = sorted(set(EVENT_TYPES) - set(rows))
    assert not missing, f"docs/events.md has no row for {missing}"
    stale = sorted(set(rows) - set(EVENT_TYPES))
    assert not stale, f"docs/events.md documents kinds that do not exist: {stale}"


def test_each_row_lists_the_fields_of_its_kind() -> None:
    for kind, text in _documented().items():
        written = {w.strip() for w in text.split(",")}
        if "run/step" in written:
            written |= {"run_id", "step"}
        elif "run" in written:
            written.add("run_id")
        fields = {f.name for f in dataclasses.fields(EVENT_TYPES[kind])} - {"at"}
        assert fields <= written, f"{kind}: docs/events.md lacks {sorted(fields - written)}"
