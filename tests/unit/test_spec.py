"""Valid pipeline files load into the model the flow and the agent rely on."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from m27._exceptions import SpecError
from m27.cli.commands import validate
from m27.spec import Pipeline, Step, load_pipeline, overrides_from, parse_pipeline
from m27.units import format_duration, parse_duration
from tests.seed import SEED


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _one_step(tmp_path: Path, body: str, head: str = "", **overrides: str) -> Step:
    text = head + "pipeline:\n  - name: s\n" + "".join(f"    {line}\n" for line in body.split("\n"))
    return load_pipeline(_write(tmp_path, text), overrides).steps[0]


def test_seed_file_loads_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path, SEED, "md_pipeline.yaml")
    pipeline = load_pipeline(path, {"INPUT_FILE": "x.pdb"})
    assert pipeline.name == "md_pipeline"
    assert pipeline.path == path.resolve()
    assert pipeline.workdir == tmp_path.resolve()
    assert pipeline.vars == {"INPUT_FILE": "x.pdb"}
    pre, md, ana = pipeline.steps
    assert pre.argv == ("python", "prepare_pdb.py", "--input", "x.pdb")
    assert pre.command == "python prepare_pdb.py --input {{INPUT_FILE}}"
    assert pre.outputs == ("/tmp/preprocessed.pdb",)
    assert (pre.type, pre.gpus, pre.checkpoint, pre.line) == ("cpu", 0, None, 2)
    assert md.depends_on == ("preprocessing",)
    assert md.checkpoint == 300.0
    assert md.argv == ("gmx", "mdrun", "-deffnm", "simulation", "-v")
    assert (md.type, md.gpus, md.line) == ("gpu", 1, 6)
    assert (ana.type, ana.gpus, ana.depends_on) == ("gpu_light", 1, ("md_simulation",))
    assert all(s.executor == "local" and s.retries == 0 and not s.shell for s in pipeline.steps)
    assert pipeline.topo_order() == ["preprocessing", "md_simulation", "analysis"]
    assert pipeline.dependents("preprocessing") == {"md_simulation", "analysis"}
    assert pipeline.dependents("analysis") == set()


def test_seed_file_without_its_variable_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"--set INPUT_FILE=\.\.\."):
        load_pipeline(_write(tmp_path, SEED))


FULL = """\
name: md-study
priority: 5
workdir: runs
executor: slurm
vars:
  INPUT: default.pdb
  TEMP: 300.10
  OUTDIR: out
  REQUIRED:
env:
  OMP_NUM_THREADS: 4
  DATA: /data/{{INPUT}}
steps:
  - name: prep
    type: cpu
    command: [python, prep.py, "--in={{INPUT}}", "{{ TEMP }}"]
    output: ["{{OUTDIR}}/a.pdb", "{{OUTDIR}}/b.pdb"]
    env: {DATA: "override-{{REQUIRED}}", EXTRA: "1"}
    retries: 3
    retry_delay: 30s
    timeout: 1h
    priority: -2
    executor: local
  - name: sim
    type: gpu
    depends_on: prep
    gpus: 2
    gpu_memory: 8GiB
    checkpoint: 1500ms
    workdir: /scratch/{{INPUT}}
    slurm: {partition: gpu, time: "02:00:00", cpus: 1}
    container: docker://gromacs:2024
    binds: [/data, /scratch]
    shell: true
    command: gmx mdrun -s {{INPUT}} | tee log.txt
"""


def test_mapping_form_with_every_key(tmp_path: Path) -> None:
    pipeline = load_pipeline(_write(tmp_path, FULL), {"INPUT": "given.pdb", "REQUIRED": "r"})
    assert pipeline.name == "md-study"
    assert pipeline.priority == 5
    assert pipeline.workdir == (tmp_path / "runs").resolve()
    assert pipeline.vars == {
        "INPUT": "given.pdb",
        "TEMP": "300.10",
        "OUTDIR": "out",
        "REQUIRED": "r",
    }
    prep, sim = pipeline.steps
    assert prep.command == ("python", "prep.py", "--in={{INPUT}}", "{{ TEMP }}")
    assert prep.argv == ("python", "prep.py", "--in=given.pdb", "300.10")
    assert prep.outputs == ("out/a.pdb", "out/b.pdb")
    assert dict(prep.env) == {"OMP_NUM_THREADS": "4", "DATA": "override-r", "EXTRA": "1"}
    assert (prep.retries, prep.timeout, prep.priority, prep.executor) == (3, 3600.0, 3, "local")
    assert (prep.retry_delay, sim.retry_delay) == (30.0, 0.0)
    assert prep.workdir == str((tmp_path / "runs").resolve())
    assert dict(sim.env) == {"OMP_NUM_THREADS": "4", "DATA": "/data/given.pdb"}
    assert (sim.gpus, sim.gpu_memory, sim.checkpoint) == (2, 8 * 1024**3, 1.5)
    assert sim.workdir == "/scratch/given.pdb"
    assert (sim.priority, sim.executor) == (5, "slurm")
    assert dict(sim.slurm) == {"partition": "gpu", "time": "02:00:00", "cpus": 1}
    assert (sim.container, sim.binds) == ("docker://gromacs:2024", ("/data", "/scratch"))
    assert sim.argv == ("/bin/sh", "-c", "gmx mdrun -s 'given.pdb' | tee log.txt")


def test_set_overrides_vars_defaults_and_defaults_fill_the_rest(tmp_path: Path) -> None:
    head = "vars:\n  A: from-file\n  B: 7\n"
    step = _one_step(tmp_path, "type: cpu\ncommand: run {{A}} {{B}}", head, A="from-set")
    assert step.argv == ("run", "from-set", "7")


def test_null_var_is_declared_but_must_be_set(tmp_path: Path) -> None:
    head = "vars:\n  NEEDED:\n"
    # (it said `undefined variable 'NEEDED'; define it ... or under vars:`, where it is)
    said = "variable 'NEEDED' has no value: `vars:` declares it without one, so each run must"
    with pytest.raises(SpecError, match=said):
        _one_step(tmp_path, "type: cpu\ncommand: run {{NEEDED}}", head)
    assert _one_step(tmp_path, "type: cpu\ncommand: run {{NEEDED}}", head, NEEDED="x").argv == (
        "run",
        "x",
    )


def test_a_deployment_leaves_a_variable_without_a_value_to_each_run(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "vars:\n  NEEDED:\n  UNUSED:\n  KEPT: k\npipeline:\n  - name: s\n    type: cpu\n"
        "    command: run {{NEEDED}} {{KEPT}}\n    workdir: out/{{NEEDED}}\n"
    )
    pipeline = load_pipeline(path, each_run=True)
    assert pipeline.unset == ("NEEDED",)  # UNUSED: no run needs it
    assert dict(pipeline.vars) == {"KEPT": "k"}  # no stand-in among the values
    assert pipeline.steps[0].argv == ("run", "{{NEEDED}}", "k")  # as written, for each run
    assert load_pipeline(path, {"NEEDED": "x"}, each_run=True).unset == ()
    with pytest.raises(SpecError, match="has no value"):
        load_pipeline(path)  # a run must give it
    # the rest of the file is still checked
    path.write_text("vars:\n  NEEDED:\npipeline:\n  - name: s\n    type: tpu\n    command: x\n")
    with pytest.raises(SpecError, match="type"):
        load_pipeline(path, each_run=True)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("5ms", "a checkpoint every '5ms' is more often than once a second"),
        ("0.5s", "a checkpoint every '0.5s' is more often than once a second"),
        ("'{{C}}'", "a checkpoint every '200ms' is more often than once a second"),
        ("{every: 10ms}", "a checkpoint every '10ms' is more often than once a second"),
    ],
)
def test_a_checkpoint_more_often_than_once_a_second_is_refused(
    tmp_path: Path, written: str, said: str
) -> None:
    """`checkpoint: 5ms` (a typo for 5m) was taken: a GROMACS step then ran `-cpt
    8.33333e-05`, a checkpoint file every step, each one captured."""
    head = "vars:\n  C: 200ms\n"
    with pytest.raises(SpecError) as caught:
        _one_step(tmp_path, f"type: cpu\ncommand: 'true'\ncheckpoint: {written}", head)
    assert said in str(caught.value)
    assert ("(did you mean '5m'?)" in str(caught.value)) == (written == "5ms")


def test_a_default_naming_another_variable_is_a_problem_not_literal_text(
    tmp_path: Path,
) -> None:
    """`TPR: "{{OUT}}/sim.tpr"` validated, and the step got `{{OUT}}/sim.tpr` as written (a
    default is not a template). Now a problem at the default, unless `--set` gives the
    variable (the default is then not used)."""
    head = "vars:\n  A: 'x/{{ B }}'\n  B: b\n  C:\n  D: '{{C}}'\n"
    spec = _write(tmp_path, head + "pipeline:\n  - {name: s, type: cpu, command: 'echo {{A}}'}\n")
    with pytest.raises(SpecError) as caught:
        load_pipeline(spec, {"C": "c"})
    assert [(p.line, p.column, p.field, p.message) for p in caught.value.problems] == [
        (
            2,
            6,
            "vars.A",
            "its default names {{B}}, but a default is not a template: the steps would get "
            "'x/{{ B }}' as written; put it in the step's field instead, or write the value out",
        ),
        (
            5,
            6,
            "vars.D",
            "its default names {{C}}, but a default is not a template: the steps would get "
            "'{{C}}' as written; put it in the step's field instead, or write the value out",
        ),
    ]
    given = load_pipeline(spec, {"A": "{{B}}", "C": "c", "D": "d"})  # --set: never expanded
    assert given.step("s").argv == ("echo", "{{B}}")


def test_a_default_placeholder_naming_no_variable_stays_literal_text(tmp_path: Path) -> None:
    head = "vars:\n  FMT: '{{.Names}} {{ OTHER }}'\n"
    step = _one_step(tmp_path, "type: cpu\ncommand: docker ps --format {{FMT}}", head)
    assert step.argv == ("docker", "ps", "--format", "{{.Names}} {{ OTHER }}")


@pytest.mark.parametrize(
    ("field", "written", "expected"),
    [
        ("checkpoint", "2500ms", 2.5),
        ("checkpoint", "300s", 300.0),
        ("checkpoint", "5m", 300.0),
        ("checkpoint", "1h", 3600.0),
        ("checkpoint", "90", 90.0),
        ("checkpoint", "5m00s", 300.0),  # as `m27 validate` writes it back
        ("timeout", "1.5", 1.5),
        ("timeout", "1h30m", 5400.0),
        ("timeout", "1d 12h", 129600.0),
        ("timeout", "2h03m", 7380.0),
        ("gpu_memory", "128KB", 128 * 1024),
        ("gpu_memory", "8GiB", 8 * 1024**3),
        ("gpu_memory", "512MiB", 512 * 1024**2),
        ("gpu_memory", "4096", 4096),
    ],
)
def test_durations_and_sizes_are_parsed(
    tmp_path: Path, field: str, written: str, expected: float
) -> None:
    step = _one_step(tmp_path, f"type: gpu\ncommand: x\n{field}: {written}")
    assert getattr(step, field) == expected


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("30m1h", "the parts go from days down to milliseconds, each once"),
        ("5m5m", "the parts go from days down to milliseconds, each once"),
        ("1h30", "use e.g. 50ms, 300s, 5m, 1h30m"),
        ("5 minutes", "use e.g. 50ms, 300s, 5m, 1h30m"),
    ],
)
def test_a_compound_duration_out_of_order_or_unfinished_is_refused(
    tmp_path: Path, written: str, problem: str
) -> None:
    with pytest.raises(SpecError) as caught:
        _one_step(tmp_path, f"type: gpu\ncommand: x\ntimeout: {written}")
    assert f"p.yaml:5:14: pipeline[0].timeout: not a duration: '{written}' (" in str(caught.value)
    assert problem in str(caught.value)


def test_every_duration_m27_prints_reads_back_as_itself() -> None:
    for seconds in (0.25, 12.5, 245.0, 3600.0, 7380.0, 90000.0):
        assert parse_duration(format_duration(seconds)) == seconds


def test_plain_scalars_are_taken_as_written_not_as_yaml_types(tmp_path: Path) -> None:
    assert _one_step(tmp_path, "type: cpu\ncommand: true").argv == ("true",)
    step = _one_step(tmp_path, "type: cpu\ncommand: [sleep, 5.10, yes, 0x1F]")
    assert step.argv == ("sleep", "5.10", "yes", "0x1F")


def test_steps_alias_and_bare_list_are_accepted(tmp_path: Path) -> None:
    alias = load_pipeline(_write(tmp_path, "steps:\n  - {name: a, type: cpu, command: x}\n"))
    bare = load_pipeline(_write(tmp_path, "- {name: a, type: cpu, command: x}\n", "bare.yml"))
    assert [s.name for s in alias.steps] == [s.name for s in bare.steps] == ["a"]
    assert bare.name == "bare"


def test_yaml_anchors_and_merge_keys_share_step_settings(tmp_path: Path) -> None:
    text = (
        "pipeline:\n"
        "  - &gpu {name: a, type: gpu, command: x, retries: 2, gpus: 2}\n"
        "  - <<: *gpu\n"
        "    name: b\n"
        "    depends_on: a\n"
    )
    b = load_pipeline(_write(tmp_path, text)).step("b")
    assert (b.type, b.retries, b.gpus, b.depends_on) == ("gpu", 2, 2, ("a",))


def test_topo_order_keeps_file_order_among_ready_steps(tmp_path: Path) -> None:
    text = "pipeline:\n" + "".join(
        f"  - {{name: {name}, type: cpu, command: x, depends_on: [{deps}]}}\n"
        for name, deps in [
            ("report", "merge"),
            ("fetch_b", ""),
            ("merge", "fetch_a, fetch_b"),
            ("fetch_a", ""),
            ("lint", ""),
        ]
    )
    pipeline = load_pipeline(_write(tmp_path, text))
    assert pipeline.topo_order() == ["fetch_b", "fetch_a", "merge", "report", "lint"]
    assert pipeline.dependents("fetch_a") == {"merge", "report"}
    assert pipeline.dependents("lint") == set()


def test_a_dependency_named_twice_counts_once_in_the_order_first_given(tmp_path: Path) -> None:
    """(Repeats are found through a dict now: a step of 2,000 dependencies, each looked up
    in a list, made `m27 validate` of a 2,000-step file take 18 s instead of 7.)"""
    text = "pipeline:\n" + "".join(
        f"  - {{name: {name}, type: cpu, command: x, depends_on: [{deps}]}}\n"
        for name, deps in [("a", ""), ("b", ""), ("c", "b, a, b, a, b")]
    )
    assert load_pipeline(_write(tmp_path, text)).step("c").depends_on == ("b", "a")


def test_step_lookup_by_name(tmp_path: Path) -> None:
    pipeline = load_pipeline(_write(tmp_path, SEED), {"INPUT_FILE": "a"})
    assert pipeline.step("analysis").line == 11
    with pytest.raises(KeyError, match="no step 'nope'"):
        pipeline.step("nope")
    with pytest.raises(KeyError):
        pipeline.dependents("nope")


def test_model_is_immutable(tmp_path: Path) -> None:
    pipeline = load_pipeline(_write(tmp_path, SEED), {"INPUT_FILE": "a"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.steps[0].name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        pipeline.steps[0].env["X"] = "1"  # type: ignore[index]
    assert isinstance(pipeline, Pipeline)


def test_relative_step_workdir_is_resolved_against_the_file_directory(tmp_path: Path) -> None:
    step = _one_step(tmp_path, "type: cpu\ncommand: x\nworkdir: sub/{{D}}", D="d1")
    assert step.workdir == str(tmp_path.resolve() / "sub" / "d1")


def test_parse_pipeline_uses_the_path_for_name_and_messages(tmp_path: Path) -> None:
    pipeline = parse_pipeline(SEED, tmp_path / "from_text.yaml", {"INPUT_FILE": "a"})
    assert pipeline.name == "from_text"
    with pytest.raises(SpecError, match=r"^inline\.yaml:1:1: "):
        parse_pipeline("just text\n", "inline.yaml")


def test_same_output_in_different_workdirs_does_not_clash(tmp_path: Path) -> None:
    text = (
        "pipeline:\n"
        "  - {name: a, type: cpu, command: x, output: r.txt, workdir: /w/a}\n"
        "  - {name: b, type: cpu, command: x, output: r.txt, workdir: /w/b}\n"
    )
    assert [s.outputs for s in load_pipeline(_write(tmp_path, text)).steps] == [("r.txt",)] * 2


def test_empty_optional_sections_mean_not_given(tmp_path: Path) -> None:
    text = "name:\nvars:\nenv:\npriority:\npipeline:\n  - {name: a, type: cpu, command: x, env: }\n"
    pipeline = load_pipeline(_write(tmp_path, text))
    assert (pipeline.name, pipeline.priority, dict(pipeline.steps[0].env)) == ("p", 0, {})


def _validate(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="m27")
    validate.register(parser.add_subparsers())
    args = parser.parse_args(["validate", *argv])
    code: int = args.func(args)
    return code


def test_validate_command_prints_ok_and_the_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, SEED, "seed.yaml")
    assert _validate(str(path), "--set", "INPUT_FILE=x.pdb") == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "OK: pipeline 'seed' (3 steps)",
        "order: preprocessing -> md_simulation -> analysis",
    ]  # then what `checkpoint:` does (tests/unit/test_engines.py)
    assert _validate(str(path), "--set", "INPUT_FILE=x.pdb", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is True
    assert result["order"] == ["preprocessing", "md_simulation", "analysis"]
    assert result["steps"][0]["argv"] == ["python", "prepare_pdb.py", "--input", "x.pdb"]


def test_validate_shows_a_long_order_in_one_line_a_terminal_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = "".join(
        f"  - {{name: s{i}, type: cpu, command: 'true'"
        + (f", depends_on: [s{i - 1}]}}\n" if i else "}\n")
        for i in range(500)
    )
    path = _write(tmp_path, "name: chain\npipeline:\n" + steps)
    assert _validate(str(path)) == 0
    order = capsys.readouterr().out.splitlines()[1]
    shown = " -> ".join(f"s{i}" for i in range(10))
    assert order == f"order: {shown} -> ... (488 more) -> s498 -> s499"
    assert _validate(str(path), "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["order"]) == 500


def test_validate_counts_one_step_as_one_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "name: one\npipeline:\n  - {name: a, type: cpu, command: 'true'}\n")
    assert _validate(str(path)) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["OK: pipeline 'one' (1 step)", "order: a"]


def test_validate_command_lists_every_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "pipeline:\n  - {name: a, type: gpux, command: x}\n  - {name: b, type: cpu}\n"
    path = _write(tmp_path, text)
    assert _validate(str(path)) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{path}:2:21: pipeline[0].type: unknown step type 'gpux'; did you mean 'gpu'?",
        f"{path}:3:5: pipeline[1].command: missing required key 'command'",
    ]
    assert _validate(str(path), "--json") == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [(p["line"], p["column"], p["field"]) for p in problems] == [
        (2, 21, "pipeline[0].type"),
        (3, 5, "pipeline[1].command"),
    ]


def test_validate_command_rejects_a_bad_set_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _validate(str(_write(tmp_path, SEED)), "--set", "INPUT_FILE") == 2
    assert "expected NAME=VALUE" in capsys.readouterr().out


def test_output_paths_are_absolute_from_each_steps_workdir(tmp_path: Path) -> None:
    spec = tmp_path / "lab" / "p.yaml"
    spec.parent.mkdir()
    spec.write_text(
        "pipeline:\n"
        "  - name: a\n    type: cpu\n    command: 'true'\n    output: [out/x.npz, ./y.csv]\n"
        "  - name: b\n    type: cpu\n    command: 'true'\n    workdir: run\n    output: z.log\n"
    )
    pipeline = load_pipeline(spec, {})
    lab = str(spec.parent.resolve())
    assert pipeline.output_paths() == [f"{lab}/out/x.npz", f"{lab}/y.csv", f"{lab}/run/z.log"]


def test_flow_overrides_take_text_numbers_and_booleans_and_name_the_rest() -> None:
    """What Prefect's UI may send as a deployment run's `overrides` (JSON)."""
    assert overrides_from(None) == {}
    assert overrides_from({"A": "x", "N": 5, "F": 2.5, "B": True}) == {
        "A": "x",
        "N": "5",
        "F": "2.5",
        "B": "true",
    }
    with pytest.raises(SpecError) as caught:
        overrides_from({"L": [1], "Z": None, "I": float("inf"), "OK": "y"})
    assert [str(p) for p in caught.value.problems] == [
        "flow parameters: overrides.L: must be text or a number, got list",
        "flow parameters: overrides.Z: must be text or a number, got null",
        "flow parameters: overrides.I: must be text or a number, got inf",
    ]
    with pytest.raises(SpecError, match="overrides: must be a mapping of NAME to value, got str"):
        overrides_from("A=x")
