"""`$NAME` in `env:` values, `workdir:` and `output:` is read from the environment m27
runs in, as sh reads it: `PATH: $HOME/bin:$PATH` gave the step the text `$HOME/bin:$PATH`
as its PATH, and `workdir: $SCRATCH/run1` named a folder called `$SCRATCH` inside the
pipeline's folder. A `{{VAR}}`'s value is data: a `$` in it stays as it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from m27.cli.commands._notes import environment_notes
from m27.executors.local import StepLaunch, run_step
from m27.spec import Pipeline, SpecError, load_pipeline
from m27.spec._environ import expand
from m27.spec._template import scan
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import PY

ENVIRON = {"HOME": "/home/ana", "SCRATCH": "/scratch/ana", "PATH": "/usr/bin:/bin", "E": ""}


@pytest.mark.parametrize(
    ("text", "expanded", "unset"),
    [
        ("$HOME/bin:$PATH", "/home/ana/bin:/usr/bin:/bin", []),
        ("${SCRATCH}_x/$SCRATCH", "/scratch/ana_x//scratch/ana", []),
        ("${NOPE:-/tmp/d}:${HOME:-x}:${E:-y}", "/tmp/d:/home/ana:y", []),
        ("${NOPE-/tmp/d}:${HOME-x}:${E-y}", "/tmp/d:/home/ana:", []),
        ("5$$ and $$HOME", "5$ and $HOME", []),
        ("$NOPE/x:$NOPE:${OTHER}", "/x::", ["NOPE", "OTHER"]),
        ("$1 $. $ a$", "$1 $. $ a$", []),  # not a name: as written
    ],
)
def test_references_expand_as_sh_reads_them(text: str, expanded: str, unset: list[str]) -> None:
    assert expand(text, [], ENVIRON) == (expanded, [], unset, None)


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        ("a/${unclosed", 2),
        ("x ${A:-${B:-$HOME}}", 2),
        ("$HOME/${1}", 6),
        ("${a:-" * 40000, 0),
        ("${a:-${a:-$a" * 20000, 0),
        ("${a:-$" + "A" * 100 + "/" * 2 + "x" * 200000, 0),
    ],
    ids=["unclosed", "three-levels", "not-a-name", "hostile", "hostile-nested", "hostile-long"],
)
def test_a_dollar_brace_that_starts_no_reference_is_found_where_it_is(
    text: str, offset: int
) -> None:
    """Left as written, `${A:-${B:-$HOME}}` became `${A:-${B:-/home/ana}}`. (The hostile
    texts, 200 KB of unclosed `${a:-`, took 50 s when a default was read with `[^}]*`: each
    read to the end; they are given up at once now, each loop of the pattern possessive.)"""
    assert expand(text, [], ENVIRON).malformed == offset


@pytest.mark.parametrize(
    ("text", "expanded", "unset"),
    [
        ("${DATA:-$SCRATCH/data}", "/scratch/ana/data", []),
        ("${DATA:-${SCRATCH}/data}:${HOME:-$NOPE}", "/scratch/ana/data:/home/ana", []),
        ("${A:-${B:-/tmp}}/x ${A:-${HOME:-/tmp}}", "/tmp/x /home/ana", []),
        ("${E:-$NOPE}|${E-$NOPE}", "|", ["NOPE"]),
        ("${A:-$$}${A:-a$$b}", "$a$b", []),
    ],
)
def test_a_default_may_name_other_variables_as_in_sh(
    text: str, expanded: str, unset: list[str]
) -> None:
    """`${DATA:-$SCRATCH/data}` is how job scripts write a default that depends on the
    machine; it was refused. A name in a default that is used and not set is noted, one in
    a default that is not used is not (sh does not read it either)."""
    assert expand(text, [], ENVIRON) == (expanded, [], unset, None)


def test_a_malformed_reference_is_a_problem_at_its_column(tmp_path: Path) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "env:\n  A: x${HOME:-${A:-$USER}}\npipeline:\n  - {name: a, type: cpu, command: x}\n"
    )
    with pytest.raises(SpecError) as refused:
        load_pipeline(spec, environ=ENVIRON)
    assert str(refused.value.problems[0]) == (
        f"{spec}:2:7: env.A: `${{` starts no environment variable m27 reads: write ${{NAME}}, "
        "${NAME:-default} or ${NAME-default} (a default may hold $NAME, ${NAME} or "
        "${NAME:-text}), or $${ for the text `${`"
    )
    spec.write_text(
        "env:\n  A: x$${HOME:-$$USER}\npipeline:\n  - {name: a, type: cpu, command: x}\n"
    )
    assert load_pipeline(spec, environ=ENVIRON).steps[0].env["A"] == "x${HOME:-$USER}"


def test_placeholders_keep_their_values_and_move_with_the_text() -> None:
    text = "$HOME/{{A}}-$SCRATCH-{{B}}"
    placeholders, _ = scan(text)
    out, moved, _, _ = expand(text, placeholders, ENVIRON)
    assert out == "/home/ana/{{A}}-/scratch/ana-{{B}}"
    assert [out[p.start : p.end] for p in moved] == ["{{A}}", "{{B}}"]


def _load(tmp_path: Path, body: str, **sets: str) -> Pipeline:
    spec = tmp_path / "p.yaml"
    spec.write_text(body)
    return load_pipeline(spec, sets, environ=ENVIRON)


def test_env_workdir_and_output_read_the_environment_and_values_stay_data(
    tmp_path: Path,
) -> None:
    pipeline = _load(
        tmp_path,
        "env:\n  PATH: $HOME/bin:$PATH\n  PRICE: 5$$\n"
        "workdir: $SCRATCH/run\n"
        "pipeline:\n"
        "  - name: a\n    type: cpu\n    command: run.sh\n"
        "    output: $SCRATCH/out/{{N}}.txt\n"
        "    env: {OWN: '{{N}}:${NOPE:-dflt}'}\n",
        N="$HOME",
    )
    (step,) = pipeline.steps
    assert dict(step.env) == {"PATH": "/home/ana/bin:/usr/bin:/bin", "PRICE": "5$",
                              "OWN": "$HOME:dflt"}  # fmt: skip
    # an expanded absolute path counts as written absolute: not outside the folder
    assert pipeline.workdir == Path("/scratch/ana/run")
    assert step.outputs == ("/scratch/ana/out/$HOME.txt",)
    assert pipeline.unset_env == ()


def test_a_relative_value_cannot_take_a_path_out_of_the_pipeline_s_folder(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text("pipeline:\n  - {name: a, type: cpu, command: x, output: $UP/x.txt}\n")
    with pytest.raises(SpecError, match="outside the pipeline's folder"):
        load_pipeline(spec, environ={"UP": "../.."})
    spec.write_text("workdir: $SCRATCH\npipeline:\n  - {name: a, type: cpu, command: x}\n")
    with pytest.raises(SpecError, match=r"workdir: must not be empty \(\$SCRATCH is not set"):
        load_pipeline(spec, environ={})


def test_an_unset_name_is_empty_and_noted_where_it_is_with_the_name_it_may_mean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = _load(
        tmp_path,
        "pipeline:\n  - name: a\n    type: cpu\n    command: x\n"
        "    env:\n      DATA: $SCRACH/data\n      LD_LIBRARY_PATH: /opt/lib:${LD_LIBRARY_PATH:-}\n",
    )
    assert pipeline.steps[0].env["DATA"] == "/data"
    assert pipeline.unset_env == ((6, "pipeline[0].env.DATA", "SCRACH"),)
    monkeypatch.setattr(os, "environ", dict(ENVIRON))
    monkeypatch.chdir(tmp_path)
    assert environment_notes(pipeline) == [
        "p.yaml:6: pipeline[0].env.DATA: $SCRACH is not set here, so it is empty (did you "
        "mean $SCRATCH?); write $$ for a `$` that is meant as text"
    ]


def test_the_step_s_programs_see_the_expanded_path(tmp_path: Path, m27_home: Path) -> None:
    """The stand-in `mytool` is found only through the folder the pipeline's PATH adds."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho from mytool\n")
    (tools / "mytool").chmod(0o755)
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "env:\n  PATH: $TOOLS:$PATH\npipeline:\n  - name: a\n    type: cpu\n    command: x\n"
    )
    pipeline = load_pipeline(spec, environ={**os.environ, "TOOLS": str(tools)})
    code = "import subprocess; print(subprocess.run(['mytool'], capture_output=True, text=True).stdout, end='')"
    store = MemoryEventStore()
    result = run_step(
        StepLaunch(run_id="r1", step="a", argv=(PY, "-c", code), env=pipeline.steps[0].env), store
    )
    assert result.ok, result.reason
    assert result.log_tail == "from mytool"


def test_references_count_toward_what_a_file_may_expand_to(tmp_path: Path) -> None:
    """A file of a few hundred bytes naming a 1 MiB variable thousands of times is
    refused where it passes the limit, before anything is built (as `{{VAR}}`s are)."""
    steps = "".join(
        f"  - {{name: s{i}, type: cpu, command: x, env: {{A: $BIG}}}}\n" for i in range(300)
    )
    spec = tmp_path / "p.yaml"
    spec.write_text("pipeline:\n" + steps)
    with pytest.raises(SpecError, match="more than the 268,435,456 a file of this size"):
        load_pipeline(spec, environ={"BIG": "x" * (1 << 20)})


def test_container_and_binds_take_variables_and_the_environment(tmp_path: Path) -> None:
    """`container: "{{IMG}}"` ran the image `{{IMG}}` (the field was taken as written), and
    `binds: [$SCRATCH/data:/data]` bound a folder named `$SCRATCH`."""
    body = (
        "vars: {IMG: /images/gmx.sif}\npipeline:\n  - name: a\n    type: cpu\n"
        '    container: "{{IMG}}"\n    binds: ["$SCRATCH/data:/data", "{{IN}}:/in:ro"]\n'
        "    command: x\n"
    )
    (step,) = _load(tmp_path, body, IN="/tmp/$HOME").steps
    assert step.container == "/images/gmx.sif"
    assert step.binds == ("/scratch/ana/data:/data", "/tmp/$HOME:/in:ro")
    with pytest.raises(SpecError, match=r"binds\[1\]: the value holds a NUL byte"):
        _load(tmp_path, body, IN="a\0b")


def test_a_default_that_names_the_environment_stays_as_written_and_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vars: {OUT: $SCRATCH/out}` made a folder named `$SCRATCH` for `{{OUT}}/x`: a
    value is data, never read again, so the note says where `$SCRATCH` is read."""
    body = (
        "vars:\n  OUT: $SCRATCH/out\n  PRICE: 5$$\npipeline:\n"
        "  - {name: a, type: cpu, command: x, output: '{{OUT}}/x', allow_outside: true}\n"
    )
    pipeline = _load(tmp_path, body)
    assert pipeline.steps[0].outputs == ("$SCRATCH/out/x",)
    assert pipeline.env_in_defaults == ((2, "vars.OUT", "SCRATCH"),)
    monkeypatch.chdir(tmp_path)
    assert environment_notes(pipeline) == [
        "p.yaml:2: vars.OUT: $SCRATCH stays as written: a variable's value is data, not read "
        "from the environment; write $SCRATCH where the value is used (env:, workdir:, "
        "output: read it), or give the value with --set (your shell reads $SCRATCH there)"
    ]
    assert _load(tmp_path, body, OUT="/scratch/ana/out").env_in_defaults == ()
