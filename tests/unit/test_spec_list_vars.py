"""A variable whose `vars:` value is a list (`TEMPS: [300, 310]`) gives one argument per
value where it stands alone in a command without a shell: `mpirun -np 2 gmx_mpi mdrun
-multidir {{TEMPS}}` had its folders written out, since a value is always one argument
(`-multidir "300 310"`). Its values are data as every value is, and `--set TEMPS=300,320`
changes them; anywhere else the list is a problem that says where it may stand."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27._exceptions import SpecError
from m27.spec import Pipeline, parse_pipeline

REMD = """\
name: remd
vars:
  TEMPS: [300, 310]
pipeline:
  - name: prepare
    type: cpu
    matrix: {T: "{{TEMPS}}"}
    command: python prepare.py --temperature {{T}} --out {{T}}
  - name: remd
    type: gpu
    depends_on: [prepare]
    command: mpirun -np 2 gmx_mpi mdrun -multidir {{TEMPS}} -deffnm simulation
  - name: listed
    type: cpu
    command: [echo, "{{TEMPS}}", end]
"""


def _parse(text: str, tmp_path: Path, **sets: str) -> Pipeline:
    return parse_pipeline(text, tmp_path / "p.yaml", sets)


def _argv(p: Pipeline, step: str) -> tuple[str, ...]:
    argv = p.step(step).argv
    assert argv is not None
    return argv


def test_a_list_variable_alone_is_one_argument_per_value(tmp_path: Path) -> None:
    p = _parse(REMD, tmp_path)
    assert _argv(p, "remd") == (
        "mpirun", "-np", "2", "gmx_mpi", "mdrun",
        "-multidir", "300", "310", "-deffnm", "simulation",
    )  # fmt: skip
    assert _argv(p, "listed") == ("echo", "300", "310", "end")
    assert [s.name for s in p.steps if s.group == "prepare"] == ["prepare.300", "prepare.310"]
    # what a run records, Prefect's parameters and `m27 status` show: one text
    assert p.vars["TEMPS"] == "300 310" and p.lists == ("TEMPS",)


@pytest.mark.parametrize("given", ["300,320,330", "300 320 330", " 300, 320 ,330 "])
def test_set_gives_a_list_variable_its_values(tmp_path: Path, given: str) -> None:
    p = _parse(REMD, tmp_path, TEMPS=given)
    assert _argv(p, "remd")[5:9] == ("-multidir", "300", "320", "330")
    assert [s.name for s in p.steps if s.group == "prepare"] == [
        "prepare.300",
        "prepare.320",
        "prepare.330",
    ]


def test_a_recorded_value_renders_as_the_default_did(tmp_path: Path) -> None:
    """A resume renders the file again with the run's recorded values (text)."""
    first = _parse(REMD, tmp_path)
    again = _parse(REMD, tmp_path, **first.vars)
    assert [_argv(again, s.name) for s in again.steps] == [
        _argv(first, s.name) for s in first.steps
    ]


def test_values_are_data_one_argument_each(tmp_path: Path) -> None:
    text = REMD.replace("[300, 310]", "[';', '$(reboot)', '`id`', \"'\"]")
    text = text.replace('    matrix: {T: "{{TEMPS}}"}\n', "").replace("{{T}}", "x")
    p = _parse(text, tmp_path)
    assert _argv(p, "remd")[6:10] == (";", "$(reboot)", "`id`", "'")


def test_set_with_no_values_is_a_problem_at_each_use(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        _parse(REMD.replace('    matrix: {T: "{{TEMPS}}"}\n', "").replace("{{T}}", "x"),
               tmp_path, TEMPS=" , ")  # fmt: skip
    said = [p.message for p in caught.value.problems]
    assert said == ["{{TEMPS}} has no values: give them as `--set TEMPS=a,b`"] * 2


def test_a_quoted_list_variable_is_a_problem_not_one_argument(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        _parse(REMD.replace("-multidir {{TEMPS}}", '-multidir "{{TEMPS}}"'), tmp_path)
    (problem,) = caught.value.problems
    assert problem.field == "pipeline[1].command"
    assert problem.message.startswith("{{TEMPS}} is a list variable: it can stand only as a whole")
