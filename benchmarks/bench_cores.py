"""Two mdruns side by side, each on every core vs each on its GPU's share (gpu_cpus).

Two GPU steps on a node of two GPUs, both `gmx mdrun -deffnm s` with no thread options
(the seed pipeline's command), started at once through the runner m27 steps use
(`m27.executors.local.run_step`): once as `gpu_cpus = all` starts them (every core each:
mdrun starts one thread per hardware thread and pins them from core 0, both runs onto the
same cores), once as `gpu_cpus = share` does (each under its GPU's share of the cores from
`m27.gpu.cpus.split_cores`, with `-nt N` added by the runner). The figure is the wall
time until both have finished, all / share (higher: sharing is faster), the median of
alternating pairs, and each side's mdrun performance (ns/day) from its log.

    python benchmarks/bench_cores.py [--nsteps 3000] [--pairs 3] [--json]

Skipped cleanly (exit 0, a note) when `gmx` is not installed. On a GPU node the same
holds for the CPU part of GPU runs; this measures the CPU-only mdrun the example runs
where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m27.executors.local import StepLaunch, StepResult, run_step
from m27.gpu.cpus import core_of, node_cpus, split_cores
from m27.store.memory import MemoryEventStore

ROOT = Path(__file__).resolve().parents[1]
GPUS = 2


def _prepare(base: Path, nsteps: int) -> Path:
    system = base / "system"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gromacs" / "prepare.py"),
         "--nsteps", str(nsteps), "--out", str(system), "--box", "2.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return system


def _side(system: Path, work: Path, shares: dict[int, tuple[int, ...]] | None) -> dict[str, object]:
    """Both mdruns at once, each through run_step; wall s until both ended, ns/day each."""
    if work.exists():
        shutil.rmtree(work)
    results: list[StepResult | None] = [None] * GPUS
    threads = []
    for gpu in range(GPUS):
        folder = work / f"gpu{gpu}"
        folder.mkdir(parents=True)
        shutil.copy(system / "simulation.tpr", folder / "s.tpr")
        launch = StepLaunch(
            run_id="bench",
            step=f"md{gpu}",
            argv=("gmx", "-quiet", "mdrun", "-deffnm", "s"),
            workdir=folder,
            gpus=(gpu,),
            cpus=shares[gpu] if shares else (),
            log_path=folder / "step.log",
        )

        def body(i: int = gpu, launch: StepLaunch = launch) -> None:
            results[i] = run_step(launch, MemoryEventStore())

        threads.append(threading.Thread(target=body))
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    for gpu, result in enumerate(results):
        if result is None or not result.ok:
            raise SystemExit(f"mdrun {gpu} failed: {result and result.reason}; see {work}")
    ns_day, counts = [], []
    for gpu in range(GPUS):
        log = (work / f"gpu{gpu}" / "s.log").read_text()
        found = re.search(r"^Performance:\s+([\d.]+)", log, re.M)
        ns_day.append(float(found.group(1)) if found else float("nan"))
        ranks = re.search(r"^Using (\d+) MPI threads?", log, re.M)
        omp = re.search(r"^Using (\d+) OpenMP threads?", log, re.M)
        counts.append(int(ranks.group(1)) * int(omp.group(1)) if ranks and omp else 0)
    return {"wall_s": wall, "ns_per_day": ns_day, "threads": counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsteps", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 steps, 2 pairs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("gmx") is None:
        print("bench_cores: skipped (gmx not installed: apt-get install gromacs)")
        return 0
    if args.quick:
        args.nsteps, args.pairs = 1000, 2
    cpus = node_cpus()
    shares = split_cores(cpus, GPUS, core=core_of)
    rows = []
    with tempfile.TemporaryDirectory(prefix="m27-bench-cores-") as tmp:
        base = Path(tmp)
        system = _prepare(base, args.nsteps)
        for i in range(args.pairs):
            # ABBA: every other pair runs the shared side first
            order = ("all", "share") if i % 2 == 0 else ("share", "all")
            got = {
                mode: _side(system, base / f"{mode}{i}", shares if mode == "share" else None)
                for mode in order
            }
            rows.append({**{m: got[m] for m in ("all", "share")},
                         "ratio": got["all"]["wall_s"] / got["share"]["wall_s"]})  # type: ignore[operator]  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    result = {
        "nsteps": args.nsteps,
        "cpus": list(cpus),
        "shares": {str(g): list(c) for g, c in shares.items()},
        "pairs": rows,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"two mdruns of {args.nsteps} steps at once on {len(cpus)} cores, {GPUS} GPUs' shares "
          f"{', '.join(f'GPU {g}: {list(c)}' for g, c in shares.items())}\n")  # fmt: skip
    print("| pair | every core each | its GPU's share | all / share | ns/day all | ns/day share |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        a, s = r["all"], r["share"]
        print(f"| {i + 1} | {a['wall_s']:.2f} s | {s['wall_s']:.2f} s | {r['ratio']:.2f} | "
              f"{' + '.join(f'{x:.1f}' for x in a['ns_per_day'])} | "
              f"{' + '.join(f'{x:.1f}' for x in s['ns_per_day'])} |")  # fmt: skip
    print(f"\nall / share median {result['ratio_median']:.2f} "
          f"(range {result['ratio_min']:.2f}-{result['ratio_max']:.2f}): above 1, the shared "
          "cores finish both runs sooner")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
