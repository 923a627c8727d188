"""How long `m27 run` of a one-step `true` pipeline takes once the node service runs,
as a ratio to `m27 --version` (the interpreter and m27's own imports) in the same run.

A fresh ``M27_HOME`` is used: the first run starts the node service (its Prefect server on
SQLite) and is reported apart as the cold start; once the service's warm runner is up
(``$M27_HOME/warm.json``), `--runs` warm runs and as many `m27 --version` calls
alternate, and the medians are compared. A warm run is a thin client: the run itself is
a child forked by the warm runner, so its CPU is counted too (the runner's reaped
children, from psutil) and reported both apart and added to the client's. Wall time and CPU time
(user + system of the command and its children) are both reported: on a shared machine
the CPU ratio is the steadier figure. ``PREFECT_API_URL`` is ignored (unset for the
children): this measures the node's own server. The service is stopped at the end.

    python benchmarks/bench_startup.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PIPELINE = "name: bench-startup\npipeline:\n  - name: t\n    type: cpu\n    command: 'true'\n"


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env["M27_HOME"] = str(home)
    (home / "no-m2config").write_text("")
    env["M27_CONFIG"] = str(home / "no-m2config")
    env.setdefault("M27_GPUS", "sim:1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _timed(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall seconds of one command; its CPU seconds (user + system) appended to `cpu`."""
    c0 = _cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if cpu is not None:
        cpu.append(_cpu() - c0)
    return took


def _runner_cpu(home: Path) -> float:
    """CPU seconds of the warm runner's reaped children (the forked runs) so far."""
    import psutil

    pid = json.loads((home / "warm.json").read_text())["pid"]
    times = psutil.Process(pid).cpu_times()
    return float(times.children_user + times.children_system)


def _server_cpu(home: Path) -> float:
    """CPU seconds the node's Prefect server has used so far (it answers every run)."""
    import psutil

    pid = json.loads((home / "service.json").read_text())["prefect_pid"]
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _wait_runner(home: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not (home / "warm.json").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm runner did not start; see {home / 'runner.log'}")
        time.sleep(0.2)


def measure(runs: int) -> dict[str, object]:
    m27 = [sys.executable, "-m", "m27.cli"]
    with tempfile.TemporaryDirectory(prefix="m27-bench-startup-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        spec = Path(tmp) / "one.yaml"
        spec.write_text(PIPELINE)
        env = _env(home)
        run = [*m27, "run", str(spec), "--plain", "--quiet"]
        try:
            cold = _timed(run, env)
            _wait_runner(home)
            warm: list[float] = []
            version: list[float] = []
            warm_cpu: list[float] = []
            child_cpu: list[float] = []
            version_cpu: list[float] = []
            server0 = _server_cpu(home)
            for _ in range(runs):
                version.append(_timed([*m27, "--version"], env, version_cpu))
                before = _runner_cpu(home)
                warm.append(_timed(run, env, warm_cpu))
                child_cpu.append(_runner_cpu(home) - before)
            server = (_server_cpu(home) - server0) / runs
        finally:
            subprocess.run([*m27, "agent", "stop"], env=env, capture_output=True, timeout=120)
    w, v = statistics.median(warm), statistics.median(version)
    vc = statistics.median(version_cpu)
    total = statistics.median([a + b for a, b in zip(warm_cpu, child_cpu, strict=True)])
    return {
        "runs": runs,
        "cold_run_s": round(cold, 3),
        "warm_run_s": round(w, 3),
        "warm_run_range_s": [round(min(warm), 3), round(max(warm), 3)],
        "warm_runs_s": [round(x, 3) for x in warm],
        "version_s": round(v, 3),
        "version_range_s": [round(min(version), 3), round(max(version), 3)],
        "ratio": round(w / v, 2),
        "warm_client_cpu_s": round(statistics.median(warm_cpu), 3),
        "warm_child_cpu_s": round(statistics.median(child_cpu), 3),
        "warm_run_cpu_s": round(total, 3),
        "version_cpu_s": round(vc, 3),
        "server_cpu_per_run_s": round(server, 3),
        "client_cpu_ratio": round(statistics.median(warm_cpu) / vc, 2),
        "cpu_ratio": round(total / vc, 2),
        "loadavg": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="warm runs (default 5)")
    parser.add_argument("--quick", action="store_true", help="3 warm runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = measure(3 if args.quick else args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("| what | median | range |")
    print("|---|---|---|")
    print(f"| `m27 --version` | {result['version_s']} s | {result['version_range_s']} |")
    print(
        f"| warm `m27 run` (1 step `true`) | {result['warm_run_s']} s | "
        f"{result['warm_run_range_s']} |"
    )
    print(f"| cold `m27 run` (starts the node service) | {result['cold_run_s']} s | one run |")
    print(f"\nwarm run / --version: {result['ratio']}x wall, {result['cpu_ratio']}x CPU")
    print(
        f"(CPU: run {result['warm_run_cpu_s']} s = client {result['warm_client_cpu_s']} s + "
        f"forked run {result['warm_child_cpu_s']} s; --version {result['version_cpu_s']} s; "
        f"client alone {result['client_cpu_ratio']}x; the node's Prefect server "
        f"{result['server_cpu_per_run_s']} s per run, not counted; load {result['loadavg']:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
