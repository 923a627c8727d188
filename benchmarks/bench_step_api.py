"""Hot-path cost of ``m27.io_wait()`` and ``m27.gate()`` inside a step.

A step may enter an I/O block for every frame it writes, and call ``gate()`` once per
iteration, so both must cost next to nothing. Prints nanoseconds per call and the ratio to
an empty context manager / an empty function call (the floor for any Python API).

    python benchmarks/bench_step_api.py [--json] [--min]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path
from types import TracebackType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m27.step import _process as _step_api
from m27.step._channel import Channel
from m27.step._process import gate, io_wait

N = 200_000
REPEATS = 7


class _Noop:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NOOP = _Noop()


def _noop_cm() -> _Noop:
    return _NOOP


def _noop_fn() -> bool:
    return True


def _ns_per_call(stmt: str, env: dict[str, object], least: bool = False) -> float:
    """Median over repeats, or with `least` (--min) the minimum: on a shared machine the
    least disturbed repeat."""
    times = timeit.repeat(stmt, globals=env, number=N, repeat=REPEATS)
    pick = min if least else statistics.median
    return pick(times) / N * 1e9


def main(least: bool = False) -> dict[str, float]:
    env: dict[str, object] = {"io_wait": io_wait, "gate": gate, "noop": _noop_cm, "f": _noop_fn}
    results: dict[str, float] = {}
    results["noop_with_ns"] = _ns_per_call("with noop(): pass", env, least)
    results["noop_call_ns"] = _ns_per_call("f()", env, least)

    os.environ.pop("M27_CHANNEL", None)
    _step_api._reset_step_channel()
    results["io_wait_outside_agent_ns"] = _ns_per_call("with io_wait(): pass", env, least)
    results["gate_outside_agent_ns"] = _ns_per_call("gate()", env, least)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.chan"
        agent = Channel.create(path)
        os.environ["M27_CHANNEL"] = str(path)
        _step_api._reset_step_channel()
        results["io_wait_with_channel_ns"] = _ns_per_call("with io_wait(): pass", env, least)
        results["gate_open_with_channel_ns"] = _ns_per_call("gate()", env, least)
        _step_api._reset_step_channel()
        agent.close()
        os.environ.pop("M27_CHANNEL")

    results["io_wait_ratio_vs_noop"] = results["io_wait_with_channel_ns"] / results["noop_with_ns"]
    results["gate_ratio_vs_noop_call"] = (
        results["gate_open_with_channel_ns"] / results["noop_call_ns"]
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--min", action="store_true", help="the fastest repeat, not the median")
    args = parser.parse_args()
    res = main(args.min)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for key, value in res.items():
            unit = "x" if "ratio" in key else " ns"
            print(f"{key:<28} {value:10.1f}{unit}")
