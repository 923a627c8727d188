"""The data the three-tier policy reads and writes: plain frozen values, no I/O, no clock.

The node agent builds a :class:`PolicyInput` from its projection and its GPU samples; the
simulator builds the same object from its virtual state. Both hand it to the one
:func:`m27.policy.decide`, so what a recorded week would have done under m27 is what the
agent does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: (run_id, step name): how the policy names a step.
StepKey = tuple[str, str]
StepType = Literal["cpu", "gpu", "gpu_light"]
Tier = Literal["immediate", "ready", "background"]
Role = Literal["primary", "guest", "cpu"]


#: The bound of a step's priority, and of the sum of its bumps, each (pipeline files allow
#: the same for `priority:`): base + bump + aging then stays exact in the int64 arrays that
#: order long queues. A larger bump (a typo in `m27 bump`, a hand-written event) overflowed
#: them, and the agent, which folds the same log at every start, stopped each time.
PRIORITY_LIMIT = 10**9


#: Memory that processes m27 did not start must hold on a GPU before m27 leaves the GPU to
#: them: more than a CUDA context (~0.3-0.5 GiB) or a desktop's display server, so only
#: real work counts.
OUTSIDE_MEMORY_MIN = 2**30


def bounded(value: int) -> int:
    """`value` held within -PRIORITY_LIMIT..PRIORITY_LIMIT."""
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, value))


def key_text(key: StepKey) -> str:
    """``run/step``, the way reasons and the CLI show a step."""
    return f"{key[0]}/{key[1]}"


@dataclass(frozen=True)
class PolicyConfig:
    """Tuning of the policy; the defaults are the ones `~/.m2config` documents.

    ``aging_per_s``: 2 points an hour, so a 20-point gap closes in 10 h and a 50-point gap
    in a day: priority still matters in a backlog of hours, and nothing starves.
    ``fifo`` turns the policy into the strict first-in-first-out, exclusive scheduler used
    as a benchmark baseline: no guests, no aging, no background tier, no backfill.
    """

    memory_overprovision: float = 1.0
    #: share of a GPU's memory (× overprovision) that must stay free, as observed, to
    #: admit a guest whose need is unknown (no declaration, no measured peak); such
    #: guests are kept from computing while observed use is above 1 - margin/2 of it.
    guest_memory_margin: float = 0.2
    io_timeout: float = 0.05
    io_util_threshold: float = 10.0
    guests_per_gpu: int = 3
    cpu_slots: int = 2
    aging_per_s: float = 1.0 / 1800.0
    aging_cap: int = 1000
    background_priority_max: int = 0
    fifo: bool = False
    #: seconds a primary, as it leaves an I/O wait, may wait at its gate for a guest that
    #: ranks as high as it to end the compute phase it began in that wait (0: never);
    #: see Decision.yield_to
    primary_yield: float = 0.02


@dataclass(frozen=True)
class Pending:
    """A step that asked for a lease and has none yet.

    ``gpu_memory`` is the declared need in bytes (0: not declared). ``memory_peak`` is
    what the same pipeline step used at most in earlier runs (0: never measured); an
    undeclared step is admitted as a guest by it, else on the GPU's observed free memory
    with ``guest_memory_margin`` to spare. ``time_limit`` is the declared
    run time in seconds (on a node, the step's ``timeout:``), used to guess which GPU
    frees first for a reservation and whether the step may backfill one.
    """

    key: StepKey
    type: StepType = "gpu"
    priority: int = 0
    bump: int = 0
    owner: str = ""
    gpus: int = 1
    gpu_memory: int = 0
    queued_at: float = 0.0
    time_limit: float | None = None
    memory_peak: int = 0


@dataclass(frozen=True)
class Running:
    """A step that holds a lease: a GPU primary, a guest, or a CPU step.

    ``io_waiting`` is the step's own hint (``with m27.io_wait():``); the agent may also
    infer I/O waits from utilization, which it reports in :class:`GpuView` for a primary
    and in ``util_low_since`` for a guest: since when the guest's own utilization has
    stayed under ``io_util_threshold`` while its gate was open (kept while it is paused:
    it has not computed since; None while it computes, or when unknown). A guest that
    gives no hint (``gmx``) is then known to wait on its own I/O after ``io_timeout``, and
    another guest fills the primary's gap instead.
    """

    key: StepKey
    type: StepType = "gpu"
    role: Role = "primary"
    tier: Tier = "immediate"
    gpus: tuple[int, ...] = ()
    paused: bool = False
    gpu_memory: int = 0
    priority: int = 0
    bump: int = 0
    owner: str = ""
    queued_at: float = 0.0
    started_at: float = 0.0
    time_limit: float | None = None
    io_waiting: bool = False
    util_low_since: float | None = None
    #: a guest that has computed since its grant (its gate was opened, or its primary's
    #: I/O let it through): it has work a restart would lose back to its last checkpoint,
    #: so it is never moved to a free GPU (see :class:`Move`)
    computed: bool = False


@dataclass(frozen=True)
class GpuView:
    """What the last samples say about one GPU.

    ``memory_used`` is observed (None when the backend cannot tell). ``util_low_since`` is
    when the primary's per-process utilization last dropped below the threshold and has
    stayed there (None while it computes or when unknown). ``foreign_memory`` is what
    processes m27 did not start hold on it (another user's node, a notebook, a job run by
    hand): a GPU that holds OUTSIDE_MEMORY_MIN of it and no step of m27's is left to them.
    """

    index: int
    memory_total: int = 0
    memory_used: int | None = None
    lost: bool = False
    primary_util: float | None = None
    util_low_since: float | None = None
    foreign_memory: int = 0


@dataclass(frozen=True)
class PolicyInput:
    """Everything :func:`decide` may look at.

    ``usage_by_owner`` is recent GPU-seconds per owner, for fair share between owners at
    equal priority.
    """

    pending: tuple[Pending, ...]
    running: tuple[Running, ...]
    gpus: tuple[GpuView, ...]
    now: float
    config: PolicyConfig = field(default_factory=PolicyConfig)
    usage_by_owner: Mapping[str, float] = field(default_factory=dict)


# --- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """Start a pending step: as the GPUs' primary (immediate), as a gated guest (ready),
    or on GPU time nobody above wants (background; may be demoted later)."""

    key: StepKey
    gpus: tuple[int, ...]
    tier: Tier


@dataclass(frozen=True)
class StartCpu:
    """Start a pending cpu step on a CPU slot."""

    key: StepKey


@dataclass(frozen=True)
class PauseGuest:
    """The primary computes again: stop the guest at its gate (else SIGSTOP its group)."""

    key: StepKey
    gpu: int


@dataclass(frozen=True)
class ResumeGuest:
    """The primary waits on I/O: let this guest compute (open its gate, or SIGCONT)."""

    key: StepKey
    gpu: int


@dataclass(frozen=True)
class Promote:
    """The primary ended: this guest becomes the primary, keeps its process and data, and
    computes from now on."""

    key: StepKey
    gpu: int


@dataclass(frozen=True)
class Demote:
    """A background primary makes room for higher-tier work: it stays loaded as a paused
    guest on the same GPU."""

    key: StepKey
    gpu: int


@dataclass(frozen=True)
class Reserve:
    """Hold these GPUs for a multi-GPU step so lower-ranked steps do not take them; the
    step is granted when all are free. Recomputed on every decision."""

    key: StepKey
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Move:
    """A guest that has not computed yet waits on a GPU whose primary computes, while GPU
    `to` holds nothing and nothing pending takes it: its lease is taken back, the step
    stops, asks again and starts on the free GPU (a guest is never moved across GPUs in
    place: its CUDA context and memory live on `gpu`). Without it the guest waited for its
    primary to end, hours for an MD run, beside an idle GPU."""

    key: StepKey
    gpu: int
    to: int


Action = Grant | StartCpu | PauseGuest | ResumeGuest | Promote | Demote | Reserve | Move
