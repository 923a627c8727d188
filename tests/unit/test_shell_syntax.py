"""A command without `shell: true` means what it would mean to /bin/sh, or is refused.

m27 splits such a command like sh splits words, and runs no shell. Where sh would also act
on the text (a pipe, a redirection, `$HOME`, `*.txt`, `~`, a comment, a second line), the
step would run something else than its author meant and could still "succeed", so the
file is refused at validation. The property below holds the two halves together: whatever
`shell_syntax` lets through, m27 splits into exactly the arguments sh passes on.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m27._exceptions import SpecError
from m27.spec import parse_pipeline
from m27.spec._shell import shell_syntax
from m27.spec._template import split_words

_SPECIAL = "'\"\\$`;|&<>~#*?[](){}=!\n\t"


def _sh_words(text: str, cwd: Path) -> list[str]:
    """The arguments /bin/sh passes on for `text` (after a first word, so that a leading
    `NAME=` or keyword is an argument as in m27's check of every word but the first)."""
    done = subprocess.run(
        ["/bin/sh", "-c", "printf '%s\\0' START " + text],
        capture_output=True,
        cwd=cwd,  # empty: a pattern that slipped through would match nothing and stay
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"},
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, (text, done.stderr)
    return [w.decode() for w in done.stdout.split(b"\0")[1:-1]]


@pytest.fixture(scope="module")
def empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("empty")


_plain = st.text(alphabet="ab-=~#{}!", min_size=1, max_size=3)
_single = st.text(alphabet="ab " + _SPECIAL.replace("'", ""), max_size=4).map(lambda t: f"'{t}'")
_double = st.lists(
    st.one_of(
        st.text(alphabet="ab ';|&<>~#*?[](){}=!\n\t$", min_size=1, max_size=3),
        st.sampled_from(['\\"', "\\\\", "\\$", "\\`", "\\\n", "\\a"]),
    ),
    max_size=4,
).map(lambda parts: '"' + "".join(parts) + '"')
_escaped = st.sampled_from(_SPECIAL + "ab ").map(lambda c: "\\" + c)
_word = st.lists(st.one_of(_plain, _single, _double, _escaped), min_size=1, max_size=4)
_commands = st.lists(
    st.tuples(_word.map("".join), st.sampled_from([" ", "  ", "\t", " \\\n "])),
    min_size=1,
    max_size=5,
).map(lambda words: "".join(w + blank for w, blank in words))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(_commands, st.text(alphabet=list("ab -" + _SPECIAL), max_size=12)))
def test_what_passes_the_check_splits_as_sh_splits_it(empty_dir: Path, text: str) -> None:
    try:
        words = split_words(text)
    except ValueError:
        return  # an unclosed quote: refused as a problem of its own
    if shell_syntax(text) is None:
        assert words == _sh_words(text, empty_dir)


@pytest.mark.parametrize(
    ("command", "offset", "syntax", "kind"),
    [
        ("gmx energy -f ener.edr | tail -1", 23, "|", "an operator"),
        ("sleep 2; echo done", 7, ";", "an operator"),
        ("python x.py 2>&1", 13, ">&", "an operator"),
        ("python run.py (a)", 14, "(", "an operator"),
        ("gmx mdrun -ntomp $OMP_NUM_THREADS", 17, "$OMP_NUM_THREADS", "an expansion"),
        ('python x.py "$HOME/x"', 13, "$HOME", "an expansion"),
        ("echo $(date) `date`", 5, "$(", "an expansion"),
        ("echo $?", 5, "$?", "an expansion"),
        ("python plot.py data/*.csv", 20, "*", "a file-name pattern"),
        ("ls frame[0-9].pdb", 8, "[", "a file-name pattern"),
        ("ls ~/data", 3, "~", "a home directory"),
        ("python x.py # draft", 12, "#", "a comment"),
        ("OMP_NUM_THREADS=4 gmx mdrun", 0, "OMP_NUM_THREADS=", "a variable assignment"),
        ("gmx grompp\ngmx mdrun", 10, "\n", "a line break"),
        # after a backslash-newline, the place is still given in the text as written
        ("gmx mdrun \\\n  -ntomp $N", 21, "$N", "an expansion"),
    ],
)
def test_shell_syntax_is_found_where_it_stands(
    command: str, offset: int, syntax: str, kind: str
) -> None:
    found = shell_syntax(command)
    assert found is not None
    assert (found.offset, found.text, found.kind) == (offset, syntax, kind)
    assert command[offset:].startswith(syntax)


@pytest.mark.parametrize(
    "command",
    [
        "gmx mdrun -deffnm simulation -v",
        "grep -E 'a|b' f.txt",
        'echo "a; b > c" \\; \\| \\$HOME',
        "echo '$HOME' \"\\$HOME\" a~b a#b x=1 [a",
        "echo {{V}} ${{V}} --out={{OUT}}/x",  # placeholders: values are data
        "gmx mdrun \\\n  -deffnm md\n",  # a continued line, and the block's last newline
    ],
)
def test_plain_arguments_are_not_shell_syntax(command: str) -> None:
    assert shell_syntax(command) is None


def test_a_continued_line_joins_as_in_sh() -> None:
    assert split_words("gmx mdrun \\\n  -deffnm md \\\n  -v") == [
        "gmx",
        "mdrun",
        "-deffnm",
        "md",
        "-v",
    ]
    assert split_words("echo \"a\\\nb\" 'c\\\nd'") == ["echo", "ab", "c\\\nd"]
    assert split_words('echo "\\$HOME \\` \\a"') == ["echo", "$HOME ` \\a"]


def _pipeline(command: str, *, shell: bool = False) -> str:
    return (
        "pipeline:\n  - name: a\n    type: cpu\n"
        f"    shell: {'true' if shell else 'false'}\n"
        f"    command: |\n      {command}\n"
    )


def test_a_pipe_without_shell_is_refused_with_the_fix_and_runs_with_it() -> None:
    with pytest.raises(SpecError) as caught:
        parse_pipeline(_pipeline("echo hi | wc -c > out.txt"), "p.yaml")
    (problem,) = caught.value.problems
    assert (problem.line, problem.column, problem.field) == (6, 15, "pipeline[0].command")
    assert "'|' is shell syntax (an operator)" in problem.message
    assert "add `shell: true`" in problem.message
    step = parse_pipeline(_pipeline("echo hi | wc -c > out.txt", shell=True), "p.yaml").steps[0]
    assert step.argv[:2] == ("/bin/sh", "-c")


def test_commands_in_sequence_are_pointed_to_steps_of_their_own() -> None:
    with pytest.raises(SpecError) as caught:
        parse_pipeline(_pipeline("gmx grompp -o md.tpr && gmx mdrun -deffnm md"), "p.yaml")
    (problem,) = caught.value.problems
    assert "'&&' is shell syntax (an operator)" in problem.message
    assert "make each command a step of its own (depends_on orders them)" in problem.message


@pytest.mark.parametrize(
    "command",
    [
        'sh -c "for i in 1 2 3; do echo line $i; done"',
        "bash -lc 'module load gromacs && gmx mdrun -deffnm md | tee md.out'",
        'bash -e -o pipefail -c "gmx energy -f ener.edr | tail -1 > e.txt"',
        '/usr/bin/env bash -c "echo $HOME"',
        '/bin/dash -c "cd {{DIR}} && ls *.pdb"',
    ],
)
def test_the_script_of_sh_c_is_that_shells_to_read(command: str) -> None:
    """`sh -c SCRIPT` runs SCRIPT in a shell: its `$i` is that shell's loop variable, not
    syntax no shell acts on (refused, the fix offered, `shell: true`, made it worse: the
    outer shell then expanded `$i` to nothing before the inner one saw it)."""
    assert shell_syntax(command) is None


@pytest.mark.parametrize(
    ("command", "syntax"),
    [
        ('sh -c "echo $1" first $X', "$X"),  # after the script: an argument again
        ('bash -o pipefail -c "a | b" > out.txt', ">"),
        ("sh run.sh $X", "$X"),  # a script file, not -c
        ('sh -- -c "$X"', "$X"),  # after --, -c is the script file's argument
        ('python -c "print($X)"', "$X"),  # not a shell
    ],
)
def test_around_the_script_of_sh_c_shell_syntax_is_still_found(command: str, syntax: str) -> None:
    found = shell_syntax(command)
    assert found is not None and found.text == syntax


def test_a_loop_in_sh_c_runs_as_the_inner_shell_reads_it(tmp_path: Path) -> None:
    step = parse_pipeline(
        _pipeline('sh -c "for i in 1 2; do echo line $i; done > out.txt"'), "p.yaml"
    ).steps[0]
    subprocess.run(step.argv, cwd=tmp_path, check=True, timeout=30)
    assert (tmp_path / "out.txt").read_text() == "line 1\nline 2\n"
