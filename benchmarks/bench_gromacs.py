"""mdrun wall time with and without m27 capturing its checkpoints (target ratio <= 1.02).

Both sides run the same `gmx mdrun -deffnm simulation -ntmpi 1 -ntomp 1 -cpt <min>` on
the example's SPC/E water box, so GROMACS writes the same checkpoints; the second side
also has the runner's :class:`m27.checkpoint.files.FileGuard` polling and capturing
`simulation.cpt` into the differential store, exactly as a step would. Pairs alternate
their order (plain then captured, captured then plain, ...) so a drift in load hits both;
the figure is the median of the per-pair wall-time ratios, with the range. On a shared
machine wall time swings by far more than 2 % between runs, so the CPU ratio is shown
too: (mdrun's CPU + the capture thread's CPU) / mdrun's CPU without capture.

    python benchmarks/bench_gromacs.py [--nsteps 6000] [--pairs 3] [--cpt 3s] [--json]

Skipped cleanly (exit 0, a note) when `gmx` is not installed.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m27.checkpoint.files import FileGuard
from m27.executors.engines.gromacs import Gromacs
from m27.units import parse_duration

ROOT = Path(__file__).resolve().parents[1]


def _prepare(base: Path, nsteps: int, box: str) -> Path:
    system = base / "system"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gromacs" / "prepare.py"),
         "--nsteps", str(nsteps), "--out", str(system), "--box", box],
        check=True, capture_output=True,
    )  # fmt: skip
    return system


def _mdrun(
    system: Path, work: Path, cpt_min: str, capture: bool
) -> tuple[float, float, float, int]:
    """(wall s of mdrun, CPU s of mdrun, CPU s of the capture thread, captures)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copy(system / "simulation.tpr", work / "simulation.tpr")
    guard = None
    cpu = 0.0
    if capture:
        guard = FileGuard(
            work.parent / f"{work.name}-ckpt",
            work,
            ["simulation.cpt"],
            store=None,
            run_id="bench",
            step="md",
            validate=Gromacs().valid_file,
        )
    argv = ["gmx", "-quiet", "mdrun", "-deffnm", "simulation", "-ntmpi", "1", "-ntomp", "1",
            "-cpt", cpt_min]  # fmt: skip
    cpu_before = _thread_cpu_total()
    child_before = _children_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if guard is not None:
        guard.start(1.0)
    code = proc.wait()
    wall = time.perf_counter() - started
    child = _children_cpu() - child_before
    captures = 0
    if guard is not None:
        guard.stop()
        captures = guard.captures
        cpu = _thread_cpu_total() - cpu_before
    if code != 0:
        raise SystemExit(f"mdrun failed with exit code {code} in {work}")
    return wall, child, cpu, captures


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _thread_cpu_total() -> float:
    """CPU time of this process (the capture thread is the only one working meanwhile)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsteps", type=int, default=6000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cpt", default="3s", help="checkpoint interval (mdrun -cpt)")
    parser.add_argument("--box", default="2.5")
    parser.add_argument("--quick", action="store_true", help="2,000 steps, 2 pairs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("gmx") is None:
        print("bench_gromacs: skipped (gmx not installed: apt-get install gromacs)")
        return 0
    if args.quick:
        args.nsteps, args.pairs = 2000, 2
    cpt_min = f"{parse_duration(args.cpt) / 60:.6g}"
    threading.current_thread().name = "bench"
    with tempfile.TemporaryDirectory(prefix="m27-bench-gmx-") as tmp:
        base = Path(tmp)
        system = _prepare(base, args.nsteps, args.box)
        rows = []
        for i in range(args.pairs):
            # ABBA: every other pair runs the captured side first, so a drift in the
            # machine's load does not always favour one side
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {c: _mdrun(system, base / f"{'captured' if c else 'plain'}{i}", cpt_min, c)
                   for c in order}  # fmt: skip
            (plain, plain_cpu, _, _), (captured, cap_cpu, cpu, n) = got[False], got[True]
            rows.append({"plain_s": plain, "captured_s": captured, "capture_cpu_s": cpu,
                         "mdrun_cpu_plain_s": plain_cpu, "mdrun_cpu_captured_s": cap_cpu,
                         "captures": n, "ratio": captured / plain,
                         "cpu_ratio": (cap_cpu + cpu) / plain_cpu})  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    result = {
        "nsteps": args.nsteps,
        "cpt": args.cpt,
        "pairs": rows,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in rows),
        "capture_cpu_share": statistics.median(r["capture_cpu_s"] / r["captured_s"] for r in rows),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"mdrun {args.nsteps} steps, -cpt {cpt_min} min, {args.pairs} alternating pairs\n")
    print("| pair | plain | with capture | wall ratio | mdrun CPU plain / captured | "
          "captures | capture CPU | CPU ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i + 1} | {r['plain_s']:.2f} s | {r['captured_s']:.2f} s | {r['ratio']:.3f} | "
              f"{r['mdrun_cpu_plain_s']:.2f} s / {r['mdrun_cpu_captured_s']:.2f} s | "
              f"{r['captures']} | {1000 * r['capture_cpu_s']:.0f} ms | "
              f"{r['cpu_ratio']:.3f} |")  # fmt: skip
    print(
        f"\nratio median {result['ratio_median']:.3f} "
        f"(range {result['ratio_min']:.3f}-{result['ratio_max']:.3f}); "
        f"CPU ratio median {result['cpu_ratio_median']:.4f}; "
        f"capture CPU {100 * result['capture_cpu_share']:.2f}% of mdrun's wall time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
