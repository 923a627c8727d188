"""What the agent tells the rest of the node besides its leases: a live GPU snapshot and
GPU health alerts.

**The snapshot.** With simulated GPUs the utilization exists only inside the agent's
process (it follows the steps attached there), and with NVML a second process sampling
the same GPUs sees no primaries or guests. So the agent writes what it last saw to
``$M27_HOME/gpus.json`` about once a second (atomically: write, then rename), and
``m27 gpus`` shows that file while it is fresh and its writer lives; otherwise it samples
the GPUs itself. Nothing is appended to the log for it: a sample a second would drown the
events people read.

**Health.** :class:`Health` turns samples into ``GpuOverheated`` and ``GpuThrottled``
once per crossing, not once per sample (the notifier sends each to a phone):

- hot: the temperature reaches ``temp_alert_c`` (80 °C by default); re-armed when it has
  fallen ``hysteresis_c`` below, so a GPU hovering at the threshold alerts once;
- throttled: a thermal or power throttle reason appears (:data:`ALERT_THROTTLE`; idling,
  application clocks, sync boost and display clocks are normal operation); re-armed
  after ``rearm_s`` seconds without one, so a GPU that touches its power cap at every
  step alerts once, not at every step.

An unknown temperature or throttle set (``None``) changes nothing. A restarted agent
starts unarmed: a GPU still hot after a restart alerts again, once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from m27 import liveness
from m27.events import Event, GpuOverheated, GpuThrottled
from m27.gpu import GpuBackend, GpuSample, ProcessSample
from m27.node.book import Book
from m27.policy import Decision, PolicyConfig, bounded, effective_priority, key_text

__all__ = [
    "ALERT_THROTTLE",
    "SNAPSHOT_NAME",
    "Health",
    "Sampler",
    "queue_rows",
    "read_snapshot",
    "sample_from_row",
    "sample_row",
    "snapshot",
    "write_snapshot",
]

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "gpus.json"
SNAPSHOT_VERSION = 1
#: A snapshot older than this (seconds) is not shown as live.
SNAPSHOT_MAX_AGE = 5.0

#: Throttle reasons that mean a GPU is too hot or short of power.
ALERT_THROTTLE = frozenset(
    {"sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake", "sw_power_cap"}
)


class Health:
    """Alert state per GPU; ``check`` returns the events for one sampling pass."""

    def __init__(
        self, temp_alert_c: float = 80.0, hysteresis_c: float = 5.0, rearm_s: float = 60.0
    ) -> None:
        self.temp_alert_c = temp_alert_c
        self.hysteresis_c = hysteresis_c
        self.rearm_s = rearm_s
        self._hot: set[int] = set()
        self._throttled: dict[int, float] = {}  # gpu -> last time an alert reason was seen

    def check(self, samples: Sequence[GpuSample], now: float) -> list[Event]:
        out: list[Event] = []
        for s in samples:
            if s.lost:
                continue
            uuid = s.uuid or ""
            t = s.temperature_c
            if t is not None:
                if t >= self.temp_alert_c and s.index not in self._hot:
                    self._hot.add(s.index)
                    out.append(GpuOverheated(now, s.index, t, self.temp_alert_c, uuid))
                elif t < self.temp_alert_c - self.hysteresis_c:
                    self._hot.discard(s.index)
            if s.throttle_reasons is None:
                continue
            reasons = s.throttle_reasons & ALERT_THROTTLE
            if reasons:
                if s.index not in self._throttled:
                    out.append(GpuThrottled(now, s.index, tuple(sorted(reasons)), uuid))
                self._throttled[s.index] = now
            elif now - self._throttled.get(s.index, now) >= self.rearm_s:
                del self._throttled[s.index]
        return out


class Sampler:
    """The backend's samples; if a pass fails as a whole, the same GPUs with every field
    unknown (the agent never dies of a driver error, and a GPU is lost only when the
    backend says so)."""

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self.error = ""
        self._last: list[GpuSample] = []

    def sample(self, now: float) -> list[GpuSample]:
        try:
            samples = self.backend.sample(now)
        except Exception as exc:
            if str(exc) != self.error:
                log.warning("m27 agent: GPU sampling failed, fields unknown: %s", exc)
            self.error = str(exc)
            known = self._last or [
                GpuSample(d.index, d.uuid, d.name, now, memory_total=d.memory_total)
                for d in self.backend.devices()
            ]
            return [
                GpuSample(s.index, s.uuid, s.name, now, s.lost, memory_total=s.memory_total)
                for s in known
            ]
        self.error = ""
        self._last = samples
        return samples


# -- the snapshot -------------------------------------------------------------------------


def sample_row(s: GpuSample) -> dict[str, Any]:
    """A sample as JSON-ready data (the same fields ``m27 gpus --json`` prints)."""
    row = asdict(s)
    row["throttle_reasons"] = None if s.throttle_reasons is None else sorted(s.throttle_reasons)
    return row


def sample_from_row(row: Mapping[str, Any]) -> GpuSample:
    fields = {k: row[k] for k in GpuSample.__dataclass_fields__ if k in row}
    reasons = fields.get("throttle_reasons")
    fields["throttle_reasons"] = None if reasons is None else frozenset(reasons)
    fields["processes"] = tuple(ProcessSample(**p) for p in fields.get("processes", ()))
    return GpuSample(**fields)


def occupancy(book: Book) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """GPU -> primary steps, GPU -> guest steps (``run/step``, paused guests marked)."""
    primaries: dict[int, list[str]] = {}
    guests: dict[int, list[str]] = {}
    for h in book.held.values():
        if h.role == "primary":
            for g in h.gpus:
                primaries.setdefault(g, []).append(key_text(h.key))
        elif h.role == "guest" and h.gpus:
            name = key_text(h.key) + (" (paused)" if h.paused else "")
            guests.setdefault(h.gpus[0], []).append(name)
    return primaries, guests


def queue_rows(book: Book, decision: Decision, now: float, cfg: PolicyConfig) -> dict[str, Any]:
    """Held and waiting steps with their tiers, effective priorities and, for each waiting
    one, why (``decision.why``): what ``m27 queue`` shows, from the agent's own decision
    when it publishes it, else from a fold of the log."""
    held = []
    for key, h in book.held.items():
        req = h.request
        at = req.at if req else h.granted_at
        base = bounded(req.priority) if req else 0
        prio = effective_priority(base, bounded(book.bumps.get(key, 0)), at, now, cfg)
        state = "paused" if h.paused else "running"
        held.append(
            {
                "step": key_text(key),
                "role": h.role,
                "tier": h.tier,
                "gpus": list(h.gpus),
                "priority": prio,
                "state": state if h.role == "guest" else "running",
            }
        )
    ranked: list[tuple[int, float, dict[str, Any]]] = []
    for r in book.requests.values():
        key = (r.run_id, r.step)
        bump = bounded(book.bumps.get(key, 0))
        prio = effective_priority(bounded(r.priority), bump, r.at, now, cfg)
        row = {
            "step": key_text(key),
            "type": r.type,
            "gpus": r.gpus,
            "priority": prio,
            "base": r.priority,
            "bump": bump,
            "owner": r.owner,
            "waited_s": round(max(0.0, now - r.at), 1),
            "why": decision.why(key),
        }
        ranked.append((-prio, r.at, row))
    waiting = [row for *_, row in sorted(ranked, key=lambda t: (t[0], t[1]))]
    return {"held": held, "waiting": waiting}


def snapshot(
    samples: Sequence[GpuSample],
    book: Book,
    backend: str,
    at: float,
    pid: int | None = None,
    queue: Mapping[str, Any] | None = None,
    outside: Mapping[int, int] | None = None,
    cores: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """What ``gpus.json`` holds; with `queue` (:func:`queue_rows`) also the queue as of
    the book's ``last_seq`` (``seq``), with `outside` each GPU's memory held by processes
    m27 did not start (``outside_memory``), with `cores` each GPU's share of the node's
    cores (``cores``, m27.gpu.cpus; [] where GPU steps are not confined)."""
    primaries, guests = occupancy(book)
    rows = []
    for s in samples:
        row = sample_row(s)
        row.update(
            backend=backend, primary=primaries.get(s.index, []), guests=guests.get(s.index, [])
        )
        if outside is not None:
            row["outside_memory"] = outside.get(s.index, 0)
        row["cores"] = list((cores or {}).get(s.index, ()))
        rows.append(row)
    pid = os.getpid() if pid is None else pid
    return {
        "version": SNAPSHOT_VERSION,
        "written_at": at,
        "pid": pid,
        # with the pid, names the writer: a stranger reusing a dead agent's pid is not it
        "pid_started": liveness.start_time(pid),
        "backend": backend,
        "gpus": rows,
        **({"queue": queue, "seq": book.last_seq} if queue is not None else {}),
    }


def write_snapshot(home: Path, data: Mapping[str, Any]) -> None:
    """Atomically replace ``$M27_HOME/gpus.json`` (a reader never sees half a file)."""
    path = Path(home) / SNAPSHOT_NAME
    tmp = path.with_name(f".{SNAPSHOT_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def remove_snapshot(home: Path) -> None:
    """Called by an agent that stops cleanly, if the snapshot is its own."""
    path = Path(home) / SNAPSHOT_NAME
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def read_snapshot(
    home: Path, now: float | None = None, max_age: float = SNAPSHOT_MAX_AGE
) -> dict[str, Any] | None:
    """The agent's snapshot if it is fresh and its writer still runs, else None."""
    path = Path(home) / SNAPSHOT_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
        return None
    now = time.time() if now is None else now
    written = data.get("written_at")
    if not isinstance(written, int | float) or abs(now - written) > max_age:
        return None
    pid, started = data.get("pid"), data.get("pid_started")
    started = float(started) if isinstance(started, int | float) else None
    if not isinstance(pid, int) or not liveness.alive(pid, started):
        return None
    if not isinstance(data.get("gpus"), list):
        return None
    return data
