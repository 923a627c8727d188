"""The MD example's physics and files, at a size that runs in about a second.

The scripts in examples/md are loaded by path: they are programs a user runs, not part
of the m27 package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "md"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"md_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare, md, analyze = load("prepare"), load("md"), load("analyze")

SMALL_INPUT = "cells = 3   # 108 atoms\ndensity = 0.8442\ntemperature = 1.5\nseed = 5\n"


@pytest.fixture(autouse=True)
def _stop_signals_restored() -> Iterator[None]:
    """md.main() calls m27.watch_stop(), which takes TERM and USR1 in this process: without
    this the test session no longer died at SIGTERM (the relay set an event nobody read)."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _no_checkpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("M27_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("M27_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("M27_RESUME_FROM", raising=False)


@pytest.fixture
def system_file(tmp_path: Path) -> Path:
    (tmp_path / "small.in").write_text(SMALL_INPUT)
    out = tmp_path / "run" / "system.npz"
    assert prepare.main(["--input", str(tmp_path / "small.in"), "--out", str(out)]) == 0
    return out


def small_system(seed: int = 5) -> dict[str, np.ndarray]:
    params = {**prepare.read_input(EXAMPLE / "argon.in"), "cells": 3, "seed": seed}
    system: dict[str, np.ndarray] = prepare.build_system(params)
    return system


def test_prepare_builds_an_fcc_box_at_the_requested_density_and_temperature() -> None:
    system = small_system()
    positions, velocities, box = system["positions"], system["velocities"], float(system["box"])
    assert positions.shape == (108, 3)
    assert len(positions) / box**3 == pytest.approx(0.8442)
    assert positions.min() >= 0.0 and positions.max() < box
    # FCC nearest neighbours sit at a / sqrt(2); nothing is closer.
    d = positions[:, None, :] - positions[None, :, :]
    d -= box * np.rint(d / box)
    r = np.sqrt((d**2).sum(axis=-1))[np.triu_indices(108, 1)]
    assert r.min() == pytest.approx(box / 3 / np.sqrt(2))
    assert np.abs(velocities.sum(axis=0)).max() < 1e-12
    assert np.sum(velocities**2) / (3 * 108 - 3) == pytest.approx(1.5)


def test_prepare_gives_the_same_system_for_the_same_seed_and_another_for_another() -> None:
    first, again, other = small_system(5), small_system(5), small_system(6)
    for name in first:
        assert np.array_equal(first[name], again[name])
    assert not np.array_equal(first["velocities"], other["velocities"])
    assert np.array_equal(first["positions"], other["positions"])


def test_prepare_rejects_an_unknown_key_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.in"
    bad.write_text("cells = 3\n# a comment\ntemprature = 1.0\n")
    assert prepare.main(["--input", str(bad), "--out", str(tmp_path / "s.npz")]) == 2
    assert f"{bad}:3:" in capsys.readouterr().err
    assert not (tmp_path / "s.npz").exists()


def test_forces_are_minus_the_gradient_of_the_potential_energy() -> None:
    system = small_system()
    rng = np.random.default_rng(0)
    x = system["positions"] + rng.normal(0.0, 0.05, system["positions"].shape)
    lj = md.LennardJones(np, 108, float(system["box"]))
    lj.build(x)
    forces, _ = lj.forces(x)
    h = 1e-6
    for atom, axis in [(0, 0), (17, 1), (63, 2)]:
        plus, minus = x.copy(), x.copy()
        plus[atom, axis] += h
        minus[atom, axis] -= h
        gradient = (float(lj.forces(plus)[1]) - float(lj.forces(minus)[1])) / (2 * h)
        assert forces[atom, axis] == pytest.approx(-gradient, rel=1e-5, abs=1e-6)


def test_neighbour_list_gives_the_all_pairs_forces_between_rebuilds() -> None:
    system = small_system()
    x, v = system["positions"].copy(), system["velocities"].copy()
    listed = md.LennardJones(np, 108, float(system["box"]))
    listed.build(x)
    forces, _ = listed.forces(x)
    for _ in range(40):
        forces, potential = md.verlet_step(listed, x, v, forces, 0.005)
    every_pair = md.LennardJones(np, 108, float(system["box"]))  # never built: all pairs
    reference, reference_potential = every_pair.forces(x)
    assert listed.builds > 1
    np.testing.assert_allclose(forces, reference, rtol=1e-12, atol=1e-12)
    assert float(potential) == pytest.approx(float(reference_potential), rel=1e-12)


def test_velocity_verlet_conserves_energy_and_total_momentum() -> None:
    system = small_system()
    x, v = system["positions"].copy(), system["velocities"].copy()
    lj = md.LennardJones(np, 108, float(system["box"]))
    lj.build(x)
    forces, potential = lj.forces(x)
    energies = []
    for _ in range(200):
        forces, potential = md.verlet_step(lj, x, v, forces, 0.005)
        energies.append(md.kinetic_energy(np, v) + float(potential))
    energies_array = np.array(energies)
    assert np.ptp(energies_array) / abs(energies_array.mean()) < 1e-3
    assert np.abs(v.sum(axis=0)).max() < 1e-10
    assert x.min() >= 0.0 and x.max() <= float(system["box"])


def test_a_cutoff_beyond_half_the_box_is_refused() -> None:
    with pytest.raises(ValueError, match="half the box"):
        md.LennardJones(np, 108, 4.0, cutoff=2.5)


def test_md_logs_every_row_and_frame_and_writes_the_final_state(
    system_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = system_file.parent
    argv = ["--system", str(system_file), "--out", str(run), "--steps", "50"]
    assert md.main([*argv, "--log-every", "10", "--frame-every", "25", "--backend", "numpy"]) == 0
    table = analyze.read_energy(run / "energy.csv")
    assert table["step"].tolist() == [0, 10, 20, 30, 40, 50]
    assert table["time"][-1] == pytest.approx(0.25)
    np.testing.assert_allclose(table["total"], table["kinetic"] + table["potential"])
    frames = analyze.read_frames(run / "trajectory.xyz")
    assert [step for step, _, _ in frames] == [0, 25, 50]
    final = np.load(run / "final.npz")
    np.testing.assert_allclose(frames[-1][2], final["positions"], atol=1e-8)
    assert int(final["step"]) == 50
    assert "step 50/50" in capsys.readouterr().out


def test_truncation_keeps_rows_and_frames_up_to_the_step_and_drops_a_torn_tail(
    tmp_path: Path,
) -> None:
    energy = tmp_path / "energy.csv"
    energy.write_text(md.ENERGY_HEADER + "0,0,1,2,3,4\n10,0.05,1,2,3,4\n20,0.1,1,2,3,4\n30,0.1")
    md.truncate_energy_log(energy, 10)
    assert energy.read_text() == md.ENERGY_HEADER + "0,0,1,2,3,4\n10,0.05,1,2,3,4\n"
    md.truncate_energy_log(energy, 25)
    assert energy.read_text().endswith("10,0.05,1,2,3,4\n")

    trajectory = tmp_path / "trajectory.xyz"
    positions = np.arange(6.0).reshape(2, 3)
    with trajectory.open("w") as f:
        for step in (0, 5, 10):
            md.write_frame(f, positions, 4.0, step, 0.005)
    whole = trajectory.read_text()
    trajectory.write_text(whole[:-10])  # the step-10 frame is torn
    md.truncate_trajectory(trajectory, 100)
    assert [step for step, _, _ in analyze.read_frames(trajectory)] == [0, 5]
    md.truncate_trajectory(trajectory, 4)
    assert [step for step, _, _ in analyze.read_frames(trajectory)] == [0]


def test_analysis_finds_a_liquid_rdf_a_small_drift_and_writes_a_png_and_summary(
    system_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = system_file.parent
    argv = ["--system", str(system_file), "--out", str(run), "--steps", "300"]
    assert md.main([*argv, "--frame-every", "20", "--backend", "numpy"]) == 0
    assert analyze.main(["--run", str(run)]) == 0

    summary = json.loads((run / "summary.json").read_text())
    assert summary["atoms"] == 108 and summary["last_step"] == 300
    assert summary["rdf_frames"] == 8
    assert abs(summary["energy_drift_per_1000_steps"]) < 1e-3
    assert summary["energy_max_deviation"] < 1e-3
    assert 1.0 <= summary["rdf_peak_r"] <= 1.25 and summary["rdf_peak_g"] > 2.0
    assert 0.5 < summary["mean_temperature"] < 1.2

    frames = analyze.read_frames(run / "trajectory.xyz")
    r, g = analyze.radial_distribution(frames[-8:])
    assert np.all(g[r < 0.8] == 0.0)
    assert np.mean(g[r > 2.0]) == pytest.approx(1.0, abs=0.15)

    png = (run / "analysis.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "first peak" in capsys.readouterr().out


def test_analysis_of_a_missing_run_fails_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert analyze.main(["--run", str(tmp_path / "nowhere")]) == 1
    assert "energy.csv" in capsys.readouterr().err


def test_pipeline_file_is_the_seed_shape_and_each_command_parses() -> None:
    from m27.spec import load_pipeline

    pipeline = load_pipeline(EXAMPLE / "pipeline.yaml", {"STEPS": "123", "OUT": "out/x"})
    assert pipeline.name == "md-example"
    steps = {step.name: step for step in pipeline.steps}
    assert [(s.name, s.type, s.depends_on) for s in pipeline.steps] == [
        ("preprocessing", "cpu", ()),
        ("md_simulation", "gpu", ("preprocessing",)),
        ("analysis", "gpu_light", ("md_simulation",)),
    ]
    assert steps["md_simulation"].checkpoint == 2.0  # shorter than the default run
    assert "out/x/energy.csv" in steps["md_simulation"].outputs
    for step, script in [("preprocessing", prepare), ("md_simulation", md), ("analysis", analyze)]:
        argv = steps[step].argv
        assert argv[0] == "python" and (EXAMPLE / argv[1]).is_file()
        assert script.__file__ == str(EXAMPLE / argv[1])
    assert md.parse_args(list(steps["md_simulation"].argv[2:])).steps == 123
    assert (EXAMPLE / "argon.in").is_file()


def test_md_marks_each_frame_write_as_io_wait(
    system_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered: list[int] = []

    @contextlib.contextmanager
    def io_wait() -> Iterator[None]:
        entered.append(1)
        yield

    monkeypatch.setattr(md, "m27", SimpleNamespace(io_wait=io_wait))
    argv = ["--system", str(system_file), "--out", str(system_file.parent), "--steps", "50"]
    assert md.main([*argv, "--frame-every", "25", "--backend", "numpy"]) == 0
    assert len(entered) == 3


def test_md_without_a_checkpoint_dir_says_so_and_writes_no_checkpoints(
    system_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--system", str(system_file), "--out", str(system_file.parent), "--steps", "20"]
    assert md.main([*argv, "--checkpoint-every-steps", "10", "--backend", "numpy"]) == 0
    assert "running without checkpoints" in capsys.readouterr().out
    assert not (system_file.parent / "checkpoints").exists()


def test_a_finished_run_extended_with_more_steps_continues_from_its_checkpoint(
    system_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(out: Path, steps: int, checkpoints: Path) -> None:
        argv = ["--system", str(system_file), "--out", str(out), "--steps", str(steps)]
        argv += ["--checkpoint-dir", str(checkpoints), "--checkpoint-every-steps", "20"]
        assert md.main([*argv, "--frame-every", "20", "--backend", "numpy"]) == 0

    run(tmp_path / "a", 60, tmp_path / "ck-a")
    run(tmp_path / "a", 100, tmp_path / "ck-a")
    assert "resumed from checkpoint at step 60" in capsys.readouterr().out
    run(tmp_path / "b", 100, tmp_path / "ck-b")
    for name in ("energy.csv", "trajectory.xyz"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_md_refuses_a_checkpoint_of_another_system(
    system_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every-steps", "10"]
    argv = ["--out", str(tmp_path / "a"), "--steps", "10", "--backend", "numpy", *checkpoints]
    assert md.main(["--system", str(system_file), *argv]) == 0
    (tmp_path / "big.in").write_text("cells = 4\n")
    bigger = tmp_path / "big.npz"
    assert prepare.main(["--input", str(tmp_path / "big.in"), "--out", str(bigger)]) == 0
    assert md.main(["--system", str(bigger), *argv]) == 1
    assert "does not fit this run" in capsys.readouterr().err
