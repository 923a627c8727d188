"""An mdrun that stops before its last step and still exits 0: at `-maxh` (a job
script's habit, for a cluster's time limit), or on a TERM that m27 did not send. Such a
step counted as succeeded: the steps after it analysed part of a trajectory, and without
`output: simulation.gro` (mdrun writes it only at its end) nothing said so."""

from __future__ import annotations

import pytest

from m27.executors.engines import plan_checkpoint, stopped_early
from m27.executors.local import run_step
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import launch

#: The end of `gmx mdrun -maxh 0.002` (GROMACS 2022, Debian): exit code 0.
MAXH_TAIL = [
    "starting mdrun 'SPC/E water'",
    "200000 steps,    400.0 ps.",
    "",
    "Step 15325: Run time exceeded 0.002 hours, will terminate the run within 25 steps",
    "",
    "               Core t (s)   Wall t (s)        (%)",
    "       Time:       14.303        7.151      200.0",
    "Performance:      370.930        0.065",
    "",
    'GROMACS reminds you: "Everything He Lacks, He Makes Up In Denial" (Offspring)',
]


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        (
            MAXH_TAIL,
            "mdrun stopped at -maxh, its run time limit, at step 15325, before its last step",
        ),
        (
            ["Received the TERM signal, stopping within 100 steps", "", "Performance: 1"],
            "mdrun stopped on SIGTERM, which m27 did not send, before its last step",
        ),
        (["Writing final coordinates.", "Performance: 370.930 0.065"], None),
        ([], None),
    ],
    ids=["maxh", "signal", "to-the-end", "nothing"],
)
def test_how_mdrun_stopped_is_read_from_its_output(tail: list[str], said: str | None) -> None:
    assert stopped_early(tail) == said


def test_validate_says_what_maxh_does_to_the_step() -> None:
    plan = plan_checkpoint(["gmx", "mdrun", "-deffnm", "md", "-maxh", "23.5"], 300.0)
    assert (
        "-maxh 23.5: mdrun stops after 23.5 h, before its last step, and exits 0; m27 counts "
        "that attempt failed, and a resume or `retries:` goes on from its checkpoint (m27's "
        "own checkpoints and Slurm's time-limit signal make -maxh unneeded)"
    ) in plan.notes


def test_an_attempt_that_stopped_at_maxh_failed_though_it_exited_0() -> None:
    printed = "; ".join(f"print({line!r})" for line in MAXH_TAIL)
    result = run_step(launch(printed), MemoryEventStore())
    assert not result.ok
    assert result.reason == (  # without `checkpoint:` a retry would begin again
        "mdrun stopped at -maxh, its run time limit, at step 15325, before its last step; "
        "another attempt would start over and stop the same way: the step has no `checkpoint:`"
    )
    whole = run_step(launch("print('Writing final coordinates.')"), MemoryEventStore())
    assert whole.ok
