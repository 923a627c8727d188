"""`container:` steps: the argv that runs them through apptainer (or singularity)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from m27._exceptions import RunnerError
from m27.cli.main import main
from m27.executors.container import find_runtime, wrap_argv


def only(*names: str):  # type: ignore[no-untyped-def]
    return lambda name: f"/usr/bin/{name}" if name in names else None


def test_gpu_step_runs_with_nv_and_binds_in_order() -> None:
    argv = wrap_argv(
        ("python", "sim.py", "--n", "3"),
        "images/md.sif",
        binds=("/data", "/scratch/u:/scratch:ro"),
        gpus=2,
        which=only("apptainer", "singularity"),
    )
    assert argv == (
        "apptainer", "exec", "--nv",
        "--bind", "/data",
        "--bind", "/scratch/u:/scratch:ro",
        "images/md.sif", "python", "sim.py", "--n", "3",
    )  # fmt: skip


def test_cpu_step_has_no_nv_and_singularity_is_used_when_alone() -> None:
    argv = wrap_argv(("echo", "hi"), "docker://alpine:3", which=only("singularity"))
    assert argv == ("singularity", "exec", "docker://alpine:3", "echo", "hi")


def test_missing_runtime_error_names_both() -> None:
    with pytest.raises(RunnerError, match="neither apptainer nor singularity is installed"):
        wrap_argv(("true",), "x.sif", which=only())


def test_explicit_runtime_must_exist() -> None:
    assert find_runtime("singularity", which=only("singularity")) == "singularity"
    with pytest.raises(RunnerError, match="'apptainer' is not installed"):
        find_runtime("apptainer", which=only("singularity"))


@pytest.mark.parametrize("bind", ["", "a:b:c:d", ":/x", "/a:/b:rx"])
def test_bad_binds_are_refused(bind: str) -> None:
    with pytest.raises(RunnerError, match="bind"):
        wrap_argv(("true",), "x.sif", binds=(bind,), which=only("apptainer"))


def test_empty_image_or_command_is_refused() -> None:
    with pytest.raises(RunnerError, match="image"):
        wrap_argv(("true",), " ", which=only("apptainer"))
    with pytest.raises(RunnerError, match="command"):
        wrap_argv((), "x.sif", which=only("apptainer"))


def test_this_machine_without_a_runtime_gets_the_clear_error() -> None:
    if shutil.which("apptainer") or shutil.which("singularity"):
        assert wrap_argv(("true",), "x.sif")[1] == "exec"
    else:
        with pytest.raises(RunnerError, match="neither apptainer nor singularity"):
            wrap_argv(("true",), "x.sif")


def test_run_refuses_container_steps_before_anything_starts_when_no_runtime_is_installed(
    tmp_path: Path,
    m27_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with python but neither apptainer nor singularity
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "pipeline:\n"
        "  - {name: local, type: cpu, command: 'true'}\n"
        "  - {name: boxed, type: cpu, container: x.sif, command: 'true'}\n"
    )
    assert main(["run", str(spec), "--plain"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{spec}:3: step 'boxed': this step runs in a container, but neither apptainer "
        "nor singularity is installed (install Apptainer: "
        "https://apptainer.org/docs/admin/main/installation.html)",
        "1 problem(s) found",
    ]
    assert not (m27_home / "service.json").exists()  # no node service started for it
