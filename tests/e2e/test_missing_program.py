"""`m27 run` says before the run starts which step's program is on no folder of PATH (the
step fails `command not found` when it starts, which may be hours in), and runs what it
can: an earlier step may install the program."""

from __future__ import annotations

from pathlib import Path

from tests.e2e._helpers import M27

MISSING = "m27-no-such-program"


def test_run_notes_a_missing_program_before_the_run_and_the_step_fails_as_noted(
    m27: M27, tmp_path: Path
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "name: p\nsteps:\n"
        "  - {name: prep, type: cpu, command: 'touch prepared'}\n"
        f"  - {{name: md, type: cpu, depends_on: [prep], command: '{MISSING} -v'}}\n"
        "  - {name: chk, type: cpu, checkpoint: 10s, command: 'touch chk'}\n"
    )
    done = m27("run", str(spec), "--plain", timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    note = (
        f"m27: note: {spec}:4: step md: '{MISSING}' is not on PATH here; the step fails "
        f"`command not found: {MISSING}` when it starts, unless an earlier step installs it"
    )
    assert note in done.stderr.splitlines()
    warning = (  # the same warning as `m27 validate`'s, before a run that would save nothing
        f"m27: warning: {spec}:5: step chk: checkpoint: has no effect: no recipe knows 'touch', "
        "there is no checkpoint.files, and the command does not appear to use m27.Checkpointer"
    )
    assert warning in done.stderr.splitlines()
    assert (tmp_path / "prepared").exists() and (tmp_path / "chk").exists()  # what could run, ran
    assert f"md: failed (attempt 1): command not found: {MISSING}" in done.stdout
