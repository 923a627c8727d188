"""The Python parts of benchmarks/gpu_check.sh: checks that need a real GPU, with a CPU path.

    python benchmarks/gpu_check.py checkpoint [--size 1GiB] [--dry-run]
    python benchmarks/gpu_check.py exporter [--dry-run]
    python benchmarks/gpu_check.py colocate [--cycles 6 --compute 0.3 --io 0.3] [--dry-run]

Each prints one JSON object. On a GPU node (the default) they use CuPy and NVML; with
``--dry-run`` the same code runs on the CPU: a NumPy state instead of a CuPy one, the
simulated GPU backend instead of NVML, sleeps at the gate instead of CUDA kernels. The
dry-run path is what tests/unit/test_gpu_check.py runs, so the logic is tested without a
GPU; figures from a dry run say nothing about a GPU and are marked ``"dry_run": true``.

- ``checkpoint``: a float32 state of --size saved by ``m27.Checkpointer`` after 1% and
  100% of its chunks changed (until durable, and restore with every hash checked),
  against the baseline ``cupy.asnumpy`` + ``np.save`` + fsync of the same state.
- ``exporter``: one scrape of the Prometheus exporter over the real NVML backend; the
  GPU metric families it must expose, with their values.
- ``colocate``: two real GPU processes through one in-process agent on GPU 0: a primary
  alternating compute and I/O (``m27.io_wait()``) and a guest (declared memory, compute
  at ``m27.gate()``); the GPU's utilization sampled from the backend every 50 ms, alone
  (primary only, the baseline) and co-located. busy fraction = mean utilization / 100.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from m27.checkpoint import Checkpointer
from m27.executors.local import StepLaunch
from m27.gpu import GpuBackend
from m27.node.agent import Agent
from m27.node.lease import AgentLease, run_leased
from m27.policy import PolicyConfig
from m27.store.sqlite import SqliteEventStore
from m27.units import parse_size

GiB = 1024**3

#: The GPU metric families a scrape must expose (m27/monitoring/_metrics.py).
EXPECTED_FAMILIES = (
    "m27_gpu_utilization_ratio",
    "m27_gpu_memory_used_bytes",
    "m27_gpu_memory_total_bytes",
)


def backend(dry_run: bool) -> GpuBackend:
    if dry_run:
        from m27.gpu.sim import SimBackend

        return SimBackend(1, memory_total=16 * GiB)
    from m27.gpu.nvml import NvmlBackend

    return NvmlBackend()


# --- checkpoint ------------------------------------------------------------------------


def _xp(dry_run: bool) -> Any:
    if dry_run:
        return np
    import cupy

    return cupy


def _touch(x: Any, fraction: float, chunk: int, xp: Any) -> None:
    per_chunk = chunk // 4
    count = -(-int(x.size) // per_chunk)
    picked = np.random.default_rng(1).choice(count, max(1, round(count * fraction)), False)
    idx = xp.asarray(np.minimum(picked * per_chunk, int(x.size) - 1))
    x[idx] += 1.0


def _sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def check_checkpoint(size: int, dry_run: bool) -> dict[str, Any]:
    xp = _xp(dry_run)
    x = xp.asarray(np.random.default_rng(0).random(size // 4, dtype=np.float32))
    res: dict[str, Any] = {"size": size, "dry_run": dry_run, "state": xp.__name__}
    with tempfile.TemporaryDirectory(prefix="m27-gpu-ckpt-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        host = xp.asnumpy(x) if xp is not np else x
        np.save(root / "x.npy", host)
        fd = os.open(root / "x.npy", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        res["baseline_np_save_fsync_s"] = time.perf_counter() - began
        del host
        for fraction in (0.01, 1.0):
            directory = root / f"m27-{fraction}"
            ck = Checkpointer(directory, keep_last=2, interval=0)
            ck.save({"x": x}, step=0)
            ck.flush()
            _touch(x, fraction, ck.chunk_size, xp)
            _sync(xp)
            began = time.perf_counter()
            ck.save({"x": x}, step=1)
            stall = time.perf_counter() - began
            ck.flush()
            durable = time.perf_counter() - began
            ck.close()
            began = time.perf_counter()
            with Checkpointer(directory) as reader:
                got = reader.restore()
            _sync(xp)
            restore = time.perf_counter() - began
            assert got is not None, "nothing restored"
            back = got[0]["x"]
            same = bool(xp.array_equal(back, x))
            key = f"{round(fraction * 100)}pct"
            res[key] = {
                "stall_s": stall,
                "durable_s": durable,
                "durable_ratio": durable / res["baseline_np_save_fsync_s"],
                "restore_s": restore,
                "restore_gbps": size / restore / 1e9,
                "restored_type": type(back).__module__.split(".")[0],
                "identical": same,
            }
            del got, back
    res["ok"] = all(res[k]["identical"] for k in ("1pct", "100pct"))
    return res


# --- exporter --------------------------------------------------------------------------


def check_exporter(dry_run: bool) -> dict[str, Any]:
    from prometheus_client import generate_latest

    from m27.monitoring.exporter import Sampler, build_registry

    with tempfile.TemporaryDirectory(prefix="m27-gpu-exporter-") as tmp:
        store = SqliteEventStore(Path(tmp) / "events.db")
        sampler = Sampler(backend(dry_run), store, node="gpu-check")
        try:
            registry = build_registry(sampler)
            began = time.perf_counter()
            text = generate_latest(registry).decode()
            scrape_s = time.perf_counter() - began
        finally:
            sampler.close()
            store.close()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    found = {name: [ln for ln in lines if ln.startswith(name)] for name in EXPECTED_FAMILIES}
    return {
        "dry_run": dry_run,
        "scrape_ms": scrape_s * 1e3,
        "gpu_lines": [ln for ln in lines if ln.startswith("m27_gpu")][:40],
        "missing": [name for name, got in found.items() if not got],
        "ok": all(found.values()),
    }


# --- co-location -----------------------------------------------------------------------

#: A step on the GPU: compute phases (CUDA matmuls, or sleeps on the CPU path) at the
#: gate, I/O phases (a sleep) inside m27.io_wait(); its phases recorded to a file.
WORKLOAD = textwrap.dedent("""\
    import sys, time
    from m27.step import gate, io_wait
    out, cycles, compute, io, dry = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \\
        float(sys.argv[4]), sys.argv[5] == "1"
    if not dry:
        import cupy
        a = cupy.random.random((4096, 4096), dtype=cupy.float32)
    rec = open(out, "w", buffering=1)
    for _ in range(cycles):
        t0 = time.time()
        while time.time() - t0 < compute:
            gate()
            t = time.time()
            if dry:
                time.sleep(0.002)
            else:
                for _ in range(4):
                    a = a @ a
                    a /= cupy.abs(a).max() + 1
                cupy.cuda.Device().synchronize()
            rec.write(f"compute {t} {time.time()}\\n")
        if io > 0:
            with io_wait():
                t = time.time(); time.sleep(io); rec.write(f"io {t} {time.time()}\\n")
""")


def _sample_busy(gpus: GpuBackend, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        sample = gpus.sample(time.time())[0]
        if sample.utilization_gpu is not None:
            out.append(float(sample.utilization_gpu))
        stop.wait(0.05)


def _run_steps(
    steps: dict[str, tuple[int, float, float, int]], dry_run: bool, home: Path
) -> dict[str, Any]:
    """Run `steps` (name -> cycles, compute s, io s, declared gpu memory) through one agent."""
    store = SqliteEventStore(home / "events.db")
    gpus = backend(dry_run)
    agent = Agent(store, gpus, home, config=PolicyConfig(cpu_slots=2))
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    deadline = time.monotonic() + 30
    while agent.book.last_seq == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    lease = AgentLease(store, home, embed=False)
    util: list[float] = []
    sampling = threading.Event()
    sampler = threading.Thread(target=_sample_busy, args=(gpus, sampling, util), daemon=True)
    sampler.start()
    threads, results = [], {}
    began = time.time()
    for name, (cycles, compute, io, memory) in steps.items():
        out = home / f"{name}.txt"
        argv = (sys.executable, "-c", WORKLOAD, str(out), str(cycles), str(compute), str(io))
        launch = StepLaunch(
            "gpu-check", name, (*argv, "1" if dry_run else "0"), log_path=home / f"{name}.log"
        )

        def one(launch: StepLaunch = launch, memory: int = memory, name: str = name) -> None:
            got = run_leased(lease, launch, "gpu", cancel=threading.Event(), gpu_memory=memory)
            results[name] = bool(got and got.ok)

        th = threading.Thread(target=one, daemon=True)
        th.start()
        threads.append(th)
        time.sleep(0.2)  # submission order = queue order: the first is the primary
    for th in threads:
        th.join()
    makespan = time.time() - began
    sampling.set()
    sampler.join()
    stop.set()
    loop.join()
    lease.close()
    agent.close()
    store.close()
    gpus.close()
    return {
        "makespan_s": makespan,
        "busy_fraction": statistics.fmean(util) / 100 if util else None,
        "samples": len(util),
        "succeeded": results,
    }


def check_colocate(cycles: int, compute: float, io: float, dry_run: bool) -> dict[str, Any]:
    primary = (cycles, compute, io, 0)
    guest = (cycles * 4, compute, 0.0, GiB)  # compute only: it fills the primary's I/O
    with tempfile.TemporaryDirectory(prefix="m27-gpu-alone-") as tmp:
        alone = _run_steps({"primary": primary}, dry_run, Path(tmp))
    with tempfile.TemporaryDirectory(prefix="m27-gpu-coloc-") as tmp:
        together = _run_steps({"primary": primary, "guest": guest}, dry_run, Path(tmp))
    ratio = None
    if alone["busy_fraction"] and together["busy_fraction"] is not None:
        ratio = together["busy_fraction"] / alone["busy_fraction"]
    return {
        "dry_run": dry_run,
        "alone": alone,
        "colocated": together,
        "busy_ratio": ratio,
        "ok": all(alone["succeeded"].values()) and all(together["succeeded"].values()),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=("checkpoint", "exporter", "colocate"))
    parser.add_argument("--dry-run", action="store_true", help="CPU path: NumPy, sim GPU")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--compute", type=float, default=0.3)
    parser.add_argument("--io", type=float, default=0.3)
    args = parser.parse_args(argv)
    if args.check == "checkpoint":
        res = check_checkpoint(parse_size(args.size), args.dry_run)
    elif args.check == "exporter":
        res = check_exporter(args.dry_run)
    else:
        res = check_colocate(args.cycles, args.compute, args.io, args.dry_run)
    print(json.dumps(res, indent=2))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
