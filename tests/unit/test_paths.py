"""Names never lead a path out of its root (issue 15): m27.paths and every place m27
builds a path from a step name or run id."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m27._exceptions import PathError, SpecError
from m27.checkpoint import artifact_key
from m27.node.agent import channel_path
from m27.paths import NAME_MAX, join_under, m27_home, name_problem, slug
from m27.spec import parse_pipeline

ROOT = Path(__file__).resolve().parents[2]


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=80), st.text(max_size=20))
def test_random_step_names_never_make_a_path_outside_its_root(name: str, run: str) -> None:
    root = "/srv/m27-home"
    for parts in [("checkpoints", run, name), ("runs", run, f"{name}.log"), (f"{name}.slurm",)]:
        try:
            path = join_under(root, *parts)
        except PathError:
            continue
        joined = os.path.normpath(path)
        assert joined.startswith(root + "/"), (parts, joined)
        assert len(Path(joined).relative_to(root).parts) == len(parts)  # one level per part


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_a_name_the_spec_accepts_is_always_one_plain_path_part(name: str) -> None:
    text = f"pipeline:\n  - {{name: {_quoted(name)}, type: cpu, command: echo}}\n"
    try:
        step = parse_pipeline(text, "p.yaml").steps[0]
    except SpecError:
        return
    assert name_problem(step.name) is None and len(step.name) <= NAME_MAX
    assert join_under("/h", "checkpoints", "r1", step.name).parent == Path("/h/checkpoints/r1")


def _quoted(text: str) -> str:
    return '"' + text.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "", "a\0b", "x" * 256])
def test_join_under_refuses_a_part_that_is_not_one_plain_component(bad: str) -> None:
    with pytest.raises(PathError):
        join_under("/h", "checkpoints", bad)


def test_a_site_may_move_a_folder_under_the_root_elsewhere_by_a_link(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "home" / "checkpoints").symlink_to(tmp_path / "scratch")
    path = join_under(tmp_path / "home", "checkpoints", "r1", "a")
    assert path == tmp_path / "home" / "checkpoints" / "r1" / "a"


def test_channel_and_artifact_names_stay_confined() -> None:
    assert channel_path(Path("/h"), ("r1", "a.b")) == Path("/h/channels/r1/a.b.chan")
    with pytest.raises(PathError):
        channel_path(Path("/h"), ("..", "a"))
    assert artifact_key("My Pipe!", "Step_1.x") == "m27-ckpt-my-pipe-step-1-x"
    assert re.fullmatch(r"[a-z0-9-]+", slug("../..//ÄÖ x"))


#: Every module that builds a path from a step name or run id, and what it must call.
CALL_SITES = {
    "flows/_run.py": 5,
    "flows/pipeline.py": 1,
    "m27/node/agent.py": 1,
    "m27/executors/_launch.py": 1,
    "m27/executors/slurm/__init__.py": 1,
    "m27/cli/commands/checkpoints.py": 2,
    "m27/cli/commands/logs.py": 1,
}
#: What a hand-built path from a name looks like: `x / step`, `/ f"{step}...`, `/ run_id`.
_HAND_BUILT = re.compile(
    r"/ (?:f\"\{(?:step|launch\.step|step\.name|args\.step)\b|(?:step|run_id|run\.run_id|"
    r"self\.run_id|current)\b)"
)


def test_every_place_a_name_becomes_a_path_goes_through_join_under() -> None:
    offenders = []
    for path in sorted((ROOT / "m27").rglob("*.py")) + sorted((ROOT / "flows").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _HAND_BUILT.search(line) and "join_under" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "build these paths with m27.paths.join_under:\n" + "\n".join(offenders)
    for rel, count in CALL_SITES.items():
        assert (ROOT / rel).read_text().count("join_under(") >= count, rel


def test_an_empty_home_means_the_accounts_home_not_the_root_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pwd

    account = Path(pwd.getpwuid(os.getuid()).pw_dir)
    monkeypatch.setenv("HOME", "")  # Path.home() reads it: "" gives "/"
    monkeypatch.delenv("M27_HOME", raising=False)
    assert m27_home() == account / ".m27" != Path("/.m27")
    assert m27_home({"HOME": ""}) == account / ".m27"
    assert m27_home({"HOME": "", "M27_HOME": ""}) == account / ".m27"
    assert m27_home({"HOME": "/srv/u"}) == Path("/srv/u/.m27")


def test_the_notifier_finds_the_same_home_as_every_other_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from m27.notify.notifier import m27_home as notifier_home

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("M27_HOME", "")  # set but empty: the default, not the working folder
    assert notifier_home() == m27_home() == tmp_path / ".m27"
