"""Checkpoint benchmark: m27's differential saves against full np.save and h5py saves.

    python benchmarks/bench_checkpoint.py [--size 1GiB | --quick] [--dir DIR] [--no-gzip]

A float32 state of --size (default 1 GiB) is saved after 1% and after 100% of its chunks
changed. Columns: save stall (until save() returns), until durable (fsynced and committed),
bytes written, restore time (page cache warm: this measures the code, not the disk), and
extra memory at peak as % of the state (tracemalloc over a separate untimed save, plus
the buffers the checkpointer already held before it).
A last m27 row stores everything raw (compression_level=0): the disk-bound path.
The 100% rows save --full-repeats times (default 3), each save beside an np.save + fsync
of the same state (in turns just before and just after it): the disk's speed drifts
between runs, so each row's "x np.save+fsync" is the median of those paired ratios.
The 1% rows repeat the measured save (--repeats, default 5) and give the median stall, the
fastest one, and the process CPU time of the median save: on a shared machine the wall
time is mostly waiting for a core, the CPU time is what the code costs. The "xxh3 floor"
line is one bare xxh3 pass over the state on the same threads in the same run (one call
per slice, nothing else): no save that hashes every byte can stall less than that.
--one-thread-too adds the m27 rows with threads=1, to see what the threads buy;
--python-hashing-too adds a 1% row hashed without the compiled m27.checkpoint._spans,
as an install without a C compiler runs (the targets are checked on the default rows).
Prints a Markdown table (or, with --json, the rows and the issue-16 targets as JSON);
figures are recorded in benchmarks/README.md. Ratios are against np.save + fsync of the
same state in the same run: until durable <= 1.1x for 100% changed, restore >= 1 GB/s for
every row, 1% stall <= 40 ms per GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from m27.checkpoint import Checkpointer, _chunks
from m27.checkpoint._parallel import default_threads
from m27.units import format_size, parse_size

Row = dict[str, Any]


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def touch(x: np.ndarray[Any, Any], fraction: float, chunk: int, rng: np.random.Generator) -> None:
    """Change one value in `fraction` of the chunks (chosen at random)."""
    per_chunk = chunk // x.itemsize
    count = -(-x.size // per_chunk)
    picked = rng.choice(count, size=max(1, round(count * fraction)), replace=False)
    x[np.minimum(picked * per_chunk, x.size - 1)] += 1.0


def measure_memory(run: Callable[[], None], state_bytes: int) -> float:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return 100.0 * max(0, peak - before) / state_bytes


def bench_m27(
    x: np.ndarray[Any, Any],
    fraction: float,
    root: Path,
    rng: np.random.Generator,
    level: int = 3,
    threads: int | None = None,
    force_zstd: bool = False,
    repeats: int = 1,
    paired: Callable[[], float] | None = None,
    python_hashing: bool = False,
) -> Row:
    native = _chunks._native
    if python_hashing:
        _chunks._native = None
    try:
        row = _bench_m27(x, fraction, root, rng, level, threads, force_zstd, repeats, paired)
    finally:
        _chunks._native = native
    if python_hashing:
        row["method"] += ", Python hashing"
    return row


def _bench_m27(
    x: np.ndarray[Any, Any],
    fraction: float,
    root: Path,
    rng: np.random.Generator,
    level: int,
    threads: int | None,
    force_zstd: bool,
    repeats: int,
    paired: Callable[[], float] | None,
) -> Row:
    directory = root / f"m27-{fraction}"
    ck = Checkpointer(directory, keep_last=2, interval=0, compression_level=level, threads=threads)
    if force_zstd:  # as if the disk were slow: the codec then always compresses
        ck._writer.speed.disk_bps = 1e6
        ck._writer.speed.written = lambda nbytes, seconds: None  # type: ignore[method-assign]
    ck.save({"x": x}, step=0)
    ck.flush()
    touch(x, fraction, ck.chunk_size, rng)  # warm-up save: buffers reach steady state
    ck.save({"x": x}, step=1)
    ck.flush()
    stalls: list[tuple[float, float, float]] = []  # (wall, CPU, until durable)
    pairs: list[tuple[float, float]] = []  # (until durable, np.save + fsync just before/after)
    for step in range(2, 2 + repeats):
        touch(x, fraction, ck.chunk_size, rng)
        before = paired() if paired is not None and step % 2 == 0 else None
        cpu = time.process_time()
        started = time.perf_counter()
        ck.save({"x": x}, step=step)
        stall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        ck.flush()
        stalls.append((stall, cpu, time.perf_counter() - started))
        if paired is not None:
            pairs.append((stalls[-1][2], before if before is not None else paired()))
    stall, stall_cpu, durable = sorted(stalls)[len(stalls) // 2]
    newest = max(directory.glob("ckpt-*.json"))
    pack = newest.with_suffix(".pack")
    written = newest.stat().st_size + (pack.stat().st_size if pack.exists() else 0)

    def again() -> None:
        touch(x, fraction, ck.chunk_size, rng)
        ck.save({"x": x}, step=2 + repeats)
        ck.flush()

    held = ck.memory_bytes  # staging buffers kept from the warm-up save, and fingerprints
    memory = measure_memory(again, x.nbytes) + 100.0 * held / x.nbytes
    ck.close()
    started = time.perf_counter()
    with Checkpointer(directory, keep_last=2, threads=threads) as reader:
        got = reader.restore()
    restore = time.perf_counter() - started
    assert got is not None and np.array_equal(got[0]["x"], x), "restore gave other data"
    del got
    shutil.rmtree(directory)
    label = "m27 Checkpointer" if level == 3 else f"m27 Checkpointer, level {level}"
    if force_zstd:
        label = "m27 Checkpointer, zstd forced (shuffled)"
    row: Row = {}
    if pairs:
        # the disk's speed drifts (here one np.save + fsync of 1 GiB took 0.7 s, the next
        # 3.1 s): each save is compared with a baseline write next to it, in turns before
        # and after, and the row keeps the median of those ratios
        ratios = sorted(ours / theirs for ours, theirs in pairs)
        row["durable_ratio"] = ratios[len(ratios) // 2]
        row["baseline_durable"] = sorted(theirs for _, theirs in pairs)[len(pairs) // 2]
        durable = sorted(ours for ours, _ in pairs)[len(pairs) // 2]
    return row | {
        "changed": f"{fraction:.0%}",
        "nbytes": x.nbytes,
        "method": label + ("" if threads is None else f", {threads} thread(s)"),
        "stall": stall,
        "stall_min": min(s[0] for s in stalls),
        "stall_cpu": stall_cpu,
        "repeats": repeats,
        "durable": durable,
        "written": written,
        "restore": restore,
        "memory": memory,
    }


def npsave_durable(x: np.ndarray[Any, Any], root: Path) -> float:
    """Seconds for one np.save + fsync of `x` to a new file (deleted after)."""
    path = root / "paired.npy"
    started = time.perf_counter()
    np.save(path, x)
    fsync_file(path)
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def bench_npsave(x: np.ndarray[Any, Any], root: Path) -> Row:
    path = root / "state.npy"

    def save() -> None:
        np.save(path, x)
        fsync_file(path)

    started = time.perf_counter()
    np.save(path, x)
    stall = time.perf_counter() - started
    fsync_file(path)
    durable = time.perf_counter() - started
    written = path.stat().st_size
    memory = measure_memory(save, x.nbytes)
    started = time.perf_counter()
    back = np.load(path)
    restore = time.perf_counter() - started
    assert np.array_equal(back, x)
    del back
    path.unlink()
    return {
        "changed": "full",
        "nbytes": x.nbytes,
        "method": "np.save + fsync",
        "stall": stall,
        "durable": durable,
        "written": written,
        "restore": restore,
        "memory": memory,
    }


def bench_h5py(x: np.ndarray[Any, Any], root: Path, gzip: bool) -> Row | None:
    try:
        import h5py
    except ImportError:
        return None
    path = root / "state.h5"
    options: dict[str, Any] = {"compression": "gzip", "compression_opts": 1} if gzip else {}

    def save() -> None:
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=x, **options)
        fsync_file(path)

    started = time.perf_counter()
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **options)
    stall = time.perf_counter() - started
    fsync_file(path)
    durable = time.perf_counter() - started
    written = path.stat().st_size
    memory = measure_memory(save, x.nbytes) if not gzip else float("nan")
    started = time.perf_counter()
    with h5py.File(path, "r") as f:
        back = f["x"][...]
    restore = time.perf_counter() - started
    assert np.array_equal(back, x)
    del back
    path.unlink()
    name = "h5py gzip=1 + fsync" if gzip else "h5py + fsync"
    return {
        "changed": "full",
        "nbytes": x.nbytes,
        "method": name,
        "stall": stall,
        "durable": durable,
        "written": written,
        "restore": restore,
        "memory": memory,
    }


def xxh3_floor(x: np.ndarray[Any, Any], threads: int) -> float:
    """Best of 3: one bare xxh3 pass over `x` in `threads` slices (xxh3 releases the GIL)."""
    view = memoryview(x.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    part = -(-len(view) // threads)
    slices = [view[i : i + part] for i in range(0, len(view), part)]
    best = float("inf")
    for _ in range(3):
        workers = [
            threading.Thread(target=xxhash.xxh3_64_intdigest, args=(piece,)) for piece in slices
        ]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = min(best, time.perf_counter() - started)
    return best


def fmt(row: Row) -> str:
    memory = "n/a" if row["memory"] != row["memory"] else f"{row['memory']:.1f}%"
    return (
        f"| {row['method']} | {row['changed']} | {row['stall'] * 1000:.1f} ms | "
        f"{row['durable'] * 1000:.0f} ms | {row['durable_ratio']:.2f}x | "
        f"{format_size(row['written'])} | {row['restore'] * 1000:.0f} ms | "
        f"{row['restore_gbps']:.2f} GB/s | {memory} |"
    )


def with_ratios(rows: list[Row], baseline: Row) -> list[Row]:
    """Each row's durable time as a multiple of np.save + fsync, and restore in GB/s."""
    for row in rows:
        row.setdefault("durable_ratio", row["durable"] / baseline["durable"])
        row["restore_gbps"] = row["nbytes"] / row["restore"] / 1e9
        row["restore_ratio"] = row["restore"] / baseline["restore"]  # vs np.load
        row["stall_ms_per_gib"] = row["stall"] * 1000 * (1 << 30) / row["nbytes"]
    return rows


def targets(rows: list[Row]) -> dict[str, Any]:
    """The issue-16 targets, checked on the default m27 rows of this run."""
    m27 = [r for r in rows if r["method"].startswith("m27") and "Python" not in r["method"]]
    full = [r for r in m27 if r["changed"] == "100%"]
    one = [r for r in m27 if r["changed"] == "1%"]
    return {
        "durable_100_ratio_max": 1.1,
        "durable_100_ok": all(r["durable_ratio"] <= 1.1 for r in full),
        "restore_gbps_min": 1.0,
        "restore_ok": all(r["restore_gbps"] >= 1.0 for r in m27),
        "stall_1_ms_per_gib_max": 40.0,
        "stall_1_ok": all(r["stall_ms_per_gib"] <= 40.0 for r in one),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="state size (default 1GiB)")
    parser.add_argument("--quick", action="store_true", help="same as --size 256MiB")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--no-gzip", action="store_true", help="skip h5py gzip (38 MB/s)")
    parser.add_argument(
        "--threads", type=int, default=None, help="m27 threads (default: cores, at most 4)"
    )
    parser.add_argument(
        "--one-thread-too", action="store_true", help="also run m27 rows with threads=1"
    )
    parser.add_argument(
        "--python-hashing-too",
        action="store_true",
        help="also a 1%% row without the compiled chunk hasher (as built without gcc)",
    )
    parser.add_argument("--json", action="store_true", help="print rows and targets as JSON")
    parser.add_argument(
        "--zstd-too", action="store_true", help="also a row with compression forced on"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="measured saves of the 1%% rows (median)"
    )
    parser.add_argument(
        "--full-repeats",
        type=int,
        default=3,
        help="measured saves of the 100%% rows, each beside an np.save + fsync (median ratio)",
    )
    args = parser.parse_args()
    size = parse_size("256MiB" if args.quick else args.size)
    root = Path(tempfile.mkdtemp(prefix="m27-bench-", dir=args.dir))
    rng = np.random.default_rng(0)
    x = rng.random(size // 4, dtype=np.float32)
    missing: list[str] = []
    try:
        baseline = bench_npsave(x, root)
        floor = xxh3_floor(x, args.threads or default_threads())
        rows = [bench_m27(x, 0.01, root, rng, threads=args.threads, repeats=args.repeats)]
        full = {"repeats": args.full_repeats, "paired": lambda: npsave_durable(x, root)}
        rows.append(bench_m27(x, 1.0, root, rng, threads=args.threads, **full))
        if args.python_hashing_too:
            rows.append(
                bench_m27(
                    x,
                    0.01,
                    root,
                    rng,
                    threads=args.threads,
                    repeats=args.repeats,
                    python_hashing=True,
                )
            )
        if args.one_thread_too:
            rows.append(bench_m27(x, 0.01, root, rng, threads=1, repeats=args.repeats))
            rows.append(bench_m27(x, 1.0, root, rng, threads=1, **full))
        rows.append(bench_m27(x, 1.0, root, rng, level=0, threads=args.threads, **full))
        if args.zstd_too:
            forced = bench_m27(x, 1.0, root, rng, threads=args.threads, force_zstd=True, **full)
            rows.append(forced)
        rows.append(baseline)
        for gzip in (False, True) if not args.no_gzip else (False,):
            row = bench_h5py(x, root, gzip)
            if row:
                rows.append(row)
            else:
                missing.append(f"| h5py{' gzip' * gzip} | - | h5py not installed | | | | | | |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with_ratios(rows, baseline)
    threads = args.threads or default_threads()
    if args.json:
        out = {
            "size": size,
            "threads": threads,
            "native_hashing": _chunks.native_hashing(),
            "xxh3_floor_ms_per_gib": floor * 1000 * (1 << 30) / size,
            "rows": rows,
            "targets": targets(rows),
        }
        print(json.dumps(out, indent=2))
        return
    print(
        f"\nfloat32 state of {format_size(size)}, chunk 128 KiB, zstd level 3 unless said, "
        f"{os.cpu_count()} CPUs, m27 threads {threads}, chunk hashing "
        f"{'compiled' if _chunks.native_hashing() else 'Python (no compiled _spans)'}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print(
        "| method | changed | save stall | until durable | x np.save+fsync | bytes written "
        "| restore | restore GB/s | extra memory |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join([fmt(r) for r in rows] + missing))
    for row in rows:
        if row.get("repeats", 1) > 1:
            print(
                f"\n{row['method']}, {row['changed']}: stall median {row['stall'] * 1000:.0f} ms "
                f"(fastest {row['stall_min'] * 1000:.0f} ms, CPU {row['stall_cpu'] * 1000:.0f} ms)"
                f" over {row['repeats']} saves"
            )
        if "baseline_durable" in row:
            print(
                f"{row['method']}, {row['changed']}: until durable median "
                f"{row['durable'] * 1000:.0f} ms, np.save + fsync beside it median "
                f"{row['baseline_durable'] * 1000:.0f} ms, median ratio "
                f"{row['durable_ratio']:.2f}x"
            )
    print(f"xxh3 floor: {floor * 1000:.0f} ms (one bare pass over the state, {threads} threads)")
    print(f"\ntargets: {json.dumps(targets(rows))}")


if __name__ == "__main__":
    main()
