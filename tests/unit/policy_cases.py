"""Shared decision fixtures: one node state, the policy input it means, the actions m27 takes.

Each :class:`Case` describes a node at one instant in terms that the policy, the trace
simulator and the node agent can all build: steps that wait, steps that hold a GPU (as
primary, guest or on a CPU slot), which primary is in an I/O phase and since when, and
whether it hints that itself. ``expected`` is worked out by hand (the comment says how).

- :meth:`Case.policy_input` is the canonical :class:`~m27.policy.PolicyInput`;
- tests/unit/test_shared_decisions.py puts the same state into the simulator and into
  the agent (through the events it would have logged and simulated GPU samples) and checks
  that both hand :func:`m27.policy.decide` this input and get these actions.

Only what both sides can express is used: no priority bumps (the simulator has none),
no declared time limits (the simulator's come from its trace), no lost GPUs, one I/O start per case (the
agent learns when utilization dropped by sampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from m27.policy import (
    Action,
    Demote,
    GpuView,
    Grant,
    Move,
    PauseGuest,
    Pending,
    PolicyConfig,
    PolicyInput,
    Promote,
    Reserve,
    ResumeGuest,
    Role,
    Running,
    StartCpu,
    StepKey,
    StepType,
    Tier,
)

GIB = 2**30
MEMORY = 16 * GIB


@dataclass(frozen=True)
class Step:
    """A step of the case; ``role`` None means it waits for a lease."""

    id: str
    queued_at: float
    type: StepType = "gpu"
    priority: int = 0
    owner: str = "ann"
    gpus: int = 1
    gpu_memory: int = 4 * GIB
    role: Role | None = None
    tier: Tier = "immediate"
    on: tuple[int, ...] = ()
    started_at: float = 0.0
    paused: bool = False
    #: in an I/O phase since this time (None: it computes); a guest's own I/O, when it
    #: gives no hint, is what its own utilization shows (``Running.util_low_since``)
    io_since: float | None = None
    #: the step marks its own I/O waits (``m27.io_wait``)
    io_hint: bool = False
    #: a guest that has computed since its grant (one in its own I/O phase has too)
    computed: bool = False

    @property
    def has_computed(self) -> bool:
        return self.role == "guest" and (self.computed or self.io_since is not None)

    @property
    def key(self) -> StepKey:
        run, _, step = self.id.partition("/")
        return (run, step)

    @property
    def computing(self) -> bool:
        """What a GPU sample would show for this step's process."""
        if self.role == "primary":
            return self.io_since is None
        return self.role == "guest" and not self.paused and self.io_since is None


@dataclass(frozen=True)
class Case:
    name: str
    gpus: int
    now: float
    steps: tuple[Step, ...]
    expected: tuple[Action, ...]
    cpu_slots: int = 2
    next_check: float | None = None
    config: PolicyConfig = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", PolicyConfig(cpu_slots=self.cpu_slots))

    @property
    def pending(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.role is None)

    @property
    def running(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.role is not None)

    def primary_on(self, gpu: int) -> Step | None:
        return next((s for s in self.running if s.role == "primary" and gpu in s.on), None)

    def policy_input(self) -> PolicyInput:
        pending = tuple(
            Pending(
                key=s.key,
                type=s.type,
                priority=s.priority,
                owner=s.owner,
                gpus=0 if s.type == "cpu" else s.gpus,
                gpu_memory=s.gpu_memory,
                queued_at=s.queued_at,
            )
            for s in self.pending
        )
        running = tuple(
            Running(
                key=s.key,
                type=s.type,
                role=s.role,
                tier=s.tier,
                gpus=s.on,
                paused=s.paused,
                gpu_memory=s.gpu_memory,
                priority=s.priority,
                owner=s.owner,
                queued_at=s.queued_at,
                started_at=s.started_at,
                io_waiting=s.io_hint and s.role == "primary" and s.io_since is not None,
                util_low_since=s.io_since if s.role == "guest" and not s.io_hint else None,
                computed=s.has_computed,
            )
            for s in self.running
            if s.role is not None
        )
        views = []
        for g in range(self.gpus):
            prim = self.primary_on(g)
            if prim is not None and prim.io_since is not None:
                views.append(GpuView(g, MEMORY, None, False, 0.0, prim.io_since))
            else:
                views.append(GpuView(g, MEMORY, None, False, 100.0 if prim else None, None))
        return PolicyInput(pending, running, tuple(views), self.now, self.config, {})


def _k(id: str) -> StepKey:
    run, _, step = id.partition("/")
    return (run, step)


CASES: tuple[Case, ...] = (
    # GPU 1 is free: the best waiting step (prio 20) takes it; the next (prio 0) fits
    # beside either 8 GiB primary and goes to the one with more free memory (a tie: the
    # lower index), paused, because its primary computes.
    Case(
        "free GPU to the best step, the next as a paused guest",
        gpus=2,
        now=100.0,
        steps=(
            Step("a/md", 0.0, priority=10, gpu_memory=8 * GIB, role="primary", on=(0,)),
            Step("b/fit", 10.0, priority=20, gpu_memory=8 * GIB),
            Step("c/prep", 20.0, priority=0),
        ),
        expected=(Grant(_k("b/fit"), (1,), "immediate"), Grant(_k("c/prep"), (0,), "ready")),
    ),
    # The primary says it waits on I/O: its paused guest computes now.
    Case(
        "hinted I/O lets the guest compute",
        gpus=1,
        now=500.01,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,), io_since=500.0, io_hint=True),
            Step("g/ana", 5.0, role="guest", tier="ready", on=(0,), started_at=50.0, paused=True),
        ),
        expected=(ResumeGuest(_k("g/ana"), 0),),
    ),
    # No hint: utilization has been 0 since 500.0, longer than io_timeout (0.05 s).
    Case(
        "inferred I/O after io_timeout lets the guest compute",
        gpus=1,
        now=500.2,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,), io_since=500.0),
            Step("g/ana", 5.0, role="guest", tier="ready", on=(0,), started_at=50.0, paused=True),
        ),
        expected=(ResumeGuest(_k("g/ana"), 0),),
    ),
    # No hints: the primary and its running guest (an md of its own) both show no compute
    # since 500.0, longer than io_timeout: the guest waits on its own I/O, so the next
    # guest fills the gap (the first is paused; its I/O goes on, see docs/policy.md).
    Case(
        "a guest in its own unhinted I/O gives way to the next guest",
        gpus=1,
        now=500.2,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,), io_since=500.0),
            Step("g/md", 5.0, priority=5, role="guest", tier="ready", on=(0,), io_since=500.0),
            Step("h/ana", 6.0, role="guest", tier="ready", on=(0,), paused=True),
        ),
        expected=(PauseGuest(_k("g/md"), 0), ResumeGuest(_k("h/ana"), 0)),
    ),
    # No hint and only 20 ms of low utilization: wait, and look again at 500.05.
    Case(
        "unhinted I/O shorter than io_timeout keeps the guest paused",
        gpus=1,
        now=500.02,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,), io_since=500.0),
            Step("g/ana", 5.0, role="guest", tier="ready", on=(0,), started_at=50.0, paused=True),
        ),
        expected=(),
        next_check=500.05,
    ),
    # The primary computes again: the running guest is paused.
    Case(
        "a computing primary pauses its guest",
        gpus=1,
        now=600.0,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,)),
            Step("g/ana", 5.0, role="guest", tier="ready", on=(0,), started_at=50.0),
        ),
        expected=(PauseGuest(_k("g/ana"), 0),),
    ),
    # GPU 0 lost its primary: the better guest (ready before background) is promoted in
    # place; the other stays paused beside it.
    Case(
        "the best guest is promoted when the primary ends",
        gpus=1,
        now=700.0,
        steps=(
            Step(
                "s/sweep",
                1.0,
                priority=-5,
                role="guest",
                tier="background",
                on=(0,),
                started_at=10.0,
                paused=True,
            ),
            Step("g/ana", 5.0, role="guest", tier="ready", on=(0,), started_at=50.0, paused=True),
        ),
        expected=(Promote(_k("g/ana"), 0),),
    ),
    # GPU 0 lost its primary, but a waiting step outranks its guest (9 > 1) and no GPU is
    # free: the step becomes the primary and the guest stays loaded and paused beside it.
    Case(
        "a higher-priority waiting step takes the GPU instead of the guest's promotion",
        gpus=1,
        now=700.0,
        steps=(
            Step(
                "g/ana",
                5.0,
                priority=1,
                role="guest",
                tier="ready",
                on=(0,),
                started_at=50.0,
                paused=True,
            ),
            Step("u/urgent", 650.0, priority=9),
        ),
        expected=(Grant(_k("u/urgent"), (0,), "immediate"),),
    ),
    # A 2-GPU step cannot start: it holds the free GPU 1 and GPU 0 (no declared end, so
    # last), and the 1-GPU step behind it may not take GPU 1; it cannot wait loaded as a
    # guest either: beside big's 13 GiB only 3 GiB of a held GPU stay free.
    Case(
        "a multi-GPU step reserves GPUs that lower steps may not take",
        gpus=2,
        now=50.0,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,)),
            Step("big/train", 5.0, priority=10, gpus=2, gpu_memory=13 * GIB),
            Step("small/fit", 6.0),
        ),
        expected=(Reserve(_k("big/train"), (0, 1)),),
    ),
    # GPU 1 is held free for a 2-GPU step that outranks its loaded guest (and fits beside
    # it): the guest is not promoted (that would push the reservation back) but computes
    # alone there until big starts.
    Case(
        "a guest computes alone on a GPU held free for a multi-GPU step",
        gpus=2,
        now=50.0,
        steps=(
            Step("a/md", 0.0, role="primary", on=(0,)),
            Step("g/ana", 1.0, role="guest", tier="ready", on=(1,), paused=True),
            Step("big/train", 5.0, priority=10, gpus=2),
        ),
        expected=(Reserve(_k("big/train"), (0, 1)), ResumeGuest(_k("g/ana"), 1)),
    ),
    # One of two CPU slots is busy: the higher-priority cpu step starts, the other waits.
    Case(
        "cpu steps fill free CPU slots by rank",
        gpus=1,
        now=30.0,
        steps=(
            Step("p/prep", 0.0, type="cpu", gpus=0, gpu_memory=0, role="cpu"),
            Step("q/prep", 10.0, type="cpu", gpus=0, gpu_memory=0),
            Step("r/prep", 20.0, type="cpu", priority=5, gpus=0, gpu_memory=0),
        ),
        expected=(StartCpu(_k("r/prep")),),
    ),
    # A background sweep holds the only GPU: a gpu step arrives; the sweep steps aside as
    # a paused guest and the gpu step becomes the primary.
    Case(
        "background work is demoted for a gpu step",
        gpus=1,
        now=900.0,
        steps=(
            Step("s/sweep", 0.0, priority=-5, role="primary", tier="background", on=(0,)),
            Step("m/md", 800.0, priority=10),
        ),
        expected=(Demote(_k("s/sweep"), 0), Grant(_k("m/md"), (0,), "immediate")),
    ),
    # Equal priority: bob holds no GPU and ann holds one, so bob's later step goes first;
    # 12 GiB steps do not fit as guests on 16 GiB GPUs beside 12 GiB primaries.
    Case(
        "fair share gives the free GPU to the owner holding fewer",
        gpus=2,
        now=100.0,
        steps=(
            Step("a/md", 0.0, gpu_memory=12 * GIB, role="primary", on=(0,)),
            Step("x/md", 10.0, gpu_memory=12 * GIB),
            Step("y/md", 20.0, owner="bob", gpu_memory=12 * GIB),
        ),
        expected=(Grant(_k("y/md"), (1,), "immediate"),),
    ),
    # Ten hours of waiting is 20 aging points: the prio-0 step (eff 20) beats a fresh
    # prio-10 one for the only free GPU.
    Case(
        "aging lets an old low-priority step go first",
        gpus=1,
        now=36_000.0,
        steps=(
            Step("old/md", 0.0, gpu_memory=12 * GIB),
            Step("new/md", 35_990.0, priority=10, gpu_memory=12 * GIB),
        ),
        expected=(Grant(_k("old/md"), (0,), "immediate"),),
    ),
    # GPU 1 freed and nothing waits: of the two guests behind GPU 0's computing primary,
    # the better-ranked one that has not computed moves there (it starts again, alone);
    # the one that has computed stays (a restart would lose its work since its last
    # checkpoint), and so does the lower-ranked one (one GPU, one move).
    Case(
        "a guest that has not computed moves to a GPU that freed",
        gpus=2,
        now=100.0,
        steps=(
            Step("a/md", 0.0, gpu_memory=2 * GIB, role="primary", on=(0,)),
            Step(
                "g/md",
                5.0,
                priority=9,
                gpu_memory=2 * GIB,
                role="guest",
                tier="ready",
                on=(0,),
                paused=True,
                computed=True,
            ),
            Step("h/md", 6.0, gpu_memory=2 * GIB, role="guest", tier="ready", on=(0,), paused=True),
            Step(
                "i/md",
                7.0,
                priority=5,
                gpu_memory=2 * GIB,
                role="guest",
                tier="ready",
                on=(0,),
                paused=True,
            ),
        ),
        expected=(Move(_k("i/md"), 0, 1),),
    ),
    # A waiting step takes the free GPU first: the guest stays.
    Case(
        "a waiting step takes a freed GPU before a guest moves there",
        gpus=2,
        now=100.0,
        steps=(
            Step("a/md", 0.0, gpu_memory=2 * GIB, role="primary", on=(0,)),
            Step("g/md", 5.0, gpu_memory=2 * GIB, role="guest", tier="ready", on=(0,), paused=True),
            Step("x/md", 50.0, gpu_memory=2 * GIB),
        ),
        expected=(Grant(_k("x/md"), (1,), "immediate"),),
    ),
)
