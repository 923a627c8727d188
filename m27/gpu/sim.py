"""Simulated GPUs: what every test and every laptop runs on (``M27_GPUS=sim:4x80GiB``).

A simulated GPU is driven by the real step processes attached to it, so the agent's
decisions can be exercised end to end without a GPU: a process counts as *computing*
while it is alive, not stopped (SIGSTOP), not blocked at its gate and not inside an
``m27.io_wait()`` block (read from its channel page). A GPU is 100 % busy while any of
its processes computes and 0 % otherwise, and the computing processes share the SMs.

Everything else follows from that and from the ``now`` given to ``sample``, so a run
under a FakeClock is deterministic: power is 60 W idle and 300 W busy, energy integrates
the power observed at each pass over the time to the next, temperature approaches
30 °C idle / 75 °C busy with a 20 s time constant, memory used is the sum of what the
attached live processes declared.

Tests that need a hot or throttling GPU say so: ``set_temperature(gpu, 85.0)`` holds a
temperature, ``set_throttle(gpu, {"hw_thermal"})`` adds throttle reasons (None goes
back to the model).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from m27 import liveness
from m27._exceptions import GpuError
from m27.gpu import (
    DEFAULT_SIM_MEMORY,
    THROTTLE_REASONS,
    BackendBase,
    GpuInfo,
    GpuSample,
    ProcessSample,
)
from m27.step import Channel

__all__ = ["BUSY_W", "IDLE_W", "SimBackend"]

IDLE_W = 60.0
BUSY_W = 300.0
_IDLE_C, _BUSY_C, _TAU_S = 30.0, 75.0, 20.0
_IDLE_MHZ, _BUSY_MHZ = 345.0, 1980.0


@dataclass
class _Attached:
    pid: int
    memory: int
    channel: Channel | None
    computing: bool | None = None  # set_computing() override; None: look at the process


@dataclass
class _GpuState:
    info: GpuInfo
    lost: bool = False
    last_time: float | None = None
    power_w: float = IDLE_W
    energy_j: float = 0.0
    temperature_c: float = _IDLE_C
    forced_temperature: float | None = None
    forced_throttle: frozenset[str] = frozenset()


class SimBackend(BackendBase):
    """``count`` virtual GPUs of ``memory_total`` bytes each."""

    kind = "sim"
    label = "simulated"

    def __init__(self, count: int, memory_total: int = DEFAULT_SIM_MEMORY) -> None:
        if count < 1:
            raise GpuError("a simulated node needs at least one GPU", count=count)
        name = f"m27 simulated GPU ({memory_total / 1024**3:g} GiB)"
        self._gpus = [
            _GpuState(GpuInfo(i, f"GPU-sim-{i:04d}", name, memory_total)) for i in range(count)
        ]
        self._attached: list[dict[int, _Attached]] = [{} for _ in range(count)]
        super().__init__()

    def devices(self) -> list[GpuInfo]:
        return [gpu.info for gpu in self._gpus]

    # -- what the agent (or a test) tells the simulator -------------------------------

    def attach(
        self,
        gpu: int,
        pid: int,
        memory: int = 0,
        channel_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Put process ``pid`` on ``gpu`` with ``memory`` bytes declared; its channel says
        when it waits on I/O or at its gate."""
        self._check_index(gpu)
        channel = Channel.open(Path(channel_path), writable=False) if channel_path else None
        with self._lock:
            old = self._attached[gpu].pop(pid, None)
            self._attached[gpu][pid] = _Attached(pid, memory, channel)
        if old is not None and old.channel is not None:
            old.channel.close()

    def detach(self, gpu: int, pid: int) -> None:
        self._check_index(gpu)
        with self._lock:
            old = self._attached[gpu].pop(pid, None)
        if old is not None and old.channel is not None:
            old.channel.close()

    def set_computing(self, pid: int, computing: bool | None) -> None:
        """Override what ``pid`` is doing (True/False) on every GPU it is attached to, or
        go back to observing the process (None). Lets tests use made-up pids."""
        with self._lock:
            for procs in self._attached:
                if pid in procs:
                    procs[pid].computing = computing

    def lose(self, gpu: int) -> None:
        """The GPU falls off the bus: from now on its samples say ``lost``."""
        self._check_index(gpu)
        with self._lock:
            self._gpus[gpu].lost = True

    def set_temperature(self, gpu: int, celsius: float | None) -> None:
        """Hold ``gpu`` at ``celsius`` (a cooling failure, a hot room); None: the model again."""
        self._check_index(gpu)
        with self._lock:
            state = self._gpus[gpu]
            state.forced_temperature = celsius
            if celsius is not None:
                state.temperature_c = celsius

    def set_throttle(self, gpu: int, reasons: set[str] | frozenset[str] | None) -> None:
        """Add throttle ``reasons`` (names from :data:`m27.gpu.THROTTLE_REASONS`) to the
        samples of ``gpu``; None or empty: only what the model says."""
        self._check_index(gpu)
        unknown = set(reasons or ()) - THROTTLE_REASONS
        if unknown:
            raise GpuError(f"unknown throttle reasons: {sorted(unknown)}", gpu=gpu)
        with self._lock:
            self._gpus[gpu].forced_throttle = frozenset(reasons or ())

    # -- GpuBackend -------------------------------------------------------------------

    def _sample_all(self, now: float) -> list[GpuSample]:
        return [self._sample_one(gpu, now) for gpu in self._gpus]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            attached, self._attached = self._attached, [{} for _ in self._gpus]
        for procs in attached:
            for proc in procs.values():
                if proc.channel is not None:
                    proc.channel.close()

    # -- internals --------------------------------------------------------------------

    def _sample_one(self, gpu: _GpuState, now: float) -> GpuSample:
        info = gpu.info
        if gpu.lost:
            return GpuSample(info.index, info.uuid, info.name, now, lost=True)
        live: list[tuple[_Attached, bool]] = []
        for proc in self._attached[info.index].values():
            computing = _is_computing(proc)
            if computing is not None:
                live.append((proc, computing))
        busy = sum(1 for _, computing in live if computing)
        util = 100.0 if busy else 0.0

        dt = 0.0 if gpu.last_time is None else max(0.0, now - gpu.last_time)
        gpu.energy_j += gpu.power_w * dt
        gpu.power_w = IDLE_W + (BUSY_W - IDLE_W) * util / 100.0
        target = _IDLE_C + (_BUSY_C - _IDLE_C) * util / 100.0
        if gpu.forced_temperature is not None:
            gpu.temperature_c = gpu.forced_temperature
        else:
            gpu.temperature_c += (target - gpu.temperature_c) * (1.0 - math.exp(-dt / _TAU_S))
        gpu.last_time = now

        processes = tuple(
            ProcessSample(proc.pid, proc.memory, 100.0 / busy if computing else 0.0)
            for proc, computing in sorted(live, key=lambda item: item[0].pid)
        )
        return GpuSample(
            index=info.index,
            uuid=info.uuid,
            name=info.name,
            time=now,
            utilization_gpu=util,
            utilization_memory=util * 0.4,
            memory_used=sum(proc.memory for proc, _ in live),
            memory_total=info.memory_total,
            temperature_c=round(gpu.temperature_c, 3),
            power_w=gpu.power_w,
            energy_j=gpu.energy_j,
            sm_clock_mhz=_BUSY_MHZ if busy else _IDLE_MHZ,
            throttle_reasons=gpu.forced_throttle | (frozenset() if busy else {"gpu_idle"}),
            processes=processes,
        )

    def _check_index(self, gpu: int) -> None:
        if not 0 <= gpu < len(self._gpus):
            raise GpuError(f"no simulated GPU {gpu} (this node has {len(self._gpus)})", gpu=gpu)


def _is_computing(proc: _Attached) -> bool | None:
    """True computing, False idle (I/O, gate, stopped), None gone (holds no GPU memory)."""
    if proc.computing is not None:
        return proc.computing
    state = liveness.status(proc.pid)
    if state is None:
        return None
    if state in liveness.STOPPED:
        return False
    channel = proc.channel
    return channel is None or not (channel.io_waiting() or channel.at_gate())
