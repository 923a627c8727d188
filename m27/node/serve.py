"""The node service process: the agent, the crash watcher and the node's Prefect server.

One per node (it holds the node lock, ``$M27_HOME/agent.lock``). `m27 agent` runs it in the
foreground (systemd, compose); the first `m27 run` with none running starts it detached
with ``--on-demand`` (:func:`m27.node.service.ensure_service`), and then it stops itself
after ``service_idle`` with no runs and no steps.

Threads, all stopped by one event (SIGTERM, SIGINT, idle):

- the agent (:class:`m27.node.agent.Agent`) ticks as it always did;
- the crash watcher follows the log and, when a run's flow process is gone, closes the
  run (:func:`m27.node.crash.sweep`: its steps get SIGTERM, SIGKILL after a grace, their
  leases are released) and marks the flow run and its task runs Crashed in Prefect; a
  run that ended while Prefect could not be told is settled there (:mod:`m27.node.settle`);
- the main thread supervises the Prefect server (restarted on the same port when it
  dies) and the warm runner that forks a pre-imported `m27 run` per run
  (:mod:`m27.node.runner`), and decides the idle stop.

Without ``PREFECT_API_URL`` the service starts its own Prefect server first and points
its own Prefect client at it; with it (a lab server) it starts none.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from m27 import liveness
from m27._exceptions import one_line
from m27.events.check import first_misfit_in
from m27.events.state import NodeState, RunState, fold
from m27.locks import NodeLock
from m27.node import service
from m27.node.crash import (
    close_task_runs,
    dead_runs,
    mark_prefect_crashed,
    sweep,
    with_prefect,
)
from m27.node.embed import build_agent, request_handover, withdraw_handover
from m27.node.info import USED_NAME, ServiceInfo, remove_info, write_info
from m27.node.outage import Repeats
from m27.node.prefect_server import PrefectServer
from m27.node.revive import Reviver
from m27.node.runner import WarmRunner
from m27.node.settle import add_missing_tasks, ended_runs, settle, settle_tasks
from m27.store.sqlite import LOG_NAME, open_store
from m27.units import cpu_list

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

__all__ = ["busy", "serve"]

#: SIGTERM first so a step can write a checkpoint; SIGKILL after this many seconds.
STOP_GRACE_S = 10.0
#: A crashed run's task runs are closed again every few seconds for this long.
RECHECK_FOR_S = 60.0
#: How long after a settle the steps Prefect has no task run of get one (m27.node.settle:
#: a task run the flow process created can reach Prefect that late, as events).
MISSING_AFTER_S = 15.0
RECHECK_EVERY_S = 3.0
#: How often ended runs are checked against Prefect (a Prefect that was down when a run
#: ended still shows it open: m27.node.settle).
SETTLE_EVERY_S = 5.0
#: How long the service waits for its Prefect server to answer (start or restart).
HEALTH_TIMEOUT_S = 180.0
#: A run that crashed this long before the service started is still resumed by it
#: (`on_crash: resume`): the command that started the service may have recorded the crash.
REVIVE_BEFORE_S = 600.0


def busy(state: NodeState, host: str | None = None) -> bool:
    """True while the node has work: a held lease, a waiting request, or a running run of
    this host (a run of an old log with no recorded process never ends: it does not count)."""
    if state.leases or state.requests:
        return True
    host = host or socket.gethostname()
    return any(r.status == "running" and r.pid and r.host == host for r in state.runs.values())


class _Watcher:
    """Follows the log; closes dead runs (crash truth) and tracks activity for idle stop."""

    def __init__(self, home: Path, log: Callable[[str], None], stop: threading.Event) -> None:
        self.home = home
        self.log = log
        self.failing = Repeats(log)  # a pass that fails every 0.5 s: a line a minute
        self.stop = stop
        self.store = open_store(home)
        self.state = NodeState()
        self.last_busy = time.time()
        self.host = socket.gethostname()
        self.reviver = Reviver(home, self.store, log, time.time() - REVIVE_BEFORE_S)
        self.revive_seq = -1  # the log's last event when they were looked for
        #: flow run id -> (until when, why): crashed runs whose task runs are checked again
        self.recheck: dict[str, tuple[float, str]] = {}
        #: flow run id -> why: closed in the log, not yet marked Crashed in Prefect
        self.unmarked: dict[str, str] = {}
        self.recheck_at = 0.0
        #: flow runs of ended runs whose Prefect state was checked (settle.py)
        self.settled: set[str] = set()
        #: flow run id -> (until when, run): settled flow runs whose task runs are checked
        #: again (a task run's state can reach Prefect after its flow run was settled)
        self.resettle: dict[str, tuple[float, RunState]] = {}
        #: flow run id -> (when, run): settled flow runs whose missing task runs are made
        self.missing: dict[str, tuple[float, RunState]] = {}
        self.settle_at = 0.0
        #: the last failing pass's line and what the log's check found for it
        self.misfit = ("", "")
        self.thread = threading.Thread(target=self._main, name="m27-crash-watch", daemon=True)

    def _main(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep watching: the next pass retries
                line = f"m27 agent: crash watch: {type(exc).__name__}: {exc}"
                self.failing(line + self._misfit_for(line))
            self.stop.wait(0.5)

    def _misfit_for(self, line: str) -> str:
        """What a failing pass says of the log: a row changed by hand fails every pass
        (the fold cannot pass it), and the service log should name it, as commands do
        (m27.events.check). Looked for once per new failure: the log is read whole."""
        if line != self.misfit[0]:
            try:
                found = first_misfit_in(self.store.read)
            except Exception:  # the log cannot be read either: the failure is said as is
                found = None
            text = "" if found is None else f" (the log holds an event m27 did not write: {found})"
            self.misfit = (line, text)
        return self.misfit[1]

    def step(self) -> None:
        self.state = fold(self.store.read(self.state.last_seq), self.state)
        now = time.time()
        if busy(self.state, self.host):
            self.last_busy = now
        if dead_runs(self.state, self.host):
            self.close_dead()
            self.state = fold(self.store.read(self.state.last_seq), self.state)
        self.revive(now)
        rechecks = self.recheck or self.resettle or self.missing
        if self.unmarked or (rechecks and now >= self.recheck_at):
            self.recheck_at = now + RECHECK_EVERY_S
            with_prefect(self._tell_prefect)
        if now >= self.settle_at:
            self.settle_at = now + SETTLE_EVERY_S
            ended = ended_runs(self.state, self.settled, self.host)
            if ended:
                changed: list[str] = []
                refused: dict[str, str] = {}  # tried again next pass; the others are done
                try:
                    with_prefect(lambda client: settle(client, ended, changed, refused))
                    self.settled.update(k for k in ended if k not in refused)
                    for flow_run_id, why in refused.items():
                        self.failing(f"m27 agent: Prefect refused flow run {flow_run_id}: {why}")
                finally:  # those a failed pass may have closed get their checks too
                    for flow_run_id in changed:
                        run = ended[flow_run_id]
                        self.resettle[flow_run_id] = (now + RECHECK_FOR_S, run)
                        self.missing[flow_run_id] = (now + MISSING_AFTER_S, run)
                        self.log(
                            f"m27 agent: flow run of {run.run_id} was open or Crashed in "
                            f"Prefect; set to how the run ended ({run.status})"
                        )

    def revive(self, now: float) -> None:
        """Resume the crashed runs whose pipeline says `on_crash: resume`; looked for when
        the log has new events only (a pass looks at every run)."""
        if self.state.last_seq != self.revive_seq:
            self.revive_seq = self.state.last_seq
            if self.reviver.step(self.state, now):
                self.last_busy = now  # not idle while a resume starts

    def close_dead(self) -> None:
        """Close this host's dead runs in the log first, without Prefect: the log is the
        truth, and a Prefect server that cannot answer now (restarting, its own disk full)
        must not keep them running there. Prefect is told next (:meth:`_tell_prefect`)."""
        import asyncio

        closed = asyncio.run(
            sweep(self.store, None, host=self.host, log=self.log, grace_s=STOP_GRACE_S)
        )
        for finding in closed:
            if finding.flow_run_id:
                self.unmarked[finding.flow_run_id] = finding.reason

    async def _tell_prefect(self, client: PrefectClient) -> None:
        """Mark the runs closed in the log Crashed in Prefect (kept until that worked), then
        close task runs of crashed flow runs that Prefect recorded only after it was closed
        (their states arrive as events, seconds late). Each flow run's part is tried on its
        own (:meth:`_one`): one that Prefect refuses does not hold up the others."""
        for flow_run_id, reason in list(self.unmarked.items()):
            told = await self._one(
                client, flow_run_id, mark_prefect_crashed(client, flow_run_id, reason)
            )
            if told != "retry":
                del self.unmarked[flow_run_id]
            if told == "done":
                self.recheck[flow_run_id] = (time.time() + RECHECK_FOR_S, reason)
        now = time.time()
        for flow_run_id, (until, reason) in list(self.recheck.items()):
            if now > until or (
                await self._one(
                    client,
                    flow_run_id,
                    close_task_runs(client, flow_run_id, "crashed", reason),
                )
                == "gone"
            ):
                del self.recheck[flow_run_id]
        for flow_run_id, (until, run) in list(self.resettle.items()):
            if now > until or (
                await self._one(client, flow_run_id, settle_tasks(client, flow_run_id, run))
                == "gone"
            ):
                del self.resettle[flow_run_id]
        for flow_run_id, (due, run) in list(self.missing.items()):
            if now >= due and (
                await self._one(client, flow_run_id, self._add_missing(client, run)) != "retry"
            ):
                del self.missing[flow_run_id]

    async def _add_missing(self, client: PrefectClient, run: RunState) -> None:
        assert run.flow_run_id is not None  # settled runs have one (ended_runs)
        made = await add_missing_tasks(client, run.flow_run_id, run)
        if made:
            self.log(
                f"m27 agent: {run.run_id}: Prefect had no task run of "
                f"{', '.join(made)} (started while it was down); made with their ends"
            )

    async def _one(
        self, client: PrefectClient, flow_run_id: str, work: Awaitable[object]
    ) -> Literal["done", "retry", "gone"]:
        """Await one flow run's part of a pass: "done", "retry" (Prefect refused it: said on
        the service log, tried again next pass) or "gone" (its flow run was deleted in
        Prefect, by a user in its UI: never retried). Before, a refusal ended the whole
        pass, every pass: the runs after a deleted one never got their task runs. A server
        that does not answer still ends the pass (every other call would wait it out)."""
        from uuid import UUID

        import httpx
        from prefect.exceptions import ObjectNotFound

        try:
            await work
            return "done"
        except httpx.TransportError:
            raise
        except Exception as exc:
            try:
                await client.read_flow_run(UUID(flow_run_id))
            except (ObjectNotFound, ValueError):  # or not a Prefect id (a hand-written log)
                run = next((r.run_id for r in self.state.runs.values()
                            if r.flow_run_id == flow_run_id), "")  # fmt: skip
                self.log(
                    f"m27 agent: flow run {flow_run_id} of {run} is gone from Prefect "
                    "(deleted there); it is not told how the run ended"
                )
                return "gone"
            self.failing(
                f"m27 agent: Prefect refused flow run {flow_run_id}: {type(exc).__name__}: "
                f"{one_line(exc)}"
            )
            return "retry"


def _used_at(home: Path) -> float:
    try:
        return (home / USED_NAME).stat().st_mtime
    except OSError:
        return 0.0


def serve(
    home: Path,
    stop: threading.Event,
    *,
    port: int | None = None,
    idle_s: float | None = None,
    on_decision: Callable[..., None] | None = None,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
    warn: Callable[[str], None] = lambda line: print(line, flush=True),
    warm: bool = True,
) -> int:
    """Run the node service until `stop` is set (or, with `idle_s`, until idle that long).

    With `warm` (the default) it also runs the warm runner (:mod:`m27.node.runner`)."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    lock = NodeLock(home)
    told = False
    while not lock.acquire():
        if not told:
            # A run that took the agent over when the last service went gives it back.
            request_handover(home)
            warn(
                f"m27 agent: pid {lock.holder()} runs this node's agent; waiting for it to hand"
                " over (a run's process does at once, another service when it stops)"
            )
            told = True
        if stop.wait(0.2):
            withdraw_handover(home)
            return 0
    withdraw_handover(home)
    lab = service.lab_url()
    server: PrefectServer | None = None
    started = time.time()
    info = ServiceInfo(
        pid=os.getpid(),
        pid_started=liveness.own_start_time(),
        started_at=started,
        url=lab or "",
        own_server=lab is None,
        host=socket.gethostname(),
    )
    agent_stop = threading.Event()
    agent_thread: threading.Thread | None = None
    watcher: _Watcher | None = None
    runner: WarmRunner | None = None
    try:
        agent = build_agent(home, on_decision=on_decision)
        log_file = _identity(home / LOG_NAME)  # the log the agent opened, to see it replaced
        agent.start()
        agent_thread = threading.Thread(
            target=agent.run, args=(agent_stop,), name="m27-agent", daemon=True
        )
        agent_thread.start()
        devices = agent.backend.devices()
        log(
            f"m27 agent: serving {home} with {len(devices)} "
            f"{agent.backend.kind} GPU(s), tick {agent.tick_s * 1000:.0f} ms"
        )
        if agent.cpu_shares:  # (gpu_cpus: docs/agent.md, "CPU cores of GPU steps")
            shares = ", ".join(f"GPU {g}: {cpu_list(c)}" for g, c in agent.cpu_shares.items())
            log(f"m27 agent: GPU steps run on their GPUs' cores ({shares})")
        sim_memory = devices[0].memory_total if agent.backend.kind == "sim" and devices else 0
        info = _replace(
            info, gpu_backend=agent.backend.kind, gpu_count=len(devices), gpu_memory=sim_memory
        )
        if lab is None and port is not None and not service.can_listen(port):
            # Prefect's own words in server.log were "Invalid host" and a flag of its CLI
            warn(
                f"m27 agent: port {port} on 127.0.0.1 is in use; choose another with --port, "
                "or leave --port out (the node's last port while free, else a free one)"
            )
            return 2
        if lab is None:
            server = PrefectServer(home / "prefect", port or service.node_port(home), log)
            info = _replace(info, url=server.url, port=server.port)
            write_info(home, info)
            server.start()
            info = _replace(info, prefect_pid=server.pid)
            write_info(home, info)
            if not server.wait_healthy(HEALTH_TIMEOUT_S, stop.is_set):
                if stop.is_set():
                    return 0
                warn(f"m27 agent: the Prefect server did not start; see {server.home}/server.log")
                return 1
            os.environ["PREFECT_API_URL"] = server.url
            log(f"m27 agent: Prefect server ready at {server.url} (UI {info.ui_url})")
        else:
            log(f"m27 agent: using the lab's Prefect server at {lab}")
        info = _replace(info, state="ready")
        write_info(home, info)
        watcher = _Watcher(home, log, stop)
        watcher.thread.start()
        if warm:
            runner = WarmRunner(home, info.url, log)
            runner.start()
        return _supervise(
            home, stop, server, info, watcher, agent_thread, idle_s, log, runner, log_file
        )
    finally:
        stop.set()
        agent_stop.set()
        if agent_thread is not None:
            agent_thread.join(10)
        if watcher is not None:
            watcher.thread.join(STOP_GRACE_S + 5)
            watcher.store.close()
        if runner is not None:
            runner.stop()
        if server is not None:
            server.stop()
        remove_info(home, os.getpid())
        if agent_thread is not None:
            agent.close()
            agent.store.close()
        lock.release()
        log("m27 agent: stopped")


def _supervise(
    home: Path,
    stop: threading.Event,
    server: PrefectServer | None,
    info: ServiceInfo,
    watcher: _Watcher,
    agent_thread: threading.Thread,
    idle_s: float | None,
    log: Callable[[str], None],
    runner: WarmRunner | None,
    log_file: tuple[int, int] | None,
) -> int:
    while not stop.wait(0.25):
        if (now := _identity(home / LOG_NAME)) != log_file:
            # deleted or replaced under the service: it would go on recording into a file
            # no command reads, and a new run would wait for a GPU forever
            log(
                f"m27 agent: the event log {home / LOG_NAME} was "
                f"{'removed' if now is None else 'replaced'}; stopping the service (the next "
                "m27 command starts one on the log that is there now)"
            )
            return 1
        if runner is not None:
            runner.check()
        if not agent_thread.is_alive():
            log("m27 agent: the agent loop ended unexpectedly; stopping the service")
            return 1
        if server is not None and server.dead():
            write_info(home, info := _replace(info, state="starting"))
            ok = server.restart(HEALTH_TIMEOUT_S, stop.is_set)
            info = _replace(info, prefect_pid=server.pid, restarts=server.restarts)
            info = _replace(info, state="ready" if ok else "starting")
            write_info(home, info)
        if idle_s is not None:
            quiet_since = max(watcher.last_busy, _used_at(home))
            if time.time() - quiet_since >= idle_s and not busy(watcher.state, watcher.host):
                log(f"m27 agent: idle for {idle_s:.0f}s (no runs, no steps); stopping")
                return 0
    return 0


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`, None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _replace(info: ServiceInfo, **changes: object) -> ServiceInfo:
    from dataclasses import replace

    return replace(info, **changes)  # type: ignore[arg-type]
