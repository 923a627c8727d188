"""GPU steps on their GPUs' share of the node's cores (m27.gpu.cpus): the split, the child's
affinity mask and thread variables, `gmx mdrun -nt`, the agent's grant and the setting."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import gpus
from m27.config import load_settings
from m27.executors.engines import with_threads
from m27.executors.local import run_step
from m27.gpu.cpus import core_of, gpu_shares, node_cpus, split_cores, step_cpus
from m27.gpu.sim import SimBackend
from m27.store.memory import MemoryEventStore
from m27.units import cpu_list
from tests.commands import cli
from tests.unit.agent_helpers import make_node, run_step_leased
from tests.unit.runner_helpers import collect, launch

#: A stand-in `gmx`: its affinity mask, the thread variables m27 sets and its arguments,
#: as JSON, on stdout or into the file after `-o`.
GMX = """#!{python}
import json, os, sys
got = json.dumps([sorted(os.sched_getaffinity(0)), os.environ.get("OMP_NUM_THREADS"),
                  os.environ.get("M27_CPUS"), sys.argv[1:]])
if "-o" in sys.argv:
    open(sys.argv[sys.argv.index("-o") + 1], "w").write(got)
else:
    print(got)
"""


# --- the split ---------------------------------------------------------------------------


def test_cores_are_split_evenly_among_the_gpus_in_order() -> None:
    assert split_cores(range(8), 2) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert split_cores(range(8), 3) == {0: (0, 1), 1: (2, 3, 4), 2: (5, 6, 7)}


def test_both_hardware_threads_of_a_core_go_to_the_same_gpu() -> None:
    # Linux numbers the second hyperthread of core i as i + 4 on this 4-core, 8-thread node:
    # a split by number would give GPU 1 the siblings of GPU 0's cores.
    shares = split_cores(range(8), 2, core=lambda cpu: cpu % 4)
    assert shares == {0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}


def test_gpus_split_the_cores_nvml_names_nearest_them() -> None:
    # Two sockets: GPUs 0-1 sit by cores 0-3, GPUs 2-3 by cores 4-7.
    near = {0: range(4), 1: range(4), 2: range(4, 8), 3: range(4, 8)}
    assert split_cores(range(8), 4, near) == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}


def test_nearest_cores_outside_the_agents_mask_count_as_unknown() -> None:
    # The agent may use cores 0-3 only (a container); NVML names 8-15 for GPU 1: it is
    # as if NVML had not said, and the two GPUs split the cores the agent has.
    shares = split_cores(range(4), 2, {0: range(4), 1: range(8, 16)})
    assert shares == {0: (0, 1), 1: (2, 3)}


def test_more_gpus_than_cores_share_a_core_each() -> None:
    assert split_cores([0, 1], 4) == {0: (0,), 1: (0,), 2: (1,), 3: (1,)}


def test_a_step_gets_its_gpus_shares_and_none_when_that_is_every_core() -> None:
    shares = split_cores(range(8), 4)
    assert step_cpus((1,), shares) == (2, 3)
    assert step_cpus((0, 3), shares) == (0, 1, 6, 7)
    assert step_cpus((0, 1, 2, 3), shares) == ()  # all of them: not confined
    assert step_cpus((7,), shares) == ()  # a GPU with no share
    assert step_cpus((0,), {}) == ()


def test_cpu_lists_read_as_taskset_writes_them() -> None:
    assert cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_list([5]) == "5"


def test_core_of_reads_the_kernels_topology_and_names_an_unknown_cpu_itself() -> None:
    cpus = node_cpus()
    assert cpus and all(isinstance(c, int) for c in cpus)
    hash(core_of(cpus[0]))
    assert core_of(1 << 20) == ("cpu", 1 << 20)


def test_the_setting_decides_which_nodes_confine_their_gpu_steps() -> None:
    sim2, sim1 = SimBackend(2), SimBackend(1)
    try:
        # simulated GPUs stand in for ones a laptop lacks: its steps compute on the CPU
        assert gpu_shares("auto", sim2) == {}
        assert gpu_shares("all", sim2) == {}
        assert gpu_shares("share", sim1) == {}  # one GPU: every core is its share
        assert gpu_shares("share", sim2) == split_cores(node_cpus(), 2, core=core_of)
    finally:
        sim2.close()
        sim1.close()


def test_gpu_cpus_is_a_performance_setting_with_named_choices(tmp_path: Path) -> None:
    assert load_settings({"HOME": str(tmp_path)}).gpu_cpus == "auto"
    assert load_settings({"HOME": str(tmp_path), "M27_GPU_CPUS": "Share"}).gpu_cpus == "share"
    with pytest.raises(Exception, match="gpu_cpus must be auto, share"):
        load_settings({"HOME": str(tmp_path), "M27_GPU_CPUS": "half"})


# --- the step's process ------------------------------------------------------------------


@pytest.fixture
def gmx(tmp_path: Path) -> Path:
    """A stand-in `gmx` (the engine whose thread count m27 sets: `mdrun -nt N`) that prints
    what it got: its mask, OMP_NUM_THREADS, M27_CPUS and its arguments."""
    path = tmp_path / "bin" / "gmx"
    path.parent.mkdir()
    path.write_text(GMX.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _run(argv: tuple[str, ...], **kw: object) -> tuple[list[object], list[str]]:
    """What the step printed (parsed) and m27's notes on its stderr."""
    lines: list[tuple[str, str]] = []
    step = launch("", **kw)
    assert run_step(replace(step, argv=argv), MemoryEventStore(), on_lines=collect(lines)).ok
    out = [json.loads(line) for stream, line in lines if stream == "stdout"]
    return out[0], [line for stream, line in lines if stream == "stderr"]


def test_mdrun_starts_bound_to_its_cores_with_its_thread_count(gmx: Path) -> None:
    cpu = node_cpus()[-1]
    before = os.sched_getaffinity(0)
    got, notes = _run((str(gmx), "mdrun", "-deffnm", "md"), cpus=(cpu,))
    assert got == [[cpu], "1", "1", ["mdrun", "-nt", "1", "-deffnm", "md"]]
    assert notes == [
        f"m27: on core {cpu}, its GPUs' share of the node's (gpu_cpus in [performance]):"
        " OMP_NUM_THREADS=1, M27_CPUS=1, mdrun -nt 1"
    ]
    assert os.sched_getaffinity(0) == before  # the runner's thread got its mask back


def test_a_program_whose_threads_m27_does_not_set_is_told_its_share_but_not_bound(
    gmx: Path,
) -> None:
    """mdrun in a script starts a thread per core of the node: bound to one core of two it
    ran 60 times slower (bench_cores.py). Such a program gets the variables, not the mask."""
    cpu = node_cpus()[0]
    script = (sys.executable, "-c", f"import subprocess; subprocess.run([{str(gmx)!r}, 'mdrun'])")
    got, notes = _run(script, cpus=(cpu,))
    assert got == [sorted(os.sched_getaffinity(0)), "1", "1", ["mdrun"]]
    assert notes == [
        f"m27: its GPUs' share of the node's cores is core {cpu} (gpu_cpus in [performance]):"
        " OMP_NUM_THREADS=1, M27_CPUS=1; not bound to them, as m27 sets no thread option of"
        " this program"
    ]


def test_the_steps_own_omp_num_threads_wins_and_an_unconfined_step_sets_none(
    gmx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_CPUS", "9")  # a leftover of a step that started this process
    cpu = node_cpus()[0]
    argv = (str(gmx), "mdrun")
    got, notes = _run(argv, cpus=(cpu,), env={"OMP_NUM_THREADS": "3"})
    assert got[:3] == [[cpu], "3", "1"]
    assert notes[0].endswith(": OMP_NUM_THREADS=3, M27_CPUS=1, mdrun -nt 1")  # as it got
    free, notes = _run(argv)  # no share (gpu_cpus = all, a CPU step)
    assert free == [sorted(os.sched_getaffinity(0)), None, None, ["mdrun"]]
    assert notes == []


def test_cores_that_cannot_be_set_are_said_and_the_step_still_runs(gmx: Path) -> None:
    got, notes = _run((str(gmx), "mdrun"), cpus=(4000,))
    assert got[0] == sorted(os.sched_getaffinity(0))
    assert notes[0].startswith("m27: cannot bind it to core 4000 (")
    assert "it may run on any core; OMP_NUM_THREADS=1" in notes[0]


# --- engines -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected", "said"),
    [
        ("gmx mdrun -deffnm md -v", "gmx mdrun -nt 4 -deffnm md -v", "mdrun -nt 4"),
        (
            "/opt/gmx/bin/gmx_d mdrun -s x.tpr",
            "/opt/gmx/bin/gmx_d mdrun -nt 4 -s x.tpr",
            "mdrun -nt 4",
        ),
        (
            "gmx mdrun -ntomp 2 -deffnm md",
            "gmx mdrun -ntomp 2 -deffnm md",
            "mdrun's own -ntomp kept",
        ),
        # gmx's own flags before the subcommand (bench_cores.py's `gmx -quiet mdrun` went
        # unrecognised: unbound, no -nt)
        ("gmx -quiet -nobackup mdrun -v", "gmx -quiet -nobackup mdrun -nt 4 -v", "mdrun -nt 4"),
        (
            "mpirun -np 2 gmx_mpi mdrun -deffnm md",
            "mpirun -np 2 gmx_mpi mdrun -deffnm md",
            "no -nt for an MPI mdrun (its ranks read OMP_NUM_THREADS)",
        ),
        ("gmx grompp -f md.mdp", "gmx grompp -f md.mdp", ""),
        ("python train.py", "python train.py", ""),
    ],
)
def test_mdrun_gets_its_share_as_nt_unless_it_sets_its_threads(
    command: str, expected: str, said: str
) -> None:
    assert with_threads(command.split(), 4) == (tuple(expected.split()), said)


# --- the agent ---------------------------------------------------------------------------


def test_the_agent_grants_each_gpu_step_its_gpus_cores(tmp_path: Path, gmx: Path) -> None:
    node = make_node(tmp_path, gpus=2)
    shares = split_cores(node_cpus(), 2, core=core_of)
    node.agent.cpu_shares = shares
    node.start()
    try:
        lease = node.lease()
        outs = {name: tmp_path / f"{name}.json" for name in ("a", "b", "c")}
        runs = [
            run_step_leased(
                lease,
                "R",
                name,
                (str(gmx), "mdrun", "-o", str(out)),
                type="cpu" if name == "c" else "gpu",
                gpu_memory=1 << 30,
            )
            for name, out in outs.items()
        ]
        results = [r.wait() for r in runs]
        assert all(r is not None and r.ok for r in results), results
        granted = {e.step: e for e in node.of(ev.LeaseGranted) if isinstance(e, ev.LeaseGranted)}
        started = {e.step: e for e in node.of(ev.StepStarted) if isinstance(e, ev.StepStarted)}
        for name in ("a", "b"):
            cpus = step_cpus(granted[name].gpus, shares)
            assert tuple(granted[name].cpus) == cpus
            if cpus:  # (a one-core machine gives both GPUs every core: nothing to confine)
                n = str(len(cpus))
                assert started[name].command[1:4] == ("mdrun", "-nt", n)
                assert json.loads(outs[name].read_text())[:3] == [list(cpus), n, n]
        assert granted["c"].cpus == ()  # a CPU step is not confined
        assert json.loads(outs["c"].read_text())[:3] == [
            sorted(os.sched_getaffinity(0)),
            None,
            None,
        ]
    finally:
        node.close()


def test_m27_gpus_names_each_gpus_cores_where_gpu_steps_are_confined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_HOME", str(tmp_path))
    monkeypatch.setenv("M27_GPUS", "sim:2")
    assert cli(gpus, ["gpus"]) == 0
    assert "CORES" not in capsys.readouterr().out  # auto on simulated GPUs: not confined
    monkeypatch.setenv("M27_GPU_CPUS", "share")
    shares = split_cores(node_cpus(), 2, core=core_of)
    assert cli(gpus, ["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [tuple(r["cores"]) for r in rows] == [shares[0], shares[1]]
    assert cli(gpus, ["gpus"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[7] == "CORES"
    assert [line.split()[-3] for line in lines] == [cpu_list(shares[0]), cpu_list(shares[1])]


def test_the_agents_snapshot_names_each_gpus_cores(tmp_path: Path) -> None:
    from m27.node.report import read_snapshot

    node = make_node(tmp_path, gpus=2)
    node.agent.cpu_shares = {0: (0, 1), 1: (2, 3)}
    try:
        node.agent.start()
        node.agent.tick()
        snap = read_snapshot(tmp_path)
        assert snap is not None
        assert [row["cores"] for row in snap["gpus"]] == [[0, 1], [2, 3]]
    finally:
        node.close()


@pytest.mark.parametrize(
    ("command", "ranks"),
    [
        ("mpirun -np 4 gmx_mpi mdrun -deffnm md", 4),
        ("mpiexec -n 2 lmp -in in.melt", 2),
        ("srun --ntasks=8 gmx_mpi mdrun", 8),
        ("mpirun --np 3 ./a.out", 3),
        ("mpirun ./a.out", 1),  # it does not say: one part
        ("gmx mdrun -n index.ndx", 1),  # -n of a program, not of a launcher
        ("mpirun -np x ./a.out", 1),
    ],
)
def test_each_mpi_rank_gets_its_part_of_the_cores(command: str, ranks: int) -> None:
    """Before, a lone `mpirun -np 4 gmx_mpi` on a node's 8 cores let GROMACS give each rank
    2 threads; OMP_NUM_THREADS=8 would have made it 32 threads on the 8."""
    from m27.executors.local import child_env

    step = launch("", cpus=tuple(range(8)))
    env = child_env(replace(step, argv=tuple(command.split())), 1, None)
    assert (env["OMP_NUM_THREADS"], env["M27_CPUS"]) == (str(max(1, 8 // ranks)), "8")


def test_open_mpi_ranks_are_kept_to_the_share_unless_the_step_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Open MPI's mpirun binds its ranks from core 0 whatever mask it starts in: its
    cpu_set (an MCA parameter it reads from the environment) is the step's share. The
    real mpirun is in tests/integration/test_mpi_cores.py."""
    from m27.executors.local import child_env

    monkeypatch.delenv("OMPI_MCA_hwloc_base_cpu_set", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))  # the node's
    step = replace(launch("", cpus=(8, 9, 10, 11, 20)), argv=("mpirun", "-np", "2", "lmp"))
    assert child_env(step, 1, None)["OMPI_MCA_hwloc_base_cpu_set"] == "8-11,20"
    own = replace(step, env={"OMPI_MCA_hwloc_base_cpu_set": "8"})
    assert child_env(own, 1, None)["OMPI_MCA_hwloc_base_cpu_set"] == "8"
    monkeypatch.setenv("OMPI_MCA_hwloc_base_cpu_set", "0-3")  # the node's own setting
    assert child_env(step, 1, None)["OMPI_MCA_hwloc_base_cpu_set"] == "0-3"
    monkeypatch.delenv("OMPI_MCA_hwloc_base_cpu_set")
    assert "OMPI_MCA_hwloc_base_cpu_set" not in child_env(replace(step, cpus=()), 1, None)
    # a core this process may not use (offline, outside its mask): mpirun would exit 1
    # without a word (measured), so it is left to run where it can
    assert "OMPI_MCA_hwloc_base_cpu_set" not in child_env(replace(step, cpus=(8, 40)), 1, None)
