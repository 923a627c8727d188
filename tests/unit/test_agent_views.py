"""The memory of a GPU held by processes m27 did not start, as the agent counts it."""

from __future__ import annotations

import os

from m27.gpu import GpuSample, ProcessSample
from m27.node.views import ViewControl

GIB = 2**30
MINE, THEIRS, HIDDEN = 4_100_001, 4_100_002, 4_100_003  # made-up pids: no such process


class _Views(ViewControl):
    def __init__(self) -> None:
        self._pgids = {}


def _sample(used: int | None, *procs: ProcessSample) -> GpuSample:
    return GpuSample(0, "GPU-x", "x", 0.0, memory_used=used, processes=procs)


def test_processes_of_no_lease_count_and_the_steps_own_do_not() -> None:
    views, mine = _Views(), ({MINE}, set[int | None]())
    sample = _sample(
        50 * GIB, ProcessSample(MINE, 20 * GIB, None), ProcessSample(THEIRS, 30 * GIB, None)
    )
    assert views._foreign_memory(sample, mine) == 30 * GIB


def test_a_process_whose_memory_nvml_does_not_tell_counts_what_m27s_do_not_explain() -> None:
    """Another user's process without privileges: NVML lists it, its memory unknown."""
    views, mine = _Views(), ({MINE}, set[int | None]())
    sample = _sample(
        50 * GIB, ProcessSample(MINE, 20 * GIB, None), ProcessSample(HIDDEN, None, None)
    )
    assert views._foreign_memory(sample, mine) == 30 * GIB


def test_a_steps_child_in_its_process_group_is_the_steps() -> None:
    """`sh -c 'gmx mdrun ...'`: the GPU lists the child, whose pid no lease has."""
    views = _Views()
    own_group = os.getpgid(0)
    sample = _sample(20 * GIB, ProcessSample(os.getpid(), 20 * GIB, None))
    assert views._foreign_memory(sample, (set(), {own_group})) == 0
