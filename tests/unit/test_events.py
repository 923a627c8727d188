"""Event encoding: every type survives a round trip; unknown kinds and versions fail loudly."""

from __future__ import annotations

import dataclasses
import json

import pytest

from m27._exceptions import UnknownEventError
from m27.events import (
    EVENT_TYPES,
    Event,
    GpuLost,
    RunSubmitted,
    StepFailed,
    StepStarted,
    decode,
    encode,
)
from tests.unit.event_samples import sample_event

ALL = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", ALL)
def test_every_event_type_round_trips_through_json(cls: type[Event]) -> None:
    original = sample_event(cls)
    kind, version, payload = encode(original)
    assert (kind, version) == (cls.__name__, cls.version)
    json.loads(payload)  # plain JSON, readable by any tool
    again = decode(kind, version, payload)
    assert again == original
    for f in dataclasses.fields(cls):
        assert type(getattr(again, f.name)) is type(getattr(original, f.name))


@pytest.mark.parametrize("cls", ALL)
def test_events_are_frozen_and_past_tense(cls: type[Event]) -> None:
    instance = sample_event(cls)
    with pytest.raises(dataclasses.FrozenInstanceError):
        instance.at = 0.0  # type: ignore[misc]
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert cls.__name__.endswith(("ed", "Lost", "Measured", "Written", "Restored"))


def test_tuples_come_back_as_tuples() -> None:
    started = StepStarted(
        at=1.0,
        run_id="r",
        step="s",
        attempt=1,
        pid=2,
        pgid=2,
        command=("gmx", "mdrun"),
        gpus=(0, 1),
    )
    again = decode(*encode(started))
    assert isinstance(again, StepStarted)
    assert again.command == ("gmx", "mdrun") and again.gpus == (0, 1)


def test_decode_accepts_a_parsed_payload_and_fills_defaults() -> None:
    assert decode("GpuLost", 1, {"at": 2.0, "gpu": 1}) == GpuLost(at=2.0, gpu=1)


def test_unknown_kind_fails_loudly() -> None:
    with pytest.raises(UnknownEventError, match="GpuMelted") as info:
        decode("GpuMelted", 1, "{}")
    assert info.value.context["kind"] == "GpuMelted"


def test_newer_version_fails_loudly() -> None:
    _, _, payload = encode(GpuLost(at=1.0, gpu=0))
    with pytest.raises(UnknownEventError, match="version 2"):
        decode("GpuLost", GpuLost.version + 1, payload)


def test_payload_missing_a_required_field_fails_loudly() -> None:
    with pytest.raises(UnknownEventError, match="RunSubmitted"):
        decode("RunSubmitted", 1, json.dumps({"at": 1.0, "run_id": "r"}))


def test_encoding_a_live_object_is_refused() -> None:
    bad = RunSubmitted(
        at=1.0, run_id="r", pipeline="p", spec_path="", steps=(), vars={"x": object()}
    )  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        encode(bad)


#: Rows as m27 0.1.0 stored them (before the RunEvent/StepEvent bases and the pid start
#: times): they must decode to the same events and, where no field was added since, encode
#: back to the same bytes.
OLD_ROWS = [
    (
        "StepFailed",
        1,
        '{"at":5.0,"run_id":"r1","step":"md","attempt":2,"duration_s":1.5,"reason":"exited '
        'with code 3","exit_code":3,"signal":null,"log_tail":"boom","will_retry":true}',
    ),
    (
        "LeaseGranted",
        1,
        '{"at":2.0,"run_id":"r1","step":"md","gpus":[0,1],"tier":"guest","channel":""}',
    ),
    ("RunCrashed", 1, '{"at":9.0,"run_id":"r1","reason":"gone"}'),
    (
        "StepStarted",
        1,
        '{"at":3.0,"run_id":"r1","step":"md","attempt":1,"pid":41,"pgid":41,"command":["md"],'
        '"gpus":[0],"log_path":"","resume_from":null,"host":"n1"}',
    ),
]


@pytest.mark.parametrize(("kind", "version", "payload"), OLD_ROWS, ids=[r[0] for r in OLD_ROWS])
def test_rows_of_an_older_log_still_load(kind: str, version: int, payload: str) -> None:
    from m27.events import RunEvent, StepEvent

    ev = decode(kind, version, payload)
    assert ev.kind == kind and isinstance(ev, RunEvent)
    assert ev.run_id == "r1" and (not isinstance(ev, StepEvent) or ev.step == "md")
    stored = json.loads(payload)
    again = json.loads(encode(ev)[2])
    assert {k: again[k] for k in stored} == stored  # every stored field comes back as it was
    if isinstance(ev, StepStarted):
        assert again["pid_started"] is None  # unknown in an old log: liveness trusts the pid
    elif isinstance(ev, StepFailed):
        assert again["retry_delay"] == 0.0  # an old log's retry asked again at once
    elif kind == "LeaseGranted":
        assert again["cpus"] == []  # granted before cores were shared: not confined
    else:
        assert encode(ev) == (kind, version, payload)
