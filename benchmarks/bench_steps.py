"""Per-step overhead: `m27 run` of a chain of `true` steps vs a bare Prefect flow of the same.

    python benchmarks/bench_steps.py [--steps 50] [--json]

One `prefect server start` (SQLite, in a temp PREFECT_HOME) serves both sides, each run
as its own process with PREFECT_API_URL pointing at it and M27_HOME in a temp dir:

- baseline: a Prefect flow of --steps tasks, each waiting for the previous one and
  running ``subprocess.run(["true"])`` (what a hand-written Prefect pipeline does);
- m27: ``m27 run`` of a generated pipeline file with --steps `cpu` steps ``command: true``,
  each depending on the previous one.

Per step is the slope: (end of the last step - end of the first) / (steps - 1), from the
tasks' own end times (baseline) and the StepSucceeded events (m27), so process start,
imports and the flow's exit are not counted; the whole command's wall time is shown too.
Target (issue 16): m27 per step <= baseline per step + 20 ms.

With ``--output-lines N`` (default 100,000; 0 skips it) it also times a chatty step:
``seq 1 N`` as one `m27 run` step (printed with --plain, its output in Prefect's logs up
to ``prefect_log_limit``), from its StepStarted to its StepSucceeded, against the same
command read to its end through a pipe by this process (the program's own speed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_EXTRA_MS = 20.0

BARE_FLOW = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(cache_policy=NO_CACHE, persist_result=False)
    def step(i):
        subprocess.run(["true"], check=True)
        return time.time()

    @flow(name="bare-chain", log_prints=False)
    def chain(n):
        futures = []
        for i in range(n):
            futures.append(step.submit(i, wait_for=futures[-1:]))
        return [f.result() for f in futures]

    ends = chain(int(sys.argv[1]))
    print("ENDS " + json.dumps(ends))
    """
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"prefect server exited: see {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("prefect server did not become healthy in 180 s")


def pipeline_file(directory: Path, steps: int) -> Path:
    lines = ["name: true-chain", "pipeline:"]
    for i in range(steps):
        lines += [f"  - name: s{i:03d}", "    type: cpu", "    command: 'true'"]
        if i:
            lines.append(f"    depends_on: [s{i - 1:03d}]")
    path = directory / "pipeline.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def slope(ends: list[float]) -> float:
    ends = sorted(ends)
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def run_bare(env: dict[str, str], work: Path, steps: int) -> dict[str, float]:
    script = work / "bare_flow.py"
    script.write_text(BARE_FLOW)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(script), str(steps)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - started
    line = next((x for x in done.stdout.splitlines() if x.startswith("ENDS ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"bare Prefect flow failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    ends = json.loads(line[5:])
    return {"wall_s": wall, "per_step_s": slope(ends)}


def m27_argv() -> list[str]:
    m27 = Path(sys.executable).with_name("m27")
    return [str(m27)] if m27.exists() else [sys.executable, "-m", "m27.cli.main"]


def stop_service(env: dict[str, str]) -> None:
    """Stop the node service the m27 runs started in this M27_HOME (it would otherwise
    idle for `service_idle` in a deleted folder)."""
    subprocess.run(
        [*m27_argv(), "agent", "stop"], env=env, capture_output=True, timeout=120, check=False
    )


def run_m27(env: dict[str, str], work: Path, steps: int) -> dict[str, Any]:
    from m27.events import StepSucceeded
    from m27.store.sqlite import SqliteEventStore

    path = pipeline_file(work, steps)
    argv = m27_argv()
    started = time.perf_counter()
    done = subprocess.run(
        [*argv, "run", str(path), "--quiet"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"m27 run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with SqliteEventStore(Path(env["M27_HOME"]) / "events.db") as store:
        events = [r.event for r in store.read()]
    ends = [e.at for e in events if isinstance(e, StepSucceeded)]
    if len(ends) != steps:
        raise SystemExit(f"m27 run recorded {len(ends)} StepSucceeded, expected {steps}")
    return {"wall_s": wall, "per_step_s": slope(ends), "phases_ms": phases(events)}


def run_chatty(env: dict[str, str], work: Path, lines: int) -> dict[str, float]:
    """`seq 1 N` as an m27 step (started -> succeeded) and through a bare pipe, in seconds."""
    from m27.events import StepStarted, StepSucceeded
    from m27.store.sqlite import SqliteEventStore

    started = time.perf_counter()
    subprocess.run(["seq", "1", str(lines)], stdout=subprocess.PIPE, check=True)
    bare = time.perf_counter() - started
    path = work / "chatty.yaml"
    path.write_text(
        f"name: chatty\npipeline:\n  - {{name: spam, type: cpu, command: seq 1 {lines}}}\n"
    )
    done = subprocess.run(
        [*m27_argv(), "run", str(path), "--plain"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    shown = sum(1 for line in done.stdout.splitlines() if " [spam] " in line)
    if done.returncode or shown != lines:
        raise SystemExit(f"chatty m27 run failed ({shown} lines shown):\n{done.stderr[-3000:]}")
    with SqliteEventStore(Path(env["M27_HOME"]) / "events.db") as store:
        ats = {
            type(r.event).__name__: r.event.at
            for r in store.read()
            if isinstance(r.event, StepStarted | StepSucceeded) and r.event.step == "spam"
        }
    return {"m27_s": ats["StepSucceeded"] - ats["StepStarted"], "bare_s": bare}


#: A step's events in the order they happen; the gaps between them are its phases.
PHASES = ("StepQueued", "StepRequested", "LeaseGranted", "StepStarted", "StepSucceeded")


def phases(events: list[Any]) -> dict[str, float]:
    """Median ms from each event of a step to the next (and to the next step's queueing)."""
    import statistics

    at: dict[str, dict[str, float]] = {}
    for e in events:
        step = getattr(e, "step", None)
        if step is not None and e.kind in (*PHASES, "LeaseReleased"):
            at.setdefault(step, {}).setdefault(e.kind, e.at)
    order = sorted(at, key=lambda s: at[s].get("StepQueued", 0.0))
    gaps: dict[str, list[float]] = {}
    for i, step in enumerate(order):
        seen = at[step]
        for a, b in itertools.pairwise(PHASES):
            if a in seen and b in seen:
                gaps.setdefault(f"{a}->{b}", []).append((seen[b] - seen[a]) * 1000)
        if i + 1 < len(order) and "StepSucceeded" in seen:
            nxt = at[order[i + 1]].get("StepQueued")
            if nxt is not None:
                gaps.setdefault("StepSucceeded->next StepQueued", []).append(
                    (nxt - seen["StepSucceeded"]) * 1000
                )
    return {k: round(statistics.median(v), 2) for k, v in gaps.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="a chain of 10")
    parser.add_argument(
        "--output-lines", type=int, default=100_000, help="lines of the chatty step (0: skip it)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    steps = 10 if args.quick else args.steps
    root = Path(tempfile.mkdtemp(prefix="m27-bench-steps-"))
    (root / "no-m2config").write_text("")  # empty settings (a missing M27_CONFIG file errs)
    env = {
        **os.environ,
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "M27_HOME": str(root / "m27home"),
        "M27_CONFIG": str(root / "no-m2config"),
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    (root / "no-m2config").write_text("")  # an empty settings file: the defaults
    server, url = start_server(env, root / "server.log")
    env["PREFECT_API_URL"] = url
    res: dict[str, Any] = {"steps": steps}
    try:
        # Warm the server (first flow run creates tables, caches): not measured.
        run_bare(env, root, 2)
        bare = run_bare(env, root, steps)
        m27 = run_m27(env, root, steps)
        chatty = run_chatty(env, root, args.output_lines) if args.output_lines > 0 else None
    finally:
        stop_service(env)
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)
    extra_ms = (m27["per_step_s"] - bare["per_step_s"]) * 1000
    res.update(
        {
            "baseline": "bare Prefect flow, one task per step running subprocess true",
            "per_step_ms": m27["per_step_s"] * 1000,
            "per_step_ms_baseline": bare["per_step_s"] * 1000,
            "ratio": m27["per_step_s"] / bare["per_step_s"],
            "extra_ms_per_step": extra_ms,
            "target_extra_ms": TARGET_EXTRA_MS,
            "ok": extra_ms <= TARGET_EXTRA_MS,
            "wall_s": m27["wall_s"],
            "wall_s_baseline": bare["wall_s"],
            "m27_phases_ms": m27["phases_ms"],
        }
    )
    if chatty is not None:
        res["chatty_step"] = {
            "lines": args.output_lines,
            "baseline": "the same `seq` read through a pipe by the benchmark",
            "m27_s": chatty["m27_s"],
            "baseline_s": chatty["bare_s"],
            "ratio": chatty["m27_s"] / chatty["bare_s"],
            "lines_per_s": args.output_lines / chatty["m27_s"],
        }
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"\nchain of {steps} `true` steps, one prefect server (SQLite), {time.strftime('%F %H:%M')}"
    )
    print("\n| metric | m27 run | bare Prefect | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| per step (slope) | {res['per_step_ms']:.1f} ms | {res['per_step_ms_baseline']:.1f} ms "
        f"| {res['ratio']:.2f}x (+{extra_ms:.1f} ms) | <= +{TARGET_EXTRA_MS:.0f} ms |"
    )
    print(
        f"| whole command | {res['wall_s']:.1f} s | {res['wall_s_baseline']:.1f} s "
        f"| {res['wall_s'] / res['wall_s_baseline']:.2f}x | |"
    )
    if chatty is not None:
        c = res["chatty_step"]
        print(
            f"| chatty step, seq 1 {c['lines']} (started -> succeeded) | {c['m27_s'] * 1000:.0f} ms"
            f" ({c['lines_per_s']:,.0f} lines/s) | {c['baseline_s'] * 1000:.0f} ms (bare pipe)"
            f" | {c['ratio']:.1f}x | |"
        )
    print("\nm27 per-step phases, median ms: " + json.dumps(res["m27_phases_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
