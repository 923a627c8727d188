"""benchmarks/bench_agent.py's measurement of the guest handover, on hand-written step
records: the figure must count what it says and nothing else."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.bench_loader import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_agent")


def _records(tmp: Path, rows: dict[str, list[tuple[str, float, float]]]) -> dict[str, Path]:
    outs = {}
    for name, lines in rows.items():
        outs[name] = tmp / f"{name}.txt"
        outs[name].write_text("".join(f"{k} {a} {b}\n" for k, a, b in lines))
    return outs


def test_a_handover_is_the_computing_guests_own_io_to_the_next_compute_in_the_wait(
    bench: ModuleType, tmp_path: Path
) -> None:
    # the primary waits on I/O from 10.0 to 11.0; guest a computes, enters its own I/O at
    # 10.3; guest b (loaded, out of its own I/O) computes from 10.305: 5 ms
    outs = _records(
        tmp_path,
        {
            "p": [("ready", 9.0, 9.0), ("compute", 9.5, 10.0), ("io", 10.0, 11.0)],
            "a": [("ready", 9.0, 9.0), ("compute", 10.1, 10.3), ("io", 10.3, 10.6)],
            "b": [("ready", 9.0, 9.0), ("compute", 10.305, 10.5), ("compute", 10.5, 10.9)],
            "elsewhere": [("ready", 9.0, 9.0), ("compute", 10.301, 10.4)],  # another GPU
        },
    )
    gpu_of = {"p": 0, "a": 0, "b": 0, "elsewhere": 1}
    chunks = {n: bench._phases(o, "compute") for n, o in outs.items()}
    io = {n: bench._phases(o, "io") for n, o in outs.items()}
    ready = {n: 9.0 for n in outs}
    got = bench._handovers("p", (10.0, 11.0), outs, gpu_of, chunks, io, ready)
    assert [round(x, 6) for x in got] == [0.005]

    # b still in its own I/O when a enters its own: nobody could take over, not counted
    io["b"] = [(10.2, 10.4)]
    assert bench._handovers("p", (10.0, 11.0), outs, gpu_of, chunks, io, ready) == []
    io["b"] = []
    # a did not compute in this wait (only before it): its I/O hands nothing over
    chunks["a"] = [(9.6, 9.9)]
    assert bench._handovers("p", (10.0, 11.0), outs, gpu_of, chunks, io, ready) == []
