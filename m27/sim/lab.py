"""A synthetic lab week: the workload the original system was measured on, made explicit.

Four people share one 4 x V100 (32 GiB) server for 72 hours, starting Monday 00:00. On
Monday morning a backlog is waiting; more work arrives in working hours. Job kinds:

- MD pipelines: ``prep`` (cpu) -> ``md`` (gpu; computes ~15 min then writes a trajectory
  frame for 1-4 min; black-box ``gmx`` that gives no I/O hint) -> ``analysis`` (gpu_light,
  I/O-heavy);
- training runs (gpu; data loading I/O every minute, hinted with ``m27.io_wait``);
- quantum chemistry (gpu; long compute, little I/O);
- low-priority parameter sweeps (gpu, priority < 0: background work).

Everything is drawn from a seeded generator, so a seed is a reproducible week.
"""

from __future__ import annotations

import random

from m27.policy import StepType
from m27.sim.trace import GIB, Job, PhaseKind, Trace

OWNERS = ("alice", "bob", "chen", "dana")
HOUR = 3600.0


def _cycles(
    rng: random.Random, total_compute: float, chunk: tuple[float, float], io: tuple[float, float]
) -> tuple[tuple[PhaseKind, float], ...]:
    """Compute chunks separated by I/O waits, `total_compute` seconds of compute in all."""
    phases: list[tuple[PhaseKind, float]] = []
    left = total_compute
    while left > 0:
        c = min(left, rng.uniform(*chunk))
        phases.append(("compute", round(c, 1)))
        left -= c
        if left > 0:
            phases.append(("io", round(rng.uniform(*io), 1)))
    return tuple(phases)


def _job(
    rng: random.Random,
    id: str,
    arrival: float,
    phases: tuple[tuple[PhaseKind, float], ...],
    *,
    type: StepType = "gpu",
    priority: int = 10,
    owner: str,
    memory_gib: float = 0.0,
    depends_on: tuple[str, ...] = (),
    io_hint: bool = True,
    gpus: int = 1,
) -> Job:
    duration = sum(s for _, s in phases)
    # People declare generous limits, rounded up to the hour (what backfill has to trust).
    limit = HOUR * max(1.0, float(int(duration * rng.uniform(1.3, 2.5) / HOUR) + 1))
    klass = "high" if priority >= 20 else "low" if priority < 0 else "normal"
    return Job(
        id=id,
        arrival=round(arrival, 1),
        phases=phases,
        type=type,
        priority=priority,
        owner=owner,
        gpus=gpus,
        gpu_memory=int(memory_gib * GIB),
        time_limit=limit,
        depends_on=depends_on,
        io_hint=io_hint,
        klass=klass,
    )


def _arrival(rng: random.Random, hours: float) -> float:
    """Monday-morning backlog (a third), the rest in working hours (9-18) of the days."""
    if rng.random() < 1 / 3:
        return 0.0
    days = max(1, int(hours // 24))
    return rng.randrange(days) * 24 * HOUR + rng.uniform(9 * HOUR, 18 * HOUR)


def _one_step(
    rng: random.Random,
    id: str,
    hours: float,
    compute_h: tuple[float, float],
    chunk: tuple[float, float],
    io: tuple[float, float],
    memory_gib: tuple[float, float],
    priority: int = 10,
) -> Job:
    """A one-step GPU job of someone's: `compute_h` hours of compute (drawn from the range)
    in `chunk`-second runs between `io`-second waits, `memory_gib` GiB of GPU memory."""
    owner = rng.choice(OWNERS)
    phases = _cycles(rng, rng.uniform(*compute_h) * HOUR, chunk, io)
    return _job(
        rng, id, _arrival(rng, hours), phases, owner=owner, priority=priority,
        memory_gib=rng.uniform(*memory_gib),
    )  # fmt: skip


def lab_week(seed: int = 0, gpus: int = 4, hours: float = 72.0, load: float = 1.0) -> Trace:
    """The lab trace; `load` scales the submissions (1.0: ~80 GPU jobs, about 1.05 x the
    GPU time 4 GPUs have in 72 h, so the queue never runs dry and throughput tells)."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    n_md = round(24 * load * gpus / 4)
    n_train = round(16 * load * gpus / 4)
    n_qm = round(14 * load * gpus / 4)
    n_sweep = round(16 * load * gpus / 4)
    for i in range(n_md):
        owner = rng.choice(OWNERS)
        t = _arrival(rng, hours)
        prio = 30 if rng.random() < 0.2 else 10
        run = f"md{i:02d}"
        prep = _cycles(rng, rng.uniform(600, 2400), (600, 2400), (0, 0))
        jobs.append(_job(rng, f"{run}/prep", t, prep, type="cpu", priority=prio, owner=owner))
        md = _cycles(rng, rng.uniform(2, 7) * HOUR, (600, 1200), (60, 240))
        jobs.append(
            _job(
                rng, f"{run}/md", t, md, priority=prio, owner=owner,
                memory_gib=rng.uniform(4, 12), depends_on=(f"{run}/prep",), io_hint=False,
            )
        )  # fmt: skip
        ana = _cycles(rng, rng.uniform(600, 1800), (30, 90), (60, 180))
        jobs.append(
            _job(
                rng, f"{run}/analysis", t, ana, type="gpu_light", priority=prio, owner=owner,
                memory_gib=rng.uniform(2, 6), depends_on=(f"{run}/md",),
            )
        )  # fmt: skip
    for i in range(n_train):
        owner = rng.choice(OWNERS)
        phases = _cycles(rng, rng.uniform(2, 6) * HOUR, (300, 600), (60, 150))
        big = rng.random() < 0.25
        jobs.append(
            _job(
                rng, f"train{i:02d}/fit", _arrival(rng, hours), phases, owner=owner,
                priority=30 if rng.random() < 0.15 else 10, memory_gib=rng.uniform(16, 28),
                gpus=2 if big else 1,
            )
        )  # fmt: skip
    # one-step jobs: hours of compute, compute runs and I/O waits (s), GPU memory (GiB)
    for i in range(n_qm):
        jobs.append(
            _one_step(rng, f"qm{i:02d}/scf", hours, (1, 4), (1800, 3600), (20, 60), (8, 20))
        )
    for i in range(n_sweep):
        jobs.append(
            _one_step(
                rng, f"sweep{i:02d}/point", hours, (0.5, 2), (300, 900), (30, 120), (2, 8),
                priority=-5,
            )
        )  # fmt: skip
    jobs.sort(key=lambda j: (j.arrival, j.id))
    return Trace(
        jobs=tuple(jobs),
        gpus=gpus,
        gpu_memory=32 * GIB,
        cpu_slots=4,
        window=hours * HOUR,
        name=f"lab-week(seed={seed}, load={load:g})",
        meta={"generator": "m27.sim.lab.lab_week", "seed": seed, "load": load},
    )
