"""GROMACS as a black box: m27 captures its checkpoints, and a resume continues from them.

Real `gmx` on a tiny SPC/E water box (the example's own files, a 2.1 nm box, one thread),
with `-cpt` every second: the power cut (kill -9 of `m27 run` and of mdrun), `m27 cancel`,
and a damaged capture. Each resume must continue the simulation where a capture left it
(GROMACS's own log says from which step) and finish with an energy file that has every
frame exactly once. With CI=true a missing `gmx` fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from m27.events import CheckpointRestored, LeaseGranted, StepStarted
from m27.gpu.cpus import core_of, node_cpus, split_cores, step_cpus
from tests.e2e._helpers import (
    M27,
    ROOT,
    assert_whole_energy_file,
    events,
    file_captures,
    node_state,
    power_cut,
    start_run,
)
from tests.services import need_program
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "gromacs"
NSTEPS = 4000  # ~6 s of CPU; tens of seconds on a loaded 2-core box
#: a power cut that must land mid-mdrun tries again with this many times the steps when
#: mdrun was done first (a fast machine), at most TRIES times
GROWTH, TRIES = 4, 3

need_program("gmx", "GROMACS", "apt-get install gromacs")


@pytest.fixture(autouse=True)
def _fast_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M27_CAPTURE_POLL", "0.3")
    monkeypatch.setenv("M27_CHECKPOINT_GRACE", "60")


def _pipeline(tmp_path: Path, *, cpt: str = "1s", nsteps: int = NSTEPS) -> tuple[Path, Path]:
    out = tmp_path / "out"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "gmx.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: gmx-e2e
        pipeline:
          - name: preprocessing
            type: cpu
            command: python {EXAMPLE / "prepare.py"} --nsteps {nsteps} --out {out} --box 2.1
          - name: md_simulation
            type: gpu
            depends_on: [preprocessing]
            workdir: {out}
            checkpoint: {cpt}
            command: gmx mdrun -deffnm simulation -ntmpi 1 -ntomp 1
        """)
    )
    return path, out


def _md_started(home: Path) -> list[StepStarted]:
    return [e for e in events(home) if isinstance(e, StepStarted) and e.step == "md_simulation"]


def _continued_from(text: str) -> int:
    match = re.search(r"continuing from step (\d+)", text)
    assert match, text[-3000:]
    return int(match.group(1))


def _resume(m27: M27, run_id: str, home: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    old = json.loads(m27("runs", "--json").stdout)[-1]["run_id"] if run_id == "last" else run_id
    done = m27("run", "--resume", run_id, "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    runs = node_state(home).runs
    new = [r for r in runs.values() if r.resume_of == old]
    assert len(new) == 1 and new[0].status == "succeeded"
    return done, new[0].run_id


def _power_cut(spec: Path, home: Path, captures: int) -> None:
    """Run until `captures` checkpoints were captured, then kill -9 m27 run and mdrun."""
    before = len(file_captures(home))
    power_cut(
        spec,
        home,
        "md_simulation",
        lambda: len(file_captures(home)) >= before + captures,
        "captures",
    )


def _cut_mid_mdrun(tmp_path: Path, home: Path, captures: int) -> tuple[Path, int]:
    """A power cut (:func:`_power_cut`) that lands while mdrun still runs: the pipeline's
    folder and its step count. mdrun writes `simulation.gro` only at its end; a machine
    fast enough to finish the steps before `captures` captures (one a second) gets the
    run again with GROWTH times the steps, in a folder of its own."""
    nsteps = NSTEPS
    for attempt in range(TRIES):
        spec, out = _pipeline(tmp_path / f"try{attempt}", nsteps=nsteps)
        _power_cut(spec, home, captures)
        if not (out / "simulation.gro").exists():
            return out, nsteps
        nsteps *= GROWTH
    pytest.fail(f"mdrun ended before {captures} captures {TRIES} times, up to {nsteps} steps")


def _artifact_keys(prefect_api: str) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def fetch() -> set[str]:
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts() if a.key}

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        return asyncio.run(fetch())


def test_power_cut_mid_mdrun_resumes_from_the_captured_checkpoint(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    out, nsteps = _cut_mid_mdrun(tmp_path, m27_home, captures=2)
    crashed = json.loads(m27("runs", "--json").stdout)[-1]
    assert crashed["status"] in ("crashed", "failed")  # failed once the node service saw it

    done, _ = _resume(m27, "last", m27_home)
    assert "restored simulation.cpt" in done.stdout
    assert "resuming with: -cpi simulation.cpt" in done.stdout
    start = _continued_from(done.stdout)
    assert 0 < start < nsteps
    # the MD step each capture's .cpt records, as mdrun itself reads it on the resume
    steps = [e.engine_step for e in file_captures(m27_home)]
    assert all(s is not None for s in steps) and steps == sorted(steps), steps
    restored = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert [(e.files, e.engine_step) for e in restored] == [(("simulation.cpt",), start)]
    assert f"(step {start}); resuming with: -cpi simulation.cpt" in done.stdout
    log = (out / "simulation.log").read_text()
    assert "Reading checkpoint file simulation.cpt" in log
    assert "Restarting from checkpoint, appending to previous log file." in log
    assert_whole_energy_file(out, nsteps)
    assert "m27-ckpt-gmx-e2e-md-simulation" in _artifact_keys(prefect_env)


def test_a_damaged_capture_is_refused_and_the_previous_one_used(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    out, nsteps = _cut_mid_mdrun(tmp_path, m27_home, captures=3)
    captures = file_captures(m27_home)
    newest, previous = Path(captures[-1].path), Path(captures[-2].path)
    pack = newest.with_suffix(".pack")
    pack.write_bytes(pack.read_bytes()[:-100])  # the newest capture, torn after the fact
    (out / "simulation.cpt").write_bytes(b"torn")  # and the program's own file too

    done, _ = _resume(m27, "last", m27_home)
    assert f"capture {newest} is damaged, not restored" in done.stdout
    assert f"restored simulation.cpt from {previous}" in done.stdout
    start = _continued_from(done.stdout)
    assert 0 < start < nsteps
    assert_whole_energy_file(out, nsteps)


def test_cancel_of_a_running_mdrun_leaves_a_checkpoint_that_resume_uses(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec, out = _pipeline(tmp_path, cpt="10m")  # no timed checkpoint: only the signal's
    proc = start_run(spec, new_session=True)
    try:
        wait_until(lambda: _md_started(m27_home), timeout=240, what="mdrun started")
        wait_until(
            lambda: (
                (out / "simulation.edr").exists() and (out / "simulation.edr").stat().st_size > 2000
            ),
            timeout=240,
            what="mdrun making progress",
        )
        run_id = node_state(m27_home).runs.popitem()[0]
        cancelled = m27("cancel", run_id, "--wait", "120", timeout=180)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert proc.wait(timeout=180) is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (out / "simulation.log").read_text()
    assert "Received the TERM signal" in log
    written = re.findall(r"Writing checkpoint, step (\d+)", log)
    assert written, log[-2000:]
    assert len(file_captures(m27_home)) >= 1
    assert file_captures(m27_home)[-1].engine_step == int(written[-1])  # the .cpt's own step
    listed = json.loads(m27("checkpoints", run_id, "md_simulation/files", "--json").stdout)
    assert listed[-1]["sim_step"] == int(written[-1])
    done, _ = _resume(m27, run_id, m27_home)
    assert _continued_from(done.stdout) == int(written[-1])
    assert_whole_energy_file(out, NSTEPS)


def test_two_mdruns_side_by_side_each_get_their_gpus_share_of_the_cores(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left alone, each mdrun starts a thread per hardware thread of the node and pins them
    from core 0: two of them on one node fight over the same cores. With the GPUs' share,
    each mdrun runs `-nt N` threads on the cores of its GPU, and GROMACS, finding the
    affinity set, does not pin over it."""
    monkeypatch.setenv("M27_GPU_CPUS", "share")  # sim:2: two GPUs, but simulated
    out = tmp_path / "out"
    spec = tmp_path / "two.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: gmx-two
        pipeline:
          - name: prep
            type: cpu
            command: python {EXAMPLE / "prepare.py"} --nsteps 200 --out {out} --box 2.1
          - name: a
            type: gpu
            depends_on: [prep]
            workdir: {out}
            command: gmx mdrun -s simulation.tpr -deffnm a
          - name: b
            type: gpu
            depends_on: [prep]
            workdir: {out}
            command: gmx mdrun -s simulation.tpr -deffnm b
        """)
    )
    done = m27("run", str(spec), "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    granted = {e.step: e for e in events(m27_home) if isinstance(e, LeaseGranted)}
    started = {e.step: e for e in events(m27_home) if isinstance(e, StepStarted)}
    shares = split_cores(node_cpus(), 2, core=core_of)
    for step in ("a", "b"):
        cpus = granted[step].cpus
        assert cpus == step_cpus(granted[step].gpus, shares) != ()
        n = len(cpus)
        assert started[step].command[:4] == ("gmx", "mdrun", "-nt", str(n))
        log = (out / f"{step}.log").read_text()
        assert "Non-default thread affinity set, disabling internal thread affinity" in log
        ranks = int(re.search(r"Using (\d+) MPI threads?", log).group(1))  # type: ignore[union-attr]
        threads = int(re.search(r"Using (\d+) OpenMP threads?", log).group(1))  # type: ignore[union-attr]
        assert ranks * threads == n
        assert f"[{step}] m27: on core" in done.stdout
