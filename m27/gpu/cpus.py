"""Which CPU cores a GPU step runs on: its GPUs' share of the node's cores.

A GPU step still needs cores: `gmx mdrun` with no thread options starts one thread per
hardware thread of the node and pins them from core 0. On a node of several GPUs, the
mdruns the agent starts side by side then all pin to the same cores (measured with
GROMACS 2022: two mdruns on one node each took every core). So, like Slurm's
`--cpus-per-gpu`, each GPU owns an even share of the cores the agent may use, the cores
nearest the GPU where NVML says which those are, and a step gets the shares of its GPUs:
``OMP_NUM_THREADS`` and ``M27_CPUS`` say their number, and `gmx mdrun` gets ``-nt`` and
starts under that affinity mask (it then does not pin by itself). Only a program whose
thread count m27 sets is bound: one that starts a thread per core of the node runs many
times slower on a few of them (the runner, m27.executors.local).

The share is static: a lone step on an idle node of 4 GPUs gets a quarter of its cores.
That is what keeps a second step from slowing the first when it starts, which a node
that runs several steps at once is for; ``gpu_cpus = all`` in ``[performance]`` turns it
off. A guest shares its GPU's cores with the GPU's primary (it computes while the primary
waits). CPU steps are not confined.

The functions here are pure (the agent passes the cores and the GPUs' nearest cores);
:func:`node_cpus` and :func:`core_of` read this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path

from m27.gpu import GpuBackend

__all__ = ["core_of", "gpu_shares", "node_cpus", "split_cores", "step_cpus"]

_TOPOLOGY = Path("/sys/devices/system/cpu")


def node_cpus() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask: a container's or taskset's
    limit, not every core of the machine)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return tuple(range(os.cpu_count() or 1))


def core_of(cpu: int) -> Hashable:
    """The physical core a logical CPU is a hardware thread of (its package and core id),
    so that two hyperthreads of one core go to the same GPU; the CPU itself when the
    kernel does not say."""
    base = _TOPOLOGY / f"cpu{cpu}" / "topology"
    try:
        package = (base / "physical_package_id").read_text().strip()
        core = (base / "core_id").read_text().strip()
    except OSError:
        return ("cpu", cpu)
    return (package, core)


def split_cores(
    cpus: Sequence[int],
    gpus: int,
    near: Mapping[int, Iterable[int]] | None = None,
    core: Callable[[int], Hashable] = lambda cpu: cpu,
) -> dict[int, tuple[int, ...]]:
    """Each GPU's share of `cpus`, as {gpu index: sorted logical CPUs}.

    GPUs near the same cores (`near`: NVML's CPU affinity of each GPU; unknown or outside
    `cpus` means all of `cpus`) split those cores evenly by physical core (`core`), the
    lower GPU indexes first; with fewer cores than GPUs, GPUs share one core each.
    """
    allowed = sorted(set(cpus))
    groups: dict[tuple[int, ...], list[int]] = {}
    for gpu in range(gpus):
        own = sorted(set(near.get(gpu, ()) if near else ()) & set(allowed))
        groups.setdefault(tuple(own or allowed), []).append(gpu)
    share: dict[int, tuple[int, ...]] = {}
    for candidates, members in groups.items():
        units: dict[Hashable, list[int]] = {}
        for cpu in candidates:
            units.setdefault(core(cpu), []).append(cpu)
        cores = list(units.values())
        n, k = len(cores), len(members)
        for j, gpu in enumerate(members):
            mine = cores[j * n // k : (j + 1) * n // k] if n >= k else [cores[j * n // k]]
            share[gpu] = tuple(sorted(cpu for unit in mine for cpu in unit))
    return share


def step_cpus(gpus: Iterable[int], shares: Mapping[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The cores of a step on `gpus`: its GPUs' shares together; () (not confined) when
    that is every shared core anyway, or a GPU has no share."""
    mine: set[int] = set()
    for gpu in gpus:
        if gpu not in shares:
            return ()
        mine.update(shares[gpu])
    every = {cpu for share in shares.values() for cpu in share}
    return () if not mine or mine >= every else tuple(sorted(mine))


def gpu_shares(mode: str, backend: GpuBackend) -> dict[int, tuple[int, ...]]:
    """Each GPU's cores for the ``gpu_cpus`` setting (`auto`, `share`, `all`); {} when GPU
    steps are not confined: `all`, a node of one GPU, or `auto` on simulated GPUs (they
    stand in for GPUs a laptop does not have, and its steps then compute on the CPU)."""
    gpus = len(backend.devices())
    if mode == "all" or gpus < 2 or (mode == "auto" and backend.kind != "nvml"):
        return {}
    near_cpus = getattr(backend, "near_cpus", None)
    near: dict[int, tuple[int, ...]] = {}
    if near_cpus is not None:
        for gpu in range(gpus):
            if found := near_cpus(gpu):
                near[gpu] = found
    return split_cores(node_cpus(), gpus, near, core_of)
