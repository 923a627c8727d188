"""`m27 run --resume R --rerun STEP` end to end: a step that succeeded, whose command was
fixed since, runs again with the steps that read what it writes; the rest stays done."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state

pytestmark = pytest.mark.service

PIPELINE = textwrap.dedent("""\
    name: rerun
    pipeline:
      - name: prep
        type: cpu
        command: python -c "open('in.txt', 'w').write('VERSION')"
        output: in.txt
      - name: analyse
        type: cpu
        depends_on: [prep]
        command: python -c "print('read', open('in.txt').read())"
      - name: other
        type: gpu
        command: python -c "print('other ran')"
""")


def test_rerun_runs_the_fixed_step_and_the_steps_after_it_and_nothing_else(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(PIPELINE.replace("VERSION", "v1"))
    first = m27("run", str(spec), "--plain")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[analyse] read v1" in first.stdout
    spec.write_text(PIPELINE.replace("VERSION", "v2"))  # prep fixed after the run
    # a plain resume runs nothing, and says what would
    idle = m27("run", "--resume", "last", "--plain")
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert "(--rerun prep runs it and the steps after it)" in idle.stderr
    assert "--rerun STEP" in idle.stdout
    (old,) = node_state(m27_home).runs
    again = m27("run", "--resume", "last", "--rerun", "prep", "--plain")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        "m27 run: note: --rerun prep: it runs again from the start (no checkpoint of an "
        "earlier run is restored), and so does the step waiting on it: analyse"
    ) in again.stderr
    assert "[analyse] read v2" in again.stdout and "other ran" not in again.stdout
    state = node_state(m27_home)
    new = state.runs[next(r for r in state.runs if r != old)]
    assert new.resume_of == old and new.status == "succeeded" and new.rerun == ("prep",)
    assert {n: s.status for n, s in new.steps.items()} == {
        "prep": "succeeded",
        "analyse": "succeeded",
        "other": "skipped",
    }
    # a step name the pipeline lacks: nothing starts
    typo = m27("run", "--resume", new.run_id, "--rerun", "analyze", "--plain")
    assert typo.returncode == 2
    assert "pipeline 'rerun' has no step 'analyze' (did you mean 'analyse'?" in typo.stderr
    assert len(node_state(m27_home).runs) == 2
