"""Every file in spec_invalid/ is rejected with exactly the problems its header expects.

Header lines, at the top of each file:
    # set: NAME=VALUE                       an override passed like `--set`
    # expect: LINE:COLUMN: text             a problem at LINE:COLUMN whose message contains text
A file lists every problem it has, so a missing report and a spurious one both fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from m27._exceptions import M27Error, SpecError
from m27.spec import Problem, load_pipeline, parse_set_args

CORPUS = Path(__file__).parent / "spec_invalid"
FILES = sorted(CORPUS.glob("*.yaml"))
_EXPECT = re.compile(r"# expect: (\d+):(\d+): (.+)")


def _problems(error: SpecError) -> list[Problem]:
    problems: list[Problem] = error.context["problems"]  # also error.problems
    assert problems == getattr(error, "problems", None)
    return problems


def _header(path: Path) -> tuple[list[str], list[tuple[int, int, str]]]:
    sets: list[str] = []
    expects: list[tuple[int, int, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# set: "):
            sets.append(line.removeprefix("# set: "))
        elif match := _EXPECT.fullmatch(line):
            expects.append((int(match[1]), int(match[2]), match[3]))
        else:
            break
    return sets, expects


def test_corpus_is_large_and_every_file_states_its_expectations() -> None:
    assert len(FILES) >= 25
    for path in FILES:
        assert _header(path)[1], f"{path.name} has no '# expect:' header"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_invalid_file_reports_exactly_the_expected_problems(path: Path) -> None:
    sets, expects = _header(path)
    with pytest.raises(SpecError) as caught:
        load_pipeline(path, parse_set_args(sets))
    problems = _problems(caught.value)
    found = [f"{p.line}:{p.column}: {p.message}" for p in problems]
    for line, column, text in expects:
        assert any((p.line, p.column) == (line, column) and text in p.message for p in problems), (
            f"expected {line}:{column}: {text!r} in {path.name}; got:\n" + "\n".join(found)
        )
    assert len(problems) == len(expects), "unexpected extra problems:\n" + "\n".join(found)
    assert all(p.file == str(path) for p in problems)


def test_several_problems_in_one_file_are_all_reported_in_file_order() -> None:
    path = CORPUS / "many_problems.yaml"
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    problems = _problems(caught.value)
    assert len(problems) == 9
    assert [(p.line, p.column) for p in problems] == sorted((p.line, p.column) for p in problems)
    fields = {p.field for p in problems}
    assert {"pipeline[1].depends_on[1]", "pipeline[1].comand", "pipeline[3].name"} <= fields


def test_spec_error_message_is_every_problem_one_per_line() -> None:
    path = CORPUS / "many_problems.yaml"
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    error = caught.value
    assert isinstance(error, M27Error)
    assert str(error).splitlines() == [str(p) for p in _problems(error)]
    assert str(_problems(error)[0]) == (
        f"{path}:14:29: pipeline[0].command: undefined variable 'INPUT'; "
        "define it with `--set INPUT=...` or under vars:"
    )


def test_unknown_dependency_suggests_the_closest_step_name() -> None:
    with pytest.raises(SpecError) as caught:
        load_pipeline(CORPUS / "unknown_dependency.yaml")
    assert _problems(caught.value)[0].message == (
        "unknown dependency 'preprocesing'; did you mean 'preprocessing'?"
    )


def test_cycle_is_printed_as_a_path_back_to_its_start() -> None:
    with pytest.raises(SpecError) as caught:
        load_pipeline(CORPUS / "dependency_cycle.yaml")
    assert _problems(caught.value)[0].message == "dependency cycle: a -> c -> b -> a"


def test_missing_file_is_a_spec_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        load_pipeline(missing)
    assert str(missing) in str(caught.value)
    assert "No such file" in _problems(caught.value)[0].message


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["NOEQUALS"], "command line: --set NOEQUALS: expected NAME=VALUE"),
        (["1BAD=x"], "command line: --set 1BAD=x: bad variable name '1BAD'"),
        (["A-B=x"], "bad variable name 'A-B'"),
    ],
)
def test_bad_set_argument_is_rejected(items: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_set_args(items)


def test_set_arguments_keep_values_verbatim_and_last_wins() -> None:
    values = parse_set_args(["A=1", "B=x=y", "C=", "A={{B}} $(id)", "D= spaced "])
    assert values == {"A": "{{B}} $(id)", "B": "x=y", "C": "", "D": " spaced "}


def test_override_with_bad_name_passed_directly_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("pipeline:\n  - {name: a, type: cpu, command: echo}\n")
    with pytest.raises(SpecError, match="bad variable name 'not ok'"):
        load_pipeline(path, {"not ok": "x"})
