"""A variable's value is data, never code: it cannot add arguments, run commands or expand
other variables, with or without `shell: true`."""

from __future__ import annotations

import ast
import glob
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m27._exceptions import SpecError
from m27.spec import Step, parse_pipeline
from m27.spec._template import shell_quote

NASTY = [
    "; touch canary",
    "x; touch canary #",
    "$(touch canary)",
    "`touch canary`",
    "' ; touch canary ; '",
    '" ; touch canary ; "',
    "\ntouch canary\n",
    "a && touch canary || touch canary",
    "| touch canary",
    "'\"'\"'$(touch canary)'\"'\"'",
    "\\'; touch canary; \\'",
    "{{OTHER}}",
    "../../etc/passwd",
    "two words  and\ttabs",
    "",
    "-rf",
    "PATH=/tmp/evil",
    "~root",
    "*",
    "$HOME ${HOME} $((1+1))",
    "héllo wörld ☃",
]

hostile = st.one_of(
    st.sampled_from(NASTY),
    # NUL and lone surrogates are refused at validation (tests below), never substituted.
    st.text(
        alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
        max_size=40,
    ),
    st.text(alphabet="\n'\"$()`;|&{}\\ #<>*~=-abcX", max_size=30),
)
PRINT_ARGS = f"{shlex.quote(sys.executable)} -S -c 'import sys; print(repr(sys.argv[1:]))'"


def _step(command: str, value: str, *, shell: bool = False, other: str = "EXPANDED") -> Step:
    text = (
        "vars: {OTHER: null}\n"  # declared: --set of a variable the file never names is refused
        "pipeline:\n  - name: s\n    type: cpu\n"
        f"    shell: {'true' if shell else 'false'}\n"
        f"    command: {_yaml_str(command)}\n"
        "    output: 'out/{{V}}.txt'\n"
        "    allow_outside: true\n"  # a value may climb out of out/; argv is the subject
        "    env: {VALUE: '{{V}}'}\n"
    )
    return parse_pipeline(text, "p.yaml", {"V": value, "OTHER": other}).steps[0]


def _yaml_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run(argv: tuple[str, ...], cwd: Path) -> list[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True, timeout=30)
    received = ast.literal_eval(done.stdout)
    assert isinstance(received, list)
    return received


@settings(max_examples=300, deadline=None)
@given(value=hostile)
def test_value_is_exactly_one_argument(value: str) -> None:
    step = _step("echo {{V}}", value)
    assert step.argv == ("echo", value)
    assert step.outputs == (f"out/{glob.escape(value)}.txt",)  # a literal path, not a glob
    assert step.env["VALUE"] == value


@settings(max_examples=200, deadline=None)
@given(value=hostile)
def test_value_stays_inside_the_argument_it_was_written_in(value: str) -> None:
    step = _step("""cmd --flag={{V}} "in {{ V }} quotes" 'single {{V}}' {{V}}{{V}}""", value)
    assert step.argv == (
        "cmd",
        f"--flag={value}",
        f"in {value} quotes",
        f"single {value}",
        value * 2,
    )


@settings(max_examples=200, deadline=None)
@given(value=hostile)
def test_shell_command_gets_the_value_single_quoted(value: str) -> None:
    step = _step("echo {{V}} | cat", value, shell=True)
    assert step.argv == ("/bin/sh", "-c", f"echo {shell_quote(value)} | cat")


def test_a_placeholder_inside_a_value_is_not_expanded_again() -> None:
    assert _step("echo {{V}}", "{{OTHER}}").argv == ("echo", "{{OTHER}}")
    assert _step("echo {{V}}", "{{OTHER}}", shell=True).argv[2] == "echo '{{OTHER}}'"


def test_a_lone_surrogate_in_a_value_is_rejected_before_it_reaches_a_process() -> None:
    with pytest.raises(SpecError, match="lone surrogate"):
        _step("echo {{V}}", "a\ud800b")


def test_nul_byte_in_a_value_is_rejected_not_truncated() -> None:
    with pytest.raises(SpecError, match="NUL byte"):
        _step("echo {{V}}", "a\0b")


@pytest.mark.parametrize("shell", [False, True])
def test_a_value_too_long_for_one_argument_is_a_problem_not_a_failed_exec(
    shell: bool, tmp_path: Path
) -> None:
    """Linux refuses one argument of 128 KiB or more (E2BIG): said when the file is read,
    with its size, instead of `cannot execute: Argument list too long` at the step."""
    fits = "é" * 50_000  # 100,000 bytes in UTF-8
    assert _step("echo {{V}}", fits, shell=shell).argv[-1].endswith(fits + ("'" if shell else ""))
    with pytest.raises(SpecError) as error:
        _step("echo {{V}}", "é" * 70_000, shell=shell)  # 140,000 bytes
    what = "the script" if shell else "argument 1"
    assert f"{what} is 140,0" in str(error.value) and "128 KiB" in str(error.value)
    if not shell:  # what Linux does with it
        with pytest.raises(OSError, match="Argument list too long"):
            subprocess.run(["echo", "é" * 70_000], check=False, cwd=tmp_path)


@pytest.mark.parametrize("value", NASTY, ids=range(len(NASTY)))
def test_child_process_receives_the_value_verbatim_and_nothing_runs(
    value: str, tmp_path: Path
) -> None:
    step = _step(PRINT_ARGS + " {{V}}", value)
    assert _run(step.argv, tmp_path) == [value]
    assert not (tmp_path / "canary").exists()


@pytest.mark.parametrize("value", NASTY, ids=range(len(NASTY)))
def test_shell_child_receives_the_value_verbatim_and_nothing_runs(
    value: str, tmp_path: Path
) -> None:
    command = PRINT_ARGS + ' {{V}} "$(printf %s {{V}})" --x={{V}}'
    step = _step(command, value, shell=True)
    # $(...) output loses trailing newlines, as in any shell; the plain arguments do not
    assert _run(step.argv, tmp_path) == [value, value.rstrip("\n"), f"--x={value}"]
    assert not (tmp_path / "canary").exists()


@settings(max_examples=40, deadline=None)
@given(
    value=st.text(
        alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
        max_size=30,
    )
)
def test_shell_round_trip_of_any_text(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert _run(_step(PRINT_ARGS + " {{V}}", value, shell=True).argv, Path(tmp)) == [value]


# Fragments that sit in argument position after `echo`; a fragment that starts a new line
# ends with `echo` again, so no value is ever word-split into a command name on purpose.
FRAGMENTS = [
    "{{V}}",
    "x{{V}}y",
    '"{{V}}"',
    "'{{V}}'",
    "$(echo {{V}})",
    '"$(echo {{V}})"',
    "`echo {{V}}`",
    '"`echo {{V}}`"',
    "${UNSET:-{{V}}}",
    '"${UNSET:-{{V}}}"',
    "$(({{V}}))",
    "\\{{V}}",
    "${{V}}",
    "# {{V}}\necho",
    "<<EOF\n{{V}}\nEOF\necho",
    "$(case a in a) echo {{V}};; esac)",
    '"$(case a in a) echo "{{V}}";; esac)"',
    "'",
    '"',
    "\\",
    ")",
    "$(",
    "$'\\''",
]
SHELLS = [sh for sh in ("/bin/sh", shutil.which("bash")) if sh]
PAYLOADS = [v for v in NASTY if "canary" in v]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fragments=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4),
    value=st.sampled_from(PAYLOADS),
)
def test_no_accepted_shell_template_lets_a_value_run(fragments: list[str], value: str) -> None:
    command = "echo " + " ".join(fragments)
    try:
        step = _step(command, value, shell=True)
    except SpecError:
        return  # refused at validation: the user is told to move the placeholder
    for shell in SHELLS:  # bash too: /bin/sh is bash on many clusters
        with tempfile.TemporaryDirectory() as tmp:
            argv = [shell, "-c", step.argv[2]]
            subprocess.run(argv, cwd=tmp, capture_output=True, timeout=30, check=False)
            assert not (Path(tmp) / "canary").exists(), argv


@pytest.mark.parametrize(
    "command",
    [
        "echo {{V}}",
        'echo "$(echo {{V}})"',
        "(echo {{V}})",
        "echo $(case a in a) echo {{V}};; esac)",
    ],
)
def test_safe_shell_places_are_accepted(command: str) -> None:
    assert _step(command, "v", shell=True).argv[0] == "/bin/sh"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("echo '{{V}}'", "inside quotes"),
        ('echo "{{V}}"', "inside quotes"),
        ("echo `cat {{V}}`", "inside `...`"),
        ("echo ${X:-{{V}}}", "inside `...`, ${...}"),
        ("echo $(({{V}}))", "$((...))"),
        ("echo hi # {{V}}", "comment"),
        ("cat <<EOF\n{{V}}\nEOF", "here-document"),
        ("echo \\{{V}}", "backslash"),
        ("echo ${{V}}", "follows '$'"),
        ("echo $'\\'' {{V}}", "$'...'"),
    ],
)
def test_unsafe_shell_places_are_refused_with_the_reason(command: str, reason: str) -> None:
    with pytest.raises(SpecError, match=re.escape(reason)):
        _step(command, "v", shell=True)
