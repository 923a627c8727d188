"""`matrix:`: one step entry becomes a step per combination of values, each rendered with
its own values, and `depends_on` of the entry's name waits on the right instances."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m27._exceptions import SpecError
from m27.cli.main import main
from m27.spec import Pipeline, load_pipeline, parse_pipeline

REPLICAS = """
vars:
  SEEDS: "1 2 3"
steps:
  - name: prep
    type: cpu
    command: echo prep
  - name: md
    type: gpu
    depends_on: prep
    matrix:
      SEED: "{{SEEDS}}"
      T: [300, 310]
    workdir: rep/{{SEED}}-{{T}}
    env: {OMP_SEED: "{{SEED}}"}
    command: gmx mdrun -deffnm md -seed {{SEED}}
    output: md.xtc
  - name: per_seed
    type: cpu
    depends_on: md
    matrix: {SEED: "{{SEEDS}}"}
    command: python analyse.py rep/{{SEED}}-300/md.xtc rep/{{SEED}}-310/md.xtc
    output: "seed{{SEED}}.csv"
  - name: summary
    type: cpu
    depends_on: [per_seed]
    command: python summary.py
"""


def _parse(text: str, tmp_path: Path, **sets: str) -> Pipeline:
    return parse_pipeline(text, tmp_path / "p.yaml", sets)


def test_each_combination_is_a_step_named_by_its_values_in_loop_order(tmp_path: Path) -> None:
    p = _parse(REPLICAS, tmp_path)
    md = [s for s in p.steps if s.group == "md"]
    assert [s.name for s in md] == [
        "md.1.300",
        "md.1.310",
        "md.2.300",
        "md.2.310",
        "md.3.300",
        "md.3.310",
    ]
    one = p.step("md.2.310")
    assert one.argv == ("gmx", "mdrun", "-deffnm", "md", "-seed", "2")
    assert one.workdir == str(tmp_path / "rep" / "2-310")
    assert dict(one.env) == {"OMP_SEED": "2"}
    assert one.outputs == ("md.xtc",)  # one per workdir: no clash
    assert p.step("prep").group is None
    # the file's variables stay the file's: a matrix value is not one of them
    assert dict(p.vars) == {"SEEDS": "1 2 3"}


def test_depends_on_the_entry_pairs_shared_values_and_otherwise_waits_on_all(
    tmp_path: Path,
) -> None:
    p = _parse(REPLICAS, tmp_path)
    assert all(p.step(s.name).depends_on == ("prep",) for s in p.steps if s.group == "md")
    assert p.step("per_seed.2").depends_on == ("md.2.300", "md.2.310")
    assert p.step("summary").depends_on == ("per_seed.1", "per_seed.2", "per_seed.3")
    assert p.topo_order()[-1] == "summary"


def test_values_come_from_set_separated_by_blanks_or_commas(tmp_path: Path) -> None:
    p = _parse(REPLICAS, tmp_path, SEEDS="7,9")
    assert [s.name for s in p.steps if s.group == "per_seed"] == ["per_seed.7", "per_seed.9"]
    assert p.step("per_seed.9").outputs == ("seed9.csv",)


def test_an_instance_can_be_named_as_a_dependency(tmp_path: Path) -> None:
    text = (
        REPLICAS
        + """
  - name: first_only
    type: cpu
    depends_on: md.1.300
    command: echo
"""
    )
    assert _parse(text, tmp_path).step("first_only").depends_on == ("md.1.300",)


def test_rerun_of_the_entry_runs_every_instance_and_what_waits_on_them(tmp_path: Path) -> None:
    p = _parse(REPLICAS, tmp_path)
    assert p.rerun_steps(["per_seed"]) == ["per_seed.1", "per_seed.2", "per_seed.3", "summary"]
    assert p.rerun_steps(["md.3.310"]) == ["md.3.310", "per_seed.3", "summary"]
    with pytest.raises(KeyError, match="has no step 'mdd'"):
        p.rerun_steps(["mdd"])


def test_a_value_is_one_argument_even_with_shell_syntax_in_the_file(tmp_path: Path) -> None:
    """A matrix value is a variable's value: quoted for a shell like any other."""
    text = """
steps:
  - name: s
    type: cpu
    shell: true
    matrix: {X: [a.b, c-d]}
    command: echo {{X}} > out-{{X}}.txt
"""
    p = _parse(text, tmp_path)
    assert p.step("s.c-d").argv == ("/bin/sh", "-c", "echo 'c-d' > out-'c-d'.txt")


def test_a_problem_the_entry_has_whatever_its_values_is_said_once(tmp_path: Path) -> None:
    text = """
steps:
  - name: s
    type: cpu
    matrix: {X: [1, 2, 3, 4]}
    retries: many
    command: echo {{X}} {{TYPO}}
"""
    with pytest.raises(SpecError) as caught:
        _parse(text, tmp_path)
    messages = [p.message for p in caught.value.problems]
    assert len(messages) == 2, messages
    assert "undefined variable 'TYPO'" in messages[1]


def test_a_deployment_leaves_the_matrix_to_each_run(tmp_path: Path) -> None:
    """`m27 deploy` reads the file with `vars: {SEEDS:}` unset: the steps are made when a
    run gives SEEDS, so the deployment checks one step standing for them."""
    text = """
vars:
  SEEDS:
steps:
  - name: md
    type: gpu
    matrix: {SEED: "{{SEEDS}}"}
    command: echo {{SEED}}
  - name: after
    type: cpu
    depends_on: md
    command: echo
"""
    path = tmp_path / "p.yaml"
    deployed = parse_pipeline(text, path, {}, each_run=True)
    assert [s.name for s in deployed.steps] == ["md", "after"]
    assert deployed.step("md").argv == ("echo", "{{SEED}}")
    run = parse_pipeline(text, path, {"SEEDS": "4 5"})
    assert run.step("after").depends_on == ("md.4", "md.5")


def test_validate_counts_the_steps_each_matrix_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(REPLICAS)
    assert main(["validate", str(spec), "--set", "SEEDS=1,2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "OK: pipeline 'p' (8 steps; matrix: md 4, per_seed 2)"
    assert main(["validate", str(spec), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [(s["name"], s["matrix"]) for s in steps[:2]] == [("prep", None), ("md.1.300", "md")]


def test_validate_says_what_it_says_of_a_matrix_s_checkpoints_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "steps:\n  - name: md\n    type: gpu\n    matrix: {SEED: [1, 2, 3, 4]}\n"
        "    checkpoint: 5m\n    command: sleep {{SEED}}\n"
    )
    assert main(["validate", str(spec)]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if "checkpoint" in line]
    assert said[0] == "md.* (4 steps): checkpoint every 5m00s (no recipe)"
    assert len(said) == 2 and said[1].startswith("warning: md.* (4 steps): checkpoint: has no")


def test_a_matrix_shared_through_a_merge_key_and_the_step_s_own_wins(tmp_path: Path) -> None:
    text = """
steps:
  - &replicas
    name: md
    type: cpu
    matrix: {SEED: [1, 2]}
    command: echo {{SEED}}
  - <<: *replicas
    name: analyse
  - <<: *replicas
    name: short
    matrix: {SEED: [9]}
"""
    p = _parse(text, tmp_path)
    assert [s.name for s in p.steps] == ["md.1", "md.2", "analyse.1", "analyse.2", "short.9"]
    assert p.step("short.9").argv == ("echo", "9")


def test_the_gromacs_replicas_example_pairs_each_seed_s_steps() -> None:
    spec = Path(__file__).parents[2] / "examples" / "gromacs" / "replicas.yaml"
    p = load_pipeline(spec, {"SEEDS": "4 7"})
    assert p.step("md_simulation.7").depends_on == ("preprocessing.7",)
    assert p.step("md_simulation.7").workdir == str(spec.parent / "out" / "replicas" / "7")
    assert p.step("preprocessing.4").argv[-4:] == ("--seed", "4", "--out", "out/replicas/4")
    assert p.step("compare").depends_on == ("analysis.4", "analysis.7")


def test_pairing_is_by_table_and_a_cartesian_flood_of_dependencies_is_refused(
    tmp_path: Path,
) -> None:
    text = """
steps:
  - name: md
    type: cpu
    matrix: {A: "{{AS}}", B: [x, y]}
    command: echo {{A}} {{B}}
  - name: per
    type: cpu
    depends_on: md
    matrix: {A: "{{AS}}"}
    command: echo {{A}}
  - name: cross
    type: cpu
    depends_on: md
    matrix: {C: "{{CS}}"}
    command: echo {{C}}
"""
    many = " ".join(str(i) for i in range(5000))
    p = _parse(text, tmp_path, AS=many, CS="1")
    assert len(p.steps) == 15_001
    assert p.step("per.4321").depends_on == ("md.4321.x", "md.4321.y")
    assert len(p.step("cross.1").depends_on) == 10_000  # no name in common: all of them
    with pytest.raises(SpecError) as caught:
        _parse(text, tmp_path, AS=many, CS=" ".join(str(i) for i in range(101)))
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (14, "steps[2].depends_on")
    assert "its dependencies on matrix steps come to more than 1,000,000" in problem.message


def test_all_matrices_together_make_at_most_100_000_steps(tmp_path: Path) -> None:
    """A hostile file: one list of 10,000 values named by many steps' matrices."""
    values = ", ".join(str(i) for i in range(10_000))
    steps = "".join(
        f"  - {{name: s{i}, type: cpu, command: echo, matrix: {{A: *v}}}}\n" for i in range(1, 12)
    )
    text = (
        f"steps:\n  - {{name: s0, type: cpu, command: echo, matrix: {{A: &v [{values}]}}}}\n{steps}"
    )
    with pytest.raises(SpecError) as caught:
        _parse(text, tmp_path)
    (problem,) = caught.value.problems
    assert problem.line == 12  # s10: 110,000 with it
    assert problem.message == (
        "makes 10,000 steps, and the matrices before it 100,000: all of a file's matrices "
        "together may make 100,000"
    )


def test_exclude_leaves_out_the_combinations_it_names(tmp_path: Path) -> None:
    text = """
steps:
  - name: md
    type: cpu
    matrix:
      T: [300, 310, 320]
      P: "{{PS}}"
      exclude:
        - {T: 320, P: 2}
        - {T: "{{COLD}}"}
    command: echo {{T}} {{P}}
  - name: per_t
    type: cpu
    depends_on: md
    matrix: {T: [310, 320]}
    command: echo {{T}}
"""
    p = _parse(text, tmp_path, PS="1 2", COLD="300")
    assert [s.name for s in p.steps if s.group == "md"] == ["md.310.1", "md.310.2", "md.320.1"]
    assert p.step("per_t.320").depends_on == ("md.320.1",)
    # an exclusion a run's values do not meet leaves everything in
    p = _parse(text, tmp_path, PS="5", COLD="200")
    assert [s.name for s in p.steps if s.group == "md"] == ["md.300.5", "md.310.5", "md.320.5"]
