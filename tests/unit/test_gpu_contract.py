"""One contract for every GpuBackend, plus the simulator's own behaviour and detect()."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

import m27.gpu
import m27.gpu.nvml
from m27._exceptions import ConfigError, GpuError
from m27.clock import FakeClock
from m27.gpu import THROTTLE_REASONS, GpuBackend, detect, parse_gpus_env
from m27.gpu.nvml import NvmlBackend
from m27.gpu.sim import BUSY_W, IDLE_W, SimBackend
from m27.step._channel import Channel
from tests.waiting import wait_until

try:  # the fake lives with the NVML tests; the import path depends on pytest's rootdir mode
    from tests.unit.test_gpu_nvml import FakeNvml
except ImportError:  # pragma: no cover
    from test_gpu_nvml import FakeNvml  # type: ignore[no-redef]

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[2]


class GpuBackendContract:
    """Subclasses provide ``make`` (a 3-GPU backend) and ``lose`` (make one GPU fall off)."""

    def make(self) -> GpuBackend:
        raise NotImplementedError

    def lose(self, backend: GpuBackend, index: int) -> None:
        raise NotImplementedError

    @pytest.fixture
    def backend(self) -> Iterator[GpuBackend]:
        b = self.make()
        yield b
        b.close()

    def test_backend_satisfies_the_protocol(self, backend: GpuBackend) -> None:
        assert isinstance(backend, GpuBackend)
        assert backend.kind in ("nvml", "sim")

    def test_devices_are_stable_and_indexed_from_zero(self, backend: GpuBackend) -> None:
        first = backend.devices()
        backend.sample(1.0)
        assert backend.devices() == first
        assert [d.index for d in first] == [0, 1, 2]
        assert len({d.uuid for d in first}) == 3

    def test_sample_returns_one_sample_per_device_in_order(self, backend: GpuBackend) -> None:
        for now in (1.0, 2.0):
            samples = backend.sample(now)
            assert [(s.index, s.uuid, s.name) for s in samples] == [
                (d.index, d.uuid, d.name) for d in backend.devices()
            ]
            assert all(s.time == now and not s.lost for s in samples)

    def test_sample_values_are_in_range_or_unknown(self, backend: GpuBackend) -> None:
        backend.sample(1.0)
        for s in backend.sample(2.0):
            for pct in (s.utilization_gpu, s.utilization_memory):
                assert pct is None or 0.0 <= pct <= 100.0
            assert s.memory_total is None or s.memory_total > 0
            assert s.memory_used is None or s.memory_used >= 0
            for value in (s.temperature_c, s.power_w, s.energy_j, s.sm_clock_mhz):
                assert value is None or value >= 0.0
            assert s.throttle_reasons is None or s.throttle_reasons <= THROTTLE_REASONS
            for p in s.processes:
                assert p.pid > 0
                assert p.sm_util is None or 0.0 <= p.sm_util <= 100.0

    def test_lost_gpu_is_flagged_without_exception(self, backend: GpuBackend) -> None:
        backend.sample(1.0)
        self.lose(backend, 1)
        samples = backend.sample(2.0)
        assert [s.lost for s in samples] == [False, True, False]
        lost = samples[1]
        assert lost.uuid == backend.devices()[1].uuid
        assert (lost.utilization_gpu, lost.memory_used, lost.power_w) == (None, None, None)
        assert samples[0].utilization_gpu is not None

    def test_close_is_idempotent_and_sampling_after_it_raises(self, backend: GpuBackend) -> None:
        backend.close()
        backend.close()
        with pytest.raises(GpuError):
            backend.sample(1.0)


class TestSimBackendContract(GpuBackendContract):
    def make(self) -> GpuBackend:
        return SimBackend(3, memory_total=16 * GiB)

    def lose(self, backend: GpuBackend, index: int) -> None:
        assert isinstance(backend, SimBackend)
        backend.lose(index)


class TestNvmlBackendContract(GpuBackendContract):
    def make(self) -> GpuBackend:
        self.fake = FakeNvml(3)
        return NvmlBackend(nvml=self.fake)

    def lose(self, backend: GpuBackend, index: int) -> None:
        self.fake.devices[index].lost = True


# -- the simulator ------------------------------------------------------------------------


def test_sim_memory_used_is_what_attached_processes_declared() -> None:
    sim = SimBackend(2, memory_total=16 * GiB)
    sim.attach(0, 1001, 3 * GiB)
    sim.attach(0, 1002, 2 * GiB)
    sim.set_computing(1001, True)
    sim.set_computing(1002, False)
    s0, s1 = sim.sample(0.0)
    assert (s0.memory_used, s0.memory_total, s1.memory_used) == (5 * GiB, 16 * GiB, 0)
    sim.detach(0, 1002)
    assert sim.sample(1.0)[0].memory_used == 3 * GiB


def test_sim_utilization_follows_what_the_processes_do() -> None:
    sim = SimBackend(1)
    sim.attach(0, 1001, GiB)
    sim.attach(0, 1002, GiB)
    sim.set_computing(1001, False)
    sim.set_computing(1002, False)
    (idle,) = sim.sample(0.0)
    assert idle.utilization_gpu == 0.0 and idle.throttle_reasons == {"gpu_idle"}
    sim.set_computing(1001, True)
    sim.set_computing(1002, True)
    (busy,) = sim.sample(1.0)
    assert busy.utilization_gpu == 100.0 and busy.throttle_reasons == frozenset()
    assert [p.sm_util for p in busy.processes] == [50.0, 50.0]


def test_sim_energy_and_temperature_follow_a_fake_clock() -> None:
    clock = FakeClock()
    sim = SimBackend(1)
    sim.attach(0, 1001, GiB)
    sim.set_computing(1001, False)
    assert sim.sample(clock.now())[0].energy_j == 0.0
    clock.advance(10)
    sim.set_computing(1001, True)
    s = sim.sample(clock.now())[0]  # the 10 s before were idle
    assert s.energy_j == pytest.approx(IDLE_W * 10) and s.power_w == BUSY_W
    clock.advance(100)
    hot = sim.sample(clock.now())[0]
    assert hot.energy_j == pytest.approx(IDLE_W * 10 + BUSY_W * 100)
    assert hot.temperature_c is not None and 70.0 < hot.temperature_c <= 75.0


def test_sim_dead_process_holds_no_memory() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    sim = SimBackend(1)
    sim.attach(0, child.pid, 4 * GiB)
    (s,) = sim.sample(0.0)
    assert s.memory_used == 0 and s.processes == ()


def test_sim_attach_to_a_missing_gpu_is_an_error() -> None:
    with pytest.raises(GpuError, match="no simulated GPU 5"):
        SimBackend(2).attach(5, 1001, GiB)


def _child_env(channel: Path) -> dict[str, str]:
    env = dict(os.environ, M27_CHANNEL=str(channel), PYTHONPATH=str(ROOT))
    return env


def _read_line(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"child said nothing (so far {data!r})"
        chunk = os.read(fd, 1)
        assert chunk, f"child exited (so far {data!r})"
        data += chunk
    return data.decode().strip()


def _send(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


IO_CHILD = """
import sys
from m27.step import io_wait
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "io":
        with io_wait():
            print("in-io", flush=True)
            sys.stdin.readline()
        print("computing", flush=True)
"""


def test_sim_utilization_follows_a_real_child_using_io_wait(tmp_path: Path) -> None:
    path = tmp_path / "step.chan"
    Channel.create(path).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", IO_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_child_env(path),
    )
    sim = SimBackend(1)
    try:
        assert _read_line(proc) == "ready"
        sim.attach(0, proc.pid, 2 * GiB, channel_path=path)
        assert sim.sample(0.0)[0].utilization_gpu == 100.0
        _send(proc, "io")
        assert _read_line(proc) == "in-io"
        (waiting,) = sim.sample(1.0)
        assert waiting.utilization_gpu == 0.0 and waiting.memory_used == 2 * GiB
        _send(proc, "done")
        assert _read_line(proc) == "computing"
        assert sim.sample(2.0)[0].utilization_gpu == 100.0
        proc.send_signal(signal.SIGSTOP)
        # the kernel marks it stopped asynchronously (when it next schedules it)
        wait_until(lambda: sim.sample(3.0)[0].utilization_gpu == 0.0, what="SIGSTOP to land")
        proc.send_signal(signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
        sim.close()


# -- detect() -----------------------------------------------------------------------------


def test_parse_gpus_env_reads_count_and_memory() -> None:
    assert parse_gpus_env("sim:4") == (4, 80 * GiB)
    assert parse_gpus_env("sim:4x80GiB") == (4, 80 * GiB)
    assert parse_gpus_env("SIM:2x16GiB") == (2, 16 * GiB)


def test_simulated_gpus_of_no_memory_are_refused() -> None:
    # `sim:2x0` listed two GPUs of 0B as if a step could run on them
    with pytest.raises(ConfigError, match=r"'sim:2x0': a simulated GPU needs some memory"):
        parse_gpus_env("sim:2x0")
    assert parse_gpus_env("sim:1x1MiB") == (1, 1024**2)


@pytest.mark.parametrize("value", ["sim:0", "sim:2xlots", "gpu:2", "sim:"])
def test_parse_gpus_env_rejects_bad_values(value: str) -> None:
    with pytest.raises(ConfigError, match="M27_GPUS"):
        parse_gpus_env(value)


def test_parse_gpus_env_caps_the_simulated_count() -> None:
    assert parse_gpus_env("sim:1024") == (1024, 80 * GiB)
    with pytest.raises(ConfigError, match=r"M27_GPUS='sim:99999': at most 1024 simulated GPUs"):
        parse_gpus_env("sim:99999")


def test_detect_sim_from_env() -> None:
    backend = detect({"M27_GPUS": "sim:3x16GiB"})
    assert backend.kind == "sim"
    assert [d.memory_total for d in backend.devices()] == [16 * GiB] * 3


def test_detect_rejects_an_unknown_value() -> None:
    with pytest.raises(ConfigError):
        detect({"M27_GPUS": "cuda"})


def test_detect_forced_nvml_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded)
    monkeypatch.setattr(m27.gpu.nvml, "pynvml", fake)
    with pytest.raises(GpuError, match="Driver Not Loaded"):
        detect({"M27_GPUS": "nvml"})


def test_detect_auto_falls_back_to_two_sim_gpus_with_a_notice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        m27.gpu.nvml, "pynvml", FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    )
    notices: list[str] = []
    backend = detect({}, notice=notices.append)
    assert backend.kind == "sim" and len(backend.devices()) == 2
    assert notices == [
        "m27: no NVIDIA GPU found (NVML: NVML Shared Library Not Found); using 2 simulated"
        " GPUs (set M27_GPUS=sim:N)"
    ]


def test_detect_auto_notice_goes_to_stderr_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(m27.gpu.nvml, "pynvml", FakeNvml(0))
    monkeypatch.setattr(m27.gpu, "_notice_shown", False)
    detect({"M27_GPUS": "auto"})
    detect({})
    err = capsys.readouterr().err
    assert err.count("m27: no NVIDIA GPU found (NVML: no devices)") == 1


def test_detect_auto_uses_nvml_when_it_initialises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m27.gpu.nvml, "pynvml", FakeNvml(2))
    backend = detect({})
    assert backend.kind == "nvml" and len(backend.devices()) == 2


# -- m27 gpus -----------------------------------------------------------------------------


def _gpus(argv: list[str]) -> int:
    import argparse

    from m27.cli.commands import gpus

    parser = argparse.ArgumentParser(prog="m27")
    gpus.register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def test_gpus_command_lists_simulated_gpus_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setenv("M27_HOME", str(tmp_path))
    monkeypatch.setenv("M27_GPUS", "sim:2x16GiB")
    assert _gpus(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["index"], r["uuid"], r["backend"]) for r in rows] == [
        (0, "GPU-sim-0000", "sim"),
        (1, "GPU-sim-0001", "sim"),
    ]
    assert rows[0]["memory_total"] == 16 * GiB and rows[0]["throttle_reasons"] == ["gpu_idle"]
    assert rows[0]["primary"] == [] and rows[0]["guests"] == []
    assert not (tmp_path / "events.db").exists()  # reading GPUs creates no event log


def test_gpus_command_table_has_one_line_per_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_HOME", str(tmp_path))
    monkeypatch.setenv("M27_GPUS", "sim:3")
    assert _gpus(["gpus"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["GPU", "NAME", "UUID", "UTIL"]
    assert len(lines) == 3 and "GPU-sim-0002" in lines[2] and "0B / 80.0GiB" in lines[2]


def test_gpus_command_shows_primary_and_guests_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from m27 import events as ev
    from m27.store.sqlite import open_store

    monkeypatch.setenv("M27_HOME", str(tmp_path))
    monkeypatch.setenv("M27_GPUS", "sim:2")
    store = open_store(tmp_path)
    store.append(
        [
            ev.RunSubmitted(at=0.0, run_id="r1", pipeline="p", spec_path="p.yaml", steps=("md",)),
            ev.RunSubmitted(at=0.0, run_id="r2", pipeline="q", spec_path="q.yaml", steps=("fit",)),
            ev.LeaseGranted(at=1.0, run_id="r1", step="md", gpus=(1,)),
            ev.GuestStarted(at=2.0, run_id="r2", step="fit", gpu=1),
        ]
    )
    store.close()
    assert _gpus(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert (rows[1]["primary"], rows[1]["guests"]) == (["r1/md"], ["r2/fit"])
    assert (rows[0]["primary"], rows[0]["guests"]) == ([], [])
