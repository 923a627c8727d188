"""Helpers for the agent tests: a node (log + sim GPUs + agent), step scripts, log reading."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from m27 import events as ev
from m27.executors.local import StepLaunch, StepResult
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent
from m27.node.lease import AgentLease, run_leased
from m27.policy import PolicyConfig
from m27.store.sqlite import SqliteEventStore

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[2]
TICK = 0.01

#: A step with compute and I/O phases, like MD writing trajectory frames. Compute is a
#: sleep: the simulated GPU counts a process as computing unless it is at its gate, in an
#: io_wait block or stopped. Every phase is recorded as "kind start end" (time.time()).
STEP = textwrap.dedent("""\
    import sys, time
    from m27.step import gate, io_wait
    out, cycles, compute, io, load, chunk = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:7])
    gated = sys.argv[7] == "1"
    until = sys.argv[8] if len(sys.argv) > 8 else ""  # loop until this file exists
    rec = open(out, "a", buffering=1)
    with io_wait():
        t = time.time(); time.sleep(load); rec.write(f"load {t} {time.time()}\\n")
    import os
    n = 0
    while (n < cycles) if not until else not os.path.exists(until):
        n += 1
        left = compute
        while left > 1e-9:
            if gated:
                gate()
            t = time.time(); time.sleep(min(chunk, left)); left -= chunk
            rec.write(f"compute {t} {time.time()}\\n")
        if io > 0:
            with io_wait():
                t = time.time(); time.sleep(io); rec.write(f"io {t} {time.time()}\\n")
""")


def step_argv(
    out: Path,
    cycles: int = 3,
    compute: float = 0.1,
    io: float = 0.1,
    load: float = 0.0,
    chunk: float = 0.01,
    gated: bool = True,
    until: Path | None = None,
) -> tuple[str, ...]:
    args = (cycles, compute, io, load, chunk, int(gated))
    tail = (str(until),) if until is not None else ()
    if until is not None:
        UNTIL.append(until)
    return (sys.executable, "-c", STEP, str(out), *map(str, args), *tail)


#: Every `until` file a test's steps loop for; :func:`end_steps` writes them.
UNTIL: list[Path] = []


def end_steps() -> None:
    """Write every `until` file handed out so far, so no looping step outlives its test
    (its own session, so pytest's end does not take it) when the test failed before."""
    while UNTIL:
        with contextlib.suppress(OSError):
            UNTIL.pop().write_text("done")


def phases(path: Path, kind: str) -> list[tuple[float, float]]:
    """The (start, end) of each `kind` phase the step has written so far: complete lines
    only (the step may be writing the last one as we read)."""
    if not path.exists():
        return []
    text = path.read_text()
    rows = [line.split() for line in text[: text.rfind("\n") + 1].splitlines()]
    return [(float(a), float(b)) for k, a, b in rows if k == kind]


@dataclass
class Node:
    home: Path
    store: SqliteEventStore
    backend: SimBackend
    agent: Agent
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    leases: list[AgentLease] = field(default_factory=list)

    def start(self) -> Node:
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True)
        self.thread.start()
        return self

    def lease(self) -> AgentLease:
        """A lease on this node's log, closed by :meth:`close` if the test has not."""
        lease = AgentLease(self.store, self.home, embed=False)
        self.leases.append(lease)
        return lease

    def close(self) -> None:
        # A test that failed midway leaves steps and leases running: end them while the
        # agent still acts (a paused guest's gate opens), or their threads would write to
        # the closed log during a later test.
        end_steps()
        end_step_threads()
        for lease in self.leases:
            lease.close()
        self.stop.set()
        if self.thread is not None:
            self.thread.join(60)
            # Closing the store under a live agent thread would fail it at random later.
            assert not self.thread.is_alive(), "the agent thread did not stop"
        self.agent.close()
        self.store.close()

    def events(self) -> list[ev.Event]:
        return [r.event for r in self.store.read()]

    def of(self, cls: type[ev.Event]) -> list[ev.Event]:
        return [e for e in self.events() if isinstance(e, cls)]


def make_node(
    home: Path,
    gpus: int = 1,
    memory: int = 16 * GiB,
    *,
    gate_grace: float = 0.1,
    **config: float,
) -> Node:
    store = SqliteEventStore(home / "events.db")
    backend = SimBackend(gpus, memory_total=memory)
    cfg = PolicyConfig(**{"io_timeout": 0.02, "cpu_slots": 2, **config})  # type: ignore[arg-type]
    agent = Agent(store, backend, home, config=cfg, tick=TICK, gate_grace=gate_grace)
    return Node(home, store, backend, agent)


@dataclass
class StepRun:
    thread: threading.Thread
    result: list[StepResult | None]
    cancel: threading.Event

    def wait(self, timeout: float = 30) -> StepResult | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "step did not finish"
        return self.result[0]


def run_step_leased(
    lease: AgentLease,
    run_id: str,
    step: str,
    argv: tuple[str, ...],
    *,
    type: str = "gpu",
    gpu_memory: int = GiB,
    priority: int = 0,
    owner: str = "u",
    cancel: threading.Event | None = None,
    retries: int = 0,
    retry_delay: float = 0.0,
    timeout: float | None = None,
) -> StepRun:
    """Lease and run one real step process on a thread, as the flow does."""
    result: list[StepResult | None] = [None]
    launch = StepLaunch(
        run_id=run_id,
        step=step,
        argv=argv,
        grace=1.0,
        retries=retries,
        retry_delay=retry_delay,
        timeout=timeout,
    )
    cancel = cancel or threading.Event()

    def body() -> None:
        result[0] = run_leased(
            lease,
            launch,
            type,
            cancel=cancel,
            gpu_memory=gpu_memory,
            priority=priority,
            owner=owner,
        )

    t = threading.Thread(target=body, daemon=True)
    t.start()
    STEP_RUNS.append(run := StepRun(t, result, cancel))
    return run


#: Every step thread :func:`run_step_leased` started; :func:`end_step_threads` ends them.
STEP_RUNS: list[StepRun] = []


def end_step_threads() -> None:
    """Wait for every step thread started so far; cancel (SIGTERM, then SIGKILL) a step
    still running after a while (one a failed test left paused or looping)."""
    while STEP_RUNS:
        run = STEP_RUNS.pop()
        run.thread.join(10)
        if run.thread.is_alive():
            run.cancel.set()
            run.thread.join(30)


def windows(events: list[ev.Event], key: tuple[str, str]) -> Iterator[tuple[float, float]]:
    """Times a guest was allowed to compute: GuestResumed .. next GuestPaused (or end)."""
    opened: float | None = None
    for e in events:
        if getattr(e, "run_id", None) != key[0] or getattr(e, "step", None) != key[1]:
            continue
        if isinstance(e, ev.GuestResumed):
            opened = e.at
        elif isinstance(e, ev.GuestPaused | ev.Promoted | ev.LeaseReleased) and opened is not None:
            yield (opened, e.at)
            opened = None
