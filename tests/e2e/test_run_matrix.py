"""Replicas with `matrix:` end to end: each instance runs in its own folder with its own
value, the step after them waits on all of them, and a resume reruns only the replica that
failed (`--rerun md` all of them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state

pytestmark = pytest.mark.service

PIPELINE = textwrap.dedent("""\
    name: replicas
    vars:
      SEEDS: "1 2 3"
    pipeline:
      - name: md
        type: gpu
        matrix: {SEED: "{{SEEDS}}"}
        workdir: rep/{{SEED}}
        command: python ../../md.py {{SEED}}
        output: out.txt
      - name: summary
        type: cpu
        depends_on: md
        command: python -c "import glob; print('sum', sorted(open(f).read() for f in glob.glob('rep/*/out.txt')))"
""")
# seed 2 fails while the file `broken` is there
MD = "import os, sys\nif sys.argv[1] == '2' and os.path.exists('../../broken'): sys.exit(3)\nopen('out.txt', 'w').write(sys.argv[1])\n"


def test_replicas_run_apart_and_a_resume_reruns_only_the_failed_one(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(PIPELINE)
    (tmp_path / "md.py").write_text(MD)
    (tmp_path / "broken").touch()
    first = m27("run", str(spec), "--plain")
    assert first.returncode == 1, first.stdout + first.stderr
    (old,) = node_state(m27_home).runs
    steps = {n: s.status for n, s in node_state(m27_home).runs[old].steps.items()}
    assert steps["md.1"] == steps["md.3"] == "succeeded" and steps["md.2"] == "failed"
    assert steps["summary"] != "succeeded"
    assert (tmp_path / "rep" / "3" / "out.txt").read_text() == "3"
    # the entry's name is not a step of the run: say which steps it made
    logs = m27("logs", "last", "md")
    assert logs.returncode == 2
    assert "its matrix made the steps md.1, md.2, md.3: name one" in logs.stderr

    (tmp_path / "broken").unlink()
    again = m27("run", "--resume", "last", "--plain")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "sum ['1', '2', '3']" in again.stdout
    state = node_state(m27_home)
    new = state.runs[next(r for r in state.runs if r != old)]
    assert {n: s.status for n, s in new.steps.items()} == {
        "md.1": "skipped",
        "md.2": "succeeded",
        "md.3": "skipped",
        "summary": "succeeded",
    }

    plan = m27("run", "--resume", new.run_id, "--rerun", "md", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "--rerun md: it runs again from the start" in plan.stderr
    assert "and so does the step waiting on it: summary" in plan.stderr
    rows = {line.split()[0]: line for line in plan.stdout.splitlines()[1:] if line.strip()}
    assert all("(--rerun)" in rows[f"md.{n}"] for n in (1, 2, 3))
