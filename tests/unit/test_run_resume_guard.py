"""`m27 run FILE --resume RUN` with RUN of another pipeline (`--resume last` after some
other pipeline ran): its succeeded steps would have been skipped wherever FILE has a step
of the same name, and their checkpoints restored into other programs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from m27._exceptions import SpecError
from m27.cli.commands._prepare import Prepared, prepare
from m27.events import RunFailed, RunSubmitted, StepSucceeded
from m27.store.sqlite import open_store

STEP = "  - {name: prep, type: cpu, command: 'true'}\n"


def _ran(home: Path, spec: Path, pipeline: str, values: dict[str, str] | None = None) -> None:
    """A finished run of `pipeline` from `spec` (with `values` set) whose step prep
    succeeded."""
    now = time.time()
    store = open_store(home)
    store.append(
        [
            RunSubmitted(
                now,
                "r1",
                pipeline=pipeline,
                spec_path=str(spec),
                steps=("prep",),
                vars=values or {},
            ),
            StepSucceeded(now, "r1", "prep", 1, 0.1),
            RunFailed(now, "r1", 0.1, reason="stopped"),
        ]
    )
    store.close()


def _prepare(file: Path) -> Prepared:
    return prepare(
        argparse.Namespace(sets=[], resume="r1", file=str(file), rerun=[], dry_run=False)
    )


def _refused(home: Path, tmp_path: Path, md_vars: str, values: dict[str, str]) -> tuple[Path, Path]:
    """`m27 run other.yaml --resume r1`, r1 a run of md.yaml (`md_vars` its `vars:` line,
    `values` the run's), refused with exit 2: (md.yaml, other.yaml)."""
    md = tmp_path / "md.yaml"
    md.write_text(f"name: md\n{md_vars}steps:\n" + STEP)
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nsteps:\n" + STEP)
    _ran(home, md, "md", values)
    with pytest.raises(SystemExit) as exited:
        _prepare(other)
    assert exited.value.code == 2
    return md, other


def test_a_run_of_another_pipeline_is_refused_with_both_names(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md, other = _refused(m27_home, tmp_path, "", {})
    err = capsys.readouterr().err
    assert f"run r1 is of pipeline 'md' ({md}), {other} is pipeline 'other'" in err
    assert "give it `name: md`" in err


def test_a_run_of_another_pipeline_with_variables_is_refused_for_that_not_for_them(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run's X=deep would go to other.yaml, which has no X: the reason to give is
    # that it is another pipeline, not "no variable 'X'" about a --set never typed
    md, other = _refused(m27_home, tmp_path, "vars: {X: shallow}\n", {"X": "deep"})
    err = capsys.readouterr().err
    assert f"run r1 is of pipeline 'md' ({md}), {other} is pipeline 'other'" in err
    assert "variable" not in err


def test_a_copy_of_the_pipeline_without_the_runs_variable_names_the_variable(
    m27_home: Path, tmp_path: Path
) -> None:
    md = tmp_path / "md.yaml"
    md.write_text("name: md\nvars: {X: shallow}\nsteps:\n" + STEP)
    copy = tmp_path / "copy.yaml"
    copy.write_text("name: md\nsteps:\n" + STEP)
    _ran(m27_home, md, "md", {"X": "deep"})
    with pytest.raises(SpecError, match="no variable 'X'"):
        _prepare(copy)


def test_the_same_file_with_its_name_edited_still_resumes(m27_home: Path, tmp_path: Path) -> None:
    md = tmp_path / "md.yaml"
    md.write_text("name: md\nsteps:\n" + STEP)
    _ran(m27_home, md, "md")
    # (and a step added: with every step done, a resume has nothing to run)
    md.write_text("name: md-v2\nsteps:\n" + STEP + "  - {name: sim, type: cpu, command: 'true'}\n")
    pipeline, _, resume_of, _ = _prepare(md)
    assert (pipeline.name, resume_of) == ("md-v2", "r1")
