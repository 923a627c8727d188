"""A GPU step under Open MPI's mpirun stays on its GPU's share of the cores.

mpirun binds its ranks to cores 0, 1, ... of the node whatever mask it was started in
(measured, Open MPI 4.1.4 from Debian: under `taskset -c 1` rank 0 ran on core 0), so two
MPI steps of two GPUs computed on the same cores. m27 sets Open MPI's cpu_set to the
step's share; this runs the real mpirun."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m27.executors.local import run_step
from m27.gpu.cpus import node_cpus
from m27.store.memory import MemoryEventStore
from tests.services import need_program
from tests.unit.runner_helpers import collect, launch

need_program("mpirun", "Open MPI", "apt-get install openmpi-bin")

#: Each rank prints the cores it may run on.
RANK = "grep Cpus_allowed_list /proc/self/status"
#: mpirun refuses to run as root (CI is) unless told it may.
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_open_mpi_ranks_run_on_the_steps_cores_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMPI_MCA_hwloc_base_cpu_set", raising=False)
    cpus = node_cpus()
    if len(cpus) < 2:
        pytest.skip("one core: a share cannot differ from the node's")
    share = cpus[-1]  # not core 0, where mpirun binds rank 0 by itself
    argv = ("mpirun", "-np", "2", "--oversubscribe", "sh", "-c", RANK)
    lines: list[tuple[str, str]] = []
    step = replace(launch("", cpus=(share,), env=AS_ROOT), argv=argv)
    result = run_step(step, MemoryEventStore(), on_lines=collect(lines))
    assert result.ok, lines
    ranks = [line.split()[-1] for stream, line in lines if "Cpus_allowed_list" in line]
    assert ranks == [str(share), str(share)]
    (note,) = [line for stream, line in lines if line.startswith("m27: ") and "share" in line]
    assert f"OMPI_MCA_hwloc_base_cpu_set={share}" in note
