"""A second corpus of invalid pipelines (issue 15): hostile names and paths, values the run
could not use, deep nesting, bad text; and the sizes validation must take in its stride.

Each file in spec_invalid_more/ starts with its expected problems, one per line:
    # expect: LINE:COLUMN: FIELD: text      (FIELD `-` for a problem of the whole file)
`m27 validate FILE` must exit 2 and print each as ``FILE:LINE:COLUMN: FIELD: ...text...``,
and load_pipeline must report exactly these problems, no more.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from m27._exceptions import SpecError
from m27.cli.main import main
from m27.spec import load_pipeline, parse_pipeline
from m27.spec._model import find_cycles, topo_order

CORPUS = Path(__file__).parent / "spec_invalid_more"
FILES = sorted(CORPUS.glob("*.yaml"))
_EXPECT = re.compile(r"# expect: (\d+):(\d+): (\S+): (.+)")


def _expects(path: Path) -> list[tuple[int, int, str, str]]:
    out = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        match = _EXPECT.fullmatch(line)
        if not match:
            break
        field = "" if match[3] == "-" else match[3]
        out.append((int(match[1]), int(match[2]), field, match[4]))
    return out


def test_corpus_has_forty_more_kinds_each_with_expectations() -> None:
    assert len(FILES) >= 40
    for path in FILES:
        assert _expects(path), f"{path.name} has no '# expect:' header"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_validate_exits_2_and_names_file_line_column_and_field(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expects = _expects(path)
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    for line, column, field, text in expects:
        prefix = f"{path}:{line}:{column}: " + (f"{field}: " if field else "")
        assert any(row.startswith(prefix) and text in row for row in out.splitlines()), (
            f"expected {prefix}...{text!r}; got:\n{out}"
        )
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    found = [(p.line, p.column, p.field) for p in caught.value.problems]
    assert found == [(line, column, field) for line, column, field, _ in expects]


def _chain(count: int, reverse: bool) -> str:
    rows = [
        f"  - {{name: s{i}, type: cpu, command: 'true'"
        + (f", depends_on: [s{i - 1}]}}" if i else "}")
        for i in range(count)
    ]
    return "pipeline:\n" + "\n".join(reversed(rows) if reverse else rows) + "\n"


def test_a_1000_step_chain_listed_in_reverse_validates_in_dependency_order() -> None:
    pipeline = parse_pipeline(_chain(1000, reverse=True), "chain.yaml")
    assert pipeline.topo_order() == [f"s{i}" for i in range(1000)]


def test_a_5000_step_cycle_is_one_clean_problem() -> None:
    rows = [
        f"  - {{name: s{i}, type: cpu, command: 'true', depends_on: [s{(i + 1) % 5000}]}}"
        for i in range(5000)
    ]
    with pytest.raises(SpecError) as caught:
        parse_pipeline("pipeline:\n" + "\n".join(rows) + "\n", "cycle.yaml")
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (2, "pipeline[0].depends_on")
    assert problem.message.startswith("dependency cycle: s0 -> s1 -> s2")
    assert problem.message.endswith("s4999 -> s0")


def test_order_and_cycles_of_100000_steps_need_no_recursion() -> None:
    chain = {f"s{i}": ((f"s{i - 1}",) if i else ()) for i in range(100_000)}
    assert find_cycles(chain) == []
    assert topo_order(reversed(list(chain.items())))[:3] == ["s0", "s1", "s2"]
    ring = {f"s{i}": (f"s{(i + 1) % 100_000}",) for i in range(100_000)}
    (cycle,) = find_cycles(ring)
    assert len(cycle) == 100_001


@pytest.mark.slow
def test_a_100000_step_pipeline_validates() -> None:
    # Before issue 15 this met RecursionError, and ordering was quadratic. No duration is
    # asserted (a loaded CI machine); a quadratic step would run past pytest's timeout.
    pipeline = parse_pipeline(_chain(100_000, reverse=False), "big.yaml")
    assert len(pipeline.steps) == 100_000
    assert pipeline.topo_order()[-1] == "s99999"


def test_a_5_mb_one_line_command_is_split_without_shlex_and_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shlex

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("shlex reads one character per Python call: 658 s for 5 MB")

    monkeypatch.setattr(shlex, "split", forbidden)
    words = "x " * 2_500_000
    text = f'pipeline:\n  - name: a\n    type: cpu\n    command: echo "{words}" {words}\n'
    # split in ~0.5 s (no duration is asserted), then refused: no program could get it
    with pytest.raises(SpecError, match="argument 1 is 5,000,000 bytes; Linux starts no"):
        parse_pipeline(text, "big.yaml")
    text = f"pipeline:\n  - name: a\n    type: cpu\n    command: echo {words}\n"
    with pytest.raises(SpecError, match="the command's 2,500,001 arguments take 5,000,00"):
        parse_pipeline(text, "big.yaml")


def test_many_problems_are_bounded_and_counted(capsys: pytest.CaptureFixture[str]) -> None:
    keys = "".join(f"    unknown_{i}: 1\n" for i in range(5000))
    text = "pipeline:\n  - name: a\n    type: cpu\n    command: echo\n" + keys
    with pytest.raises(SpecError) as caught:
        parse_pipeline(text, "keys.yaml")
    assert len(caught.value.problems) == 1000 and caught.value.context["total"] == 5000
    assert str(caught.value).endswith("... and 4000 more problem(s)")


def test_validate_prints_fifty_problems_then_how_many_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.yaml"
    keys = "".join(f"    unknown_{i}: 1\n" for i in range(120))
    path.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: echo\n" + keys)
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 51 and lines[-1] == "... and 70 more problem(s)"


def test_run_of_a_bad_file_prints_the_same_bounded_problem_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.yaml"
    keys = "".join(f"    unknown_{i}: 1\n" for i in range(120))
    path.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: echo\n" + keys)
    assert main(["run", str(path)]) == 2  # refused before any service or log is touched
    lines = capsys.readouterr().err.splitlines()
    # every line `file:line:column: field: message`, as validate prints them (no `m27: `)
    assert lines[0].startswith(f"{path}:5:5: pipeline[0].unknown_0: unknown key")
    assert len(lines) == 52 and lines[-2:] == ["... and 70 more problem(s)", "120 problem(s) found"]


def test_allow_outside_and_absolute_paths_written_in_the_file_are_accepted(
    tmp_path: Path,
) -> None:
    text = (
        "vars: {OUT: /data/elsewhere, SUB: run1}\n"
        "pipeline:\n"
        "  - {name: a, type: cpu, command: echo, output: /abs/result.txt}\n"
        "  - {name: b, type: cpu, command: echo, output: '/scratch/{{SUB}}/x'}\n"
        "  - {name: c, type: cpu, command: echo, output: '{{OUT}}/x', allow_outside: true}\n"
        "  - {name: d, type: cpu, command: echo, workdir: sub, output: ../inside.txt}\n"
    )
    pipeline = parse_pipeline(text, tmp_path / "p.yaml")
    assert [s.outputs for s in pipeline.steps] == [
        ("/abs/result.txt",),
        ("/scratch/run1/x",),
        ("/data/elsewhere/x",),
        ("../inside.txt",),
    ]


def test_a_pipeline_from_stdin_is_refused_saying_why_not_no_such_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no file named `-` here
    assert main(["validate", "-"]) == 2
    shown = capsys.readouterr()
    err = shown.out + shown.err
    assert "-: cannot read the pipeline file: m27 reads a pipeline from a file, not from " in err
    assert "No such file" not in err
    (tmp_path / "-").write_text("steps:\n  - {name: a, type: cpu, command: 'true'}\n")
    assert main(["validate", "-"]) == 0  # a file that is named `-` is still read


def test_anchors_shared_by_thousands_of_steps_still_validate() -> None:
    """The alias check counts what aliases expand to, so sharing settings the way people do
    (one anchored step merged into every other, `&&` in commands) is far inside it."""
    rows = ["pipeline:", "  - &base {name: s0, type: cpu, command: 'true && true', shell: true}"]
    rows += [f"  - {{<<: *base, name: s{i}, depends_on: [s{i - 1}]}}" for i in range(1, 5000)]
    pipeline = parse_pipeline("\n".join(rows) + "\n", "shared.yaml")
    assert len(pipeline.steps) == 5000
    last = pipeline.step("s4999")
    assert (last.shell, last.depends_on) == (True, ("s4998",))


def _problems(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(SpecError) as caught:
        parse_pipeline(text, "expand.yaml")
    return [(p.line, p.field, p.message) for p in caught.value.problems]


def test_a_placeholder_repeated_until_a_field_is_megabytes_is_refused_before_it_is_built() -> None:
    """500 copies of a 10 kB value: 5 MB of command from a 3 kB line (a 100 kB value used
    5,000 times made a 30 kB file take 5 s and 500 MB before it was refused)."""
    text = (
        f"vars: {{V: '{'x' * 10_000}'}}\n"
        "steps:\n"
        f"  - {{name: a, type: cpu, command: 'echo{' {{V}}' * 500}'}}\n"
    )
    [(line, field, message)] = _problems(text)
    assert (line, field) == (3, "steps[0].command")
    assert "its variables make it 5,000,504 characters long" in message


def test_fields_that_expand_the_file_past_its_budget_are_refused_once() -> None:
    """3,000 environment values of 100 kB each, every one within bounds: 300 MB in all from
    a 200 kB file; one problem, where the budget ran out."""
    rows = [f"vars: {{V: '{'x' * 100_000}'}}", "steps:"]
    rows += [
        f"  - {{name: s{i}, type: cpu, command: 'true', env: {{A: '{{{{V}}}}'}}}}"
        for i in range(3000)
    ]
    [(line, field, message)] = _problems("\n".join(rows) + "\n")
    assert field.endswith(".env.A") and line == 3 + int(field[len("steps[") : field.index("]")])
    assert "more than the 268,435,456 a file of this size may expand to" in message


def test_a_long_value_is_quoted_by_its_start_and_length_in_every_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A 5,000-character value in each field was quoted whole in each problem: a screen of
    # `xxxx` per line, the field and the fix lost among them.
    long, key = "x" * 5000, "k" * 900
    path = tmp_path / "long.yaml"
    path.write_text(
        f"pipeline:\n  - name: {long}\n    type: {long}\n    gpus: {long}\n"
        f"    command: [echo, '{{{{{key}}}}}']\n    depends_on: [{long}]\n    timeout: {long}\n"
        f"    checkpoint: {long}\n    {key}: 3\n    priority: {long}\n"
    )
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    fields = ["name", "type", "gpus", "command[1]", "depends_on[0]", "timeout", "checkpoint"]
    for field in [*fields, "k" * 80 + "...", "priority"]:
        line = next(x for x in lines if f": pipeline[0].{field}: " in x)
        assert len(line) < 600, line  # the path, the start of the value, the fix
        assert "(5,000 characters)" in line or "(900 characters)" in line
    assert "unknown step type 'xxxxxxxx" in "\n".join(lines)


def test_a_whole_file_that_is_one_long_line_is_quoted_by_its_start(tmp_path: Path) -> None:
    path = tmp_path / "passwd.yaml"
    path.write_text("root:x:0:0:root:/root:/bin/bash " * 100)
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    (problem,) = caught.value.problems
    assert problem.message.startswith("the top level must be a mapping with `pipeline:`")
    assert problem.message.endswith("'... (3,199 characters)")  # trailing space dropped
    assert len(problem.message) < 200
