"""The simulator and the agent make the same decisions on the same inputs.

Every case of :mod:`tests.unit.policy_cases` is put (a) straight into
:func:`m27.policy.decide`, (b) into the trace simulator's state, whose scheduler builds
the policy input the way a replay does, and (c) into a node agent, as the events its log
would hold and the samples of simulated GPUs, whose own builder
(:func:`m27.node.book.policy_input` over its book and its GPU views) makes the input.
All three must give the hand-computed actions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from m27 import events as ev
from m27.clock import FakeClock
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent, channel_path
from m27.node.book import policy_input
from m27.policy import Demote, GpuView, Grant, PolicyInput, Promote, Running, StartCpu, decide
from m27.sim.engine import Live, SimState, _Engine
from m27.sim.schedulers import PolicyScheduler
from m27.sim.trace import Job, Trace
from m27.step._channel import Channel
from m27.store.memory import MemoryEventStore
from tests.unit.policy_cases import CASES, MEMORY, Case

#: Far above any pid_max: these made-up processes never exist, so nothing is signalled.
PID0 = 90_000_000

IDS = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_policy_gives_the_hand_computed_actions(case: Case) -> None:
    d = decide(case.policy_input())
    assert d.actions == case.expected
    assert d.next_check == case.next_check


# --- (b) the simulator ------------------------------------------------------------------


def sim_state(case: Case) -> tuple[SimState, dict[str, Live]]:
    jobs = []
    for s in case.steps:
        phases = (("compute", 60.0), ("io", 60.0), ("compute", 60.0))
        jobs.append(
            Job(
                id=s.id,
                arrival=s.queued_at,
                phases=phases,  # type: ignore[arg-type]
                type=s.type,
                priority=s.priority,
                owner=s.owner,
                gpus=s.gpus,
                gpu_memory=s.gpu_memory,
                io_hint=s.io_hint,
            )
        )
    trace = Trace(jobs=tuple(jobs), gpus=case.gpus, gpu_memory=MEMORY, cpu_slots=case.cpu_slots)
    state = SimState(
        trace,
        case.gpus,
        case.now,
        primary=[None] * case.gpus,
        guests=[[] for _ in range(case.gpus)],
    )
    lives = {}
    for s, job in zip(case.steps, jobs, strict=True):
        lv = Live(job, s.queued_at)
        lives[job.id] = lv
        state.by_key[job.key] = job.id
        if s.role is None:
            state.pending[job.id] = lv
            continue
        lv.role, lv.tier, lv.gpus, lv.paused = s.role, s.tier, s.on, s.paused
        lv.started_at = s.started_at
        if s.computed:  # a second of its first phase done
            lv.remaining -= 1.0
        if s.io_since is not None:  # in its I/O phase since then
            lv.phase, lv.phase_started = 1, s.io_since
        state.running[job.id] = lv
        if s.role == "primary":
            for g in s.on:
                state.primary[g] = job.id
        elif s.role == "guest":
            state.guests[s.on[0]].append(job.id)
    return state, lives


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_simulator_builds_the_same_input_and_applies_the_same_actions(case: Case) -> None:
    state, lives = sim_state(case)
    sched = PolicyScheduler(case.config)
    sched._last = case.now  # no GPU time accrued before the case: fair share sees none
    actions, wake = sched.step(state)
    assert sched.last_input == case.policy_input()
    assert tuple(actions) == case.expected
    assert wake == case.next_check
    # The engine accepts them: every grant leaves the queue, promotions take the GPU.
    engine = _Engine(state.trace, sched, case.gpus)
    engine.st, engine.lives = state, lives
    engine.apply(actions, case.now)
    started = {a.key for a in actions if isinstance(a, Grant | StartCpu)}
    assert started <= {lv.job.key for lv in state.running.values()}
    for a in actions:
        if isinstance(a, Promote | Demote):
            owner = state.primary[a.gpu]
            assert (owner == state.by_key[a.key]) is isinstance(a, Promote)


# --- (c) the agent ----------------------------------------------------------------------


def agent_log(case: Case, home: Path) -> tuple[list[ev.Event], dict[str, Channel]]:
    """What the log would hold: requests, and for held steps the grant, the start and the
    guest's gate. Channels are created as the agent creates them on a grant."""
    out: list[ev.Event] = []
    channels: dict[str, Channel] = {}
    for n, s in enumerate(case.steps):
        run, step = s.key
        pid = PID0 + n
        out.append(
            ev.StepRequested(
                at=s.queued_at, run_id=run, step=step, type=s.type, priority=s.priority,
                gpus=s.gpus, gpu_memory=s.gpu_memory, owner=s.owner, pid=pid,
            )
        )  # fmt: skip
        if s.role is None:
            continue
        path = channel_path(home, s.key)
        if s.role != "cpu":
            path.parent.mkdir(parents=True, exist_ok=True)
            ch = channels[s.id] = Channel.create(path, gate_open=not s.paused)
            if s.io_hint and s.io_since is not None:
                ch.enter_io()
        tier = "background" if s.role == "cpu" else s.tier  # what the agent logs for cpu
        at = s.started_at
        chan = str(path) if s.role != "cpu" else ""
        out.append(ev.LeaseGranted(at, run, step, s.on, tier, chan))
        if s.role == "guest":
            out.append(ev.GuestStarted(at=at, run_id=run, step=step, gpu=s.on[0]))
        out.append(
            ev.StepStarted(
                at=at, run_id=run, step=step, attempt=1, pid=pid, pgid=pid,
                command=("step",), gpus=s.on,
            )
        )  # fmt: skip
        if s.role == "guest":  # its gate, once its process runs: only then can it compute
            if s.has_computed:
                out.append(ev.GuestResumed(at=at, run_id=run, step=step, gpu=s.on[0]))
            if s.paused:
                out.append(ev.GuestPaused(at=at, run_id=run, step=step, gpu=s.on[0]))
    return out, channels


def agent_input(case: Case, home: Path) -> PolicyInput:
    store = MemoryEventStore()
    backend = SimBackend(case.gpus, memory_total=MEMORY)
    events, channels = agent_log(case, home)
    store.append(events)
    agent = Agent(
        store, backend, home, config=case.config, clock=FakeClock(case.now), snapshot_every=None
    )
    try:
        for rec in store.read():
            agent._apply(rec)  # the agent's own intake: book, channels, GPU attachment
        for n, s in enumerate(case.steps):
            if s.on:
                backend.set_computing(PID0 + n, s.computing)
        lows = {s.io_since for s in case.running if s.io_since is not None}
        assert len(lows) <= 1, "the agent learns one I/O start per sampling pass"
        for t in lows:  # the pass at which utilization dropped
            samples = backend.sample(t)
            agent._views(samples, t)
            agent._track_guests(samples, t)
        samples = backend.sample(case.now)
        views = agent._views(samples, case.now)
        agent._track_guests(samples, case.now)
        return policy_input(
            agent.book,
            views,
            case.now,
            case.config,
            usage={},
            io_waiting=agent._io_waiting,
            util_low_since=agent._guest_low.get,
            passed_gate=agent._passed_gate,
        )
    finally:
        agent.close()
        for ch in channels.values():
            ch.close()


def _observed_as_sim_sees(v: GpuView, threshold: float) -> GpuView:
    """The simulator reports no memory use and a primary at 100 % or 0 %; real samples
    report memory and shares of the SMs. The policy reads memory as max(observed, declared)
    and utilization only against the threshold, so these are the same to it."""
    util = v.primary_util
    if util is not None:
        util = 100.0 if util >= threshold else 0.0
    return replace(v, memory_used=None, primary_util=util)


def _cpu_tier(r: Running) -> Running:
    """The agent logs cpu leases as background, the simulator leaves them immediate; the
    policy never reads the tier of a cpu lease."""
    return replace(r, tier="immediate") if r.role == "cpu" else r


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_agent_builds_the_same_input_from_its_log_and_samples(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_HOME", str(tmp_path))
    inp = agent_input(case, tmp_path)
    want = case.policy_input()
    assert inp.pending == want.pending
    assert tuple(map(_cpu_tier, inp.running)) == want.running
    threshold = case.config.io_util_threshold
    assert tuple(_observed_as_sim_sees(v, threshold) for v in inp.gpus) == want.gpus
    assert (inp.now, inp.config, dict(inp.usage_by_owner)) == (want.now, want.config, {})
    d = decide(inp)
    assert d.actions == case.expected
    assert d.next_check == case.next_check


def test_every_action_kind_is_covered_by_a_shared_case() -> None:
    kinds = {type(a).__name__ for c in CASES for a in c.expected}
    assert kinds == {
        "Grant", "StartCpu", "PauseGuest", "ResumeGuest", "Promote", "Demote", "Reserve", "Move"
    }  # fmt: skip
