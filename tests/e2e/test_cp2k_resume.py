"""CP2K as a black box: m27 captures the restart file CP2K rewrites, and a resume runs it
for the steps the input has left, with no frame written twice.

Real `cp2k` on the example's water molecule (DFT molecular dynamics, `examples/cp2k/`),
writing `water-1.restart` every 5 steps. A power cut (kill -9 of `m27 run` and of cp2k)
after two captures; `m27 run --resume` must put the newest capture back (or the newer
complete file CP2K wrote in the instant before the kill, captured first), run it with
STEPS set to what is left, and cut the energy and trajectory files back to that step, so
that `water-1.ener` holds steps 0 to the last, each once. With CI=true a missing `cp2k`
fails instead of skipping.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from m27.events import CheckpointRestored, StepFailed
from tests.e2e._helpers import M27, ROOT, events, file_captures, power_cut
from tests.services import need_program

pytestmark = [pytest.mark.service, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "cp2k"
STEPS, EVERY = 40, 5  # ~0.6 s a step on two idle cores

need_program("cp2k", "CP2K", "apt-get install cp2k")


@pytest.fixture(autouse=True)
def _fast_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M27_CAPTURE_POLL", "0.2")


def _ener_steps(path: Path) -> list[int]:
    rows = [line.split() for line in path.read_text().splitlines()]
    return [int(r[0]) for r in rows if r and not r[0].startswith("#")]


def test_power_cut_mid_cp2k_resumes_for_the_steps_left_with_no_frame_twice(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    out = tmp_path / "out"
    spec = tmp_path / "cp2k.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: cp2k-e2e
        pipeline:
          - name: aimd
            type: cpu
            workdir: {out}
            env: {{OMP_NUM_THREADS: "1"}}
            checkpoint: 1s
            command: cp2k -i {EXAMPLE / "water.inp"} -o water.out -E STEPS={STEPS}
        """)
    )
    power_cut(
        spec, m27_home, "aimd", lambda: len(file_captures(m27_home)) >= 2, "two captures", 300
    )
    steps = [e.engine_step for e in file_captures(m27_home)]
    assert all(s is not None and s % EVERY == 0 for s in steps) and steps == sorted(steps), steps
    assert steps[-1] is not None and steps[-1] < STEPS, "cp2k ended before the power cut"

    done = m27("run", "--resume", "last", "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    restored = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert len(restored) == 1 and restored[0].files == ("water-1.restart",)
    start = restored[0].engine_step
    assert start is not None and start % EVERY == 0 and steps[-1] <= start < STEPS, start
    assert (
        f"water-1.restart is at step {start} of {STEPS}: m27-resume.inp runs "
        f"{STEPS - start} more" in done.stdout
    ), done.stdout[-3000:]
    assert f"(step {start}); resuming with: -i m27-resume.inp" in done.stdout
    # the attempt that died wrote past the capture; those frames were cut, not repeated
    assert _ener_steps(out / "water-1.ener") == list(range(STEPS + 1))
    positions = (out / "water-pos-1.xyz").read_text()
    assert [
        int(line.split()[2].rstrip(",")) for line in positions.splitlines() if " i = " in line
    ] == list(range(STEPS + 1))


def _walltime_run(tmp_path: Path, walltime: int, each: int, steps: int) -> tuple[Path, Path]:
    """The example's input with `&GLOBAL WALLTIME` and a restart file every `each` MD
    steps, run for `steps` with `retries: 100`: the pipeline file and the step's folder."""
    text = (EXAMPLE / "water.inp").read_text()
    (tmp_path / "water.inp").write_text(
        text.replace("  PRINT_LEVEL LOW", f"  PRINT_LEVEL LOW\n  WALLTIME {walltime}").replace(
            "        MD 5\n", f"        MD {each}\n"
        )
    )
    out = tmp_path / "out"
    spec = tmp_path / "cp2k.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: cp2k-walltime
        pipeline:
          - name: aimd
            type: cpu
            workdir: {out}
            env: {{OMP_NUM_THREADS: "1"}}
            checkpoint: 1m
            retries: 100
            command: cp2k -i ../water.inp -o water.out -E STEPS={steps}
        """)
    )
    return spec, out


def test_attempts_cp2k_ended_at_its_walltime_fail_and_retries_go_on_to_the_end(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    """CP2K at its `&GLOBAL WALLTIME` ends the MD run early, writes its restart file and
    exits 0: the step counted as succeeded with part of its steps. Now the restart file
    short of STEPS fails the attempt, and `retries:` resumes it, to the last step."""
    steps = 20
    # a restart file at each step: an attempt that a loaded machine lets do fewer steps
    # than `&EACH MD 5` still leaves its progress to the next one
    spec, out = _walltime_run(tmp_path, walltime=5, each=1, steps=steps)
    done = m27("run", str(spec), "--plain", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    failed = [e for e in events(m27_home) if isinstance(e, StepFailed)]
    assert failed, done.stdout[-3000:]  # a machine that ran 20 steps in 5 s: none
    for e in failed:
        assert e.exit_code == 0
        assert re.match(rf"CP2K stopped after MD step \d+ of {steps} \(", e.reason), e.reason
    assert done.stdout.count("m27-resume.inp runs") == len(failed)
    assert _ener_steps(out / "water-1.ener") == list(range(steps + 1))


def test_an_attempt_that_ended_at_its_walltime_with_no_newer_restart_is_not_retried(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    """A WALLTIME shorter than `&EACH MD n` steps leaves no restart file: each next
    attempt began from the same point and stopped the same way, `retries: 100` times."""
    spec, _ = _walltime_run(tmp_path, walltime=3, each=1000, steps=STEPS)
    done = m27("run", str(spec), "--plain", timeout=600)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    (failed,) = [e for e in events(m27_home) if isinstance(e, StepFailed)]
    assert failed.exit_code == 0 and not failed.will_retry
    assert re.fullmatch(
        rf"CP2K stopped after MD step \d+ of {STEPS} \(no restart file\), before its last: .*; "
        "another attempt would stop the same way: it wrote no checkpoint since this one began",
        failed.reason,
    ), failed.reason
    assert not file_captures(m27_home)
