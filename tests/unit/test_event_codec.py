"""The fast paths of the event codec: orjson on encode, decode_records on replay.

Both must give back exactly what the plain paths (``json.dumps``, :func:`decode`) give,
for every kind and for the values only the plain path handles.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
from pathlib import Path

import pytest

from m27._exceptions import UnknownEventError
from m27.events import (
    EVENT_TYPES,
    Event,
    GpuLost,
    Recorded,
    RunSubmitted,
    StepStarted,
    StepSucceeded,
    decode,
    decode_records,
    encode,
)
from tests.unit.event_samples import sample_event

ALL = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)


def _same(again: Event, original: Event) -> None:
    assert again == original
    assert type(again) is type(original)
    for f in dataclasses.fields(original):
        assert type(getattr(again, f.name)) is type(getattr(original, f.name)), f.name


def test_every_kind_is_covered() -> None:
    assert len(ALL) == 35  # docs/events.md lists 35 kinds


@pytest.mark.parametrize("cls", ALL)
def test_every_kind_round_trips_through_decode_records(cls: type[Event]) -> None:
    original = sample_event(cls)
    kind, version, payload = encode(original)
    assert json.loads(payload) == json.loads(json.dumps(original.to_payload()))
    [record] = decode_records([(7, kind, version, payload)])
    assert record == Recorded(7, original)
    _same(record.event, original)
    _same(record.event, decode(kind, version, payload))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.event.at = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.seq = 8  # type: ignore[misc]


def test_a_mixed_batch_keeps_order_and_seq() -> None:
    events = [sample_event(cls) for cls in ALL] * 3
    rows = [(i, *encode(ev)) for i, ev in enumerate(events, start=1)]
    records = decode_records(rows)
    assert [r.seq for r in records] == list(range(1, len(events) + 1))
    assert [r.event for r in records] == events


def _started(**changes: object) -> StepStarted:
    base = StepStarted(
        at=1.0, run_id="r", step="s", attempt=1, pid=2, pgid=2, command=("md",), gpus=(0, 1)
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


class _Name(str):
    pass


@pytest.mark.parametrize(
    "ev",
    [
        _started(log_path="/tmp/é ☃ \u2028"),  # non-ASCII: UTF-8 from orjson
        _started(pid_started=float("nan")),  # json.dumps writes NaN; orjson would write null
        _started(pid_started=float("inf")),
        _started(pid=2**70),  # too big for orjson
        _started(log_path="\ud800"),  # a lone surrogate: orjson refuses it
        _started(host=_Name("n1")),  # a subclass: written as json.dumps writes it
        StepSucceeded(at=1e16, run_id="r", step="s", attempt=1, duration_s=-0.0, outputs=()),
        RunSubmitted(at=1.0, run_id="r", pipeline="p", spec_path="", steps=("a",), vars={"k": "v"}),
    ],
    ids=["utf8", "nan", "inf", "bigint", "surrogate", "str-subclass", "floats", "dict"],
)
def test_values_only_json_writes_come_back_the_same(ev: Event) -> None:
    kind, version, payload = encode(ev)
    [record] = decode_records([(1, kind, version, payload)])
    for again in (record.event, decode(kind, version, payload)):
        for f in dataclasses.fields(ev):
            want, got = getattr(ev, f.name), getattr(again, f.name)
            if isinstance(want, float) and math.isnan(want):
                assert isinstance(got, float) and math.isnan(got)
            else:
                assert got == want
                # a subclass comes back as its plain base, as it always did through json
                assert type(got) is (str if isinstance(want, str) else type(want))


def test_a_live_object_is_still_refused() -> None:
    live: dict[str, str] = {"x": object()}  # type: ignore[dict-item]
    bad = RunSubmitted(at=1.0, run_id="r", pipeline="p", spec_path="", steps=(), vars=live)
    with pytest.raises(TypeError):
        encode(bad)


def test_decode_records_takes_the_checked_path_for_other_rows() -> None:
    old = '{"at":3.0,"run_id":"r1","step":"md","attempt":1,"pid":41,"pgid":41,"command":["md"]}'
    [record] = decode_records([(1, "StepStarted", 1, old)])
    assert record.event == decode("StepStarted", 1, old)  # older payload: defaults filled
    with pytest.raises(UnknownEventError, match="GpuMelted"):
        decode_records([(1, "GpuMelted", 1, "{}")])
    with pytest.raises(UnknownEventError, match="version 2"):
        decode_records([(1, "GpuLost", GpuLost.version + 1, '{"at":1.0,"gpu":0}')])
    with pytest.raises(UnknownEventError, match="RunSubmitted"):
        decode_records([(1, "RunSubmitted", 1, '{"at":1.0,"run_id":"r"}')])
    extra = '{"at":1.0,"gpu":0,"colour":"red"}'  # a field this m27 does not know: dropped
    [record] = decode_records([(1, "GpuLost", 1, extra)])
    assert record.event == decode("GpuLost", 1, extra) == GpuLost(at=1.0, gpu=0)


def test_a_big_read_decodes_every_row_and_leaves_the_collector_as_found(tmp_path: Path) -> None:
    from m27.store.sqlite import _MANY_ROWS, SqliteEventStore

    events = [GpuLost(at=float(i), gpu=i % 8) for i in range(_MANY_ROWS + 5)]
    frozen = gc.get_freeze_count()
    with SqliteEventStore(tmp_path / "events.db") as store:
        for first in range(0, len(events), 1000):
            store.append(events[first : first + 1000])
        records = store.read()
    assert [r.event for r in records] == events
    assert [r.seq for r in records] == list(range(1, len(events) + 1))
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_after_prepare_codecs_no_kind_resolves_type_hints_again(tmp_path: Path) -> None:
    """The warm runner prepares every codec before it forks; a forked run that still
    resolved an event class's type hints would pay ~1.5 ms per kind itself."""
    code = (
        "import typing\n"
        "from m27.events import EVENT_TYPES, decode, encode, prepare_codecs\n"
        "from tests.unit.event_samples import sample_event\n"
        "samples = [sample_event(cls) for cls in EVENT_TYPES.values()]\n"
        "prepare_codecs()\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError('type hints resolved after prepare_codecs')\n"
        "typing.get_type_hints = refuse\n"
        "for ev in samples:\n"
        "    assert decode(*encode(ev)) == ev\n"
        "print(len(EVENT_TYPES))\n"
    )
    root = Path(__file__).resolve().parents[2]
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(EVENT_TYPES)
