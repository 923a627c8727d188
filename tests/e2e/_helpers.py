"""Helpers to drive the `m27` command as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from m27.events import CheckpointWritten, Event, StepStarted
from m27.events.state import NodeState, RunState, StepState, fold
from m27.store.sqlite import SqliteEventStore

ROOT = Path(__file__).resolve().parents[2]

M27 = Callable[..., subprocess.CompletedProcess[str]]


def m27_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def call_m27(
    *args: str, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "m27.cli", *args],
        env=m27_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_m27(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stderr_apart: bool = False,
    **popen: Any,
) -> subprocess.Popen[str]:
    """`m27 ARGS` in the background, its output (stderr too, unless `stderr_apart`) piped;
    `env` adds to the environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli", *args],
        env={**m27_env(), **(env or {})},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr_apart else subprocess.STDOUT,
        text=True,
        **popen,
    )


def as_from_a_terminal() -> None:
    """`preexec_fn` for an `m27 run` that a test Ctrl-C's: SIGINT at its default, as a
    shell at a terminal leaves it. The suite itself may run as a script's background job
    (`make test &`), whose children inherit SIGINT ignored, and `m27 run` then rightly
    keeps running on a Ctrl-C meant for the script."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: A pipeline whose step `long` runs 5 minutes (with a child of its own) unless stopped.
SLEEPER = textwrap.dedent("""\
    name: sleeper
    pipeline:
      - name: long
        type: gpu
        command: python -c "import subprocess, time; subprocess.Popen(['sleep', '300']); print('started', flush=True); time.sleep(300)"
      - name: after
        type: cpu
        depends_on: [long]
        command: python -c "print('never')"
""")


def gated_script(path: Path, then: str = "") -> None:
    """A Python script at `path` that waits for a file `go` in its folder, then runs `then`
    (lines of Python): a step that ends when the test says."""
    path.write_text(
        "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n" + then
    )


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def node_state(home: Path) -> NodeState:
    store = SqliteEventStore(home / "events.db")
    try:
        return fold(store.read())
    finally:
        store.close()


def start_run(
    spec: Path, cwd: Path | None = None, *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    """`m27 run SPEC --plain` in the background, its output discarded (a test kills it,
    or waits for it, and reads the event log). `new_session`: in a process group of its
    own, so that a power cut (``os.killpg(proc.pid, SIGKILL)``) takes it whole."""
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli", "run", str(spec), "--plain"],
        env=m27_env(),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=new_session,
    )


def events(home: Path) -> list[Event]:
    """Every event in the node's log, oldest first."""
    store = SqliteEventStore(home / "events.db")
    try:
        return [r.event for r in store.read()]
    finally:
        store.close()


def power_cut(
    spec: Path, home: Path, step: str, ready: Callable[[], bool], what: str, timeout: float = 240
) -> None:
    """Run `spec` in a session of its own until `ready()`, then cut the power: kill -9 of
    `m27 run`, then of the process group of `step`'s newest attempt (else the node service
    would stop it with its checkpoint signal, which a power cut does not send)."""
    from tests.waiting import wait_until

    proc = start_run(spec, new_session=True)
    try:
        wait_until(ready, timeout=timeout, what=what)
        started = [e for e in events(home) if isinstance(e, StepStarted) and e.step == step]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # m27 run and what runs in its session
        proc.wait()
    with contextlib.suppress(ProcessLookupError):  # the node service may have stopped it
        os.killpg(started[-1].pgid, signal.SIGKILL)


def md_pipeline(tmp_path: Path, name: str, *, steps: int = 6000, top: str = "") -> Path:
    """The MD example (examples/md) as a pipeline file in `tmp_path`, its output in
    `tmp_path/out`, a checkpoint every second; `top` adds top-level lines
    (`on_crash: resume`)."""
    md = ROOT / "examples" / "md"
    path = tmp_path / "md.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: {name}
        workdir: {md}
        vars:
          OUT: {tmp_path / "out"}
          STEPS: "{steps}"
        """)
        + top
        + textwrap.dedent("""\
        pipeline:
          - name: preprocessing
            type: cpu
            command: python prepare.py --input argon.in --out {{OUT}}/system.npz
          - name: md_simulation
            type: gpu
            depends_on: [preprocessing]
            checkpoint: 1s
            command: python md.py --system {{OUT}}/system.npz --steps {{STEPS}} --out {{OUT}}
        """)
    )
    return path


def file_captures(home: Path) -> list[CheckpointWritten]:
    """The captures of programs' own checkpoint files (a .cpt, a LAMMPS restart file)."""
    return [e for e in events(home) if isinstance(e, CheckpointWritten) and e.source == "files"]


def wait_running(
    home: Path, pipeline: str, step: str, timeout: float = 240
) -> tuple[RunState, StepState]:
    """The run of `pipeline` and its `step`, once the event log shows the step running."""
    from tests.waiting import wait_until

    def check() -> tuple[RunState, StepState] | None:
        runs = [r for r in node_state(home).runs.values() if r.pipeline == pipeline]
        found = runs[0].steps.get(step) if runs else None
        return (runs[0], found) if found is not None and found.status == "running" else None

    return wait_until(check, timeout=timeout, interval=0.2, what=f"step {step} running")


def prefect_log_messages(prefect_api: str, flow_run_id: str) -> list[str]:
    """The messages of a flow run's logs in Prefect (what its UI shows), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def fetch() -> list[str]:
        messages: list[str] = []
        async with get_client() as client:
            while True:  # the API answers at most 200 per call
                logs = await client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                    limit=200,
                    offset=len(messages),
                    sort=LogSort.TIMESTAMP_ASC,
                )
                messages += [log.message for log in logs]
                if len(logs) < 200:
                    return messages

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        return asyncio.run(fetch())


def prefect_task_states(prefect_api: str, flow_run_id: str) -> dict[str, str]:
    """Each task run of a flow run in Prefect, by name, with the type of its state."""
    import json
    import urllib.request

    body = json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode()
    request = urllib.request.Request(
        f"{prefect_api}/task_runs/filter", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return {t["name"]: t["state"]["type"] for t in json.load(resp)}


def prefect_flow_run_state(prefect_api: str, flow_run_id: str) -> str:
    """The type of a flow run's state in Prefect (`CANCELLED`, ...): what its UI shows."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{prefect_api}/flow_runs/{flow_run_id}", timeout=10) as resp:
        return str(json.load(resp)["state"]["type"])


#: The GROMACS example's md.mdp: an energy frame every `nstenergy` 100 steps of 2 fs.
GMX_NSTENERGY, GMX_DT_PS = 100, 0.002


def assert_whole_energy_file(folder: Path, nsteps: int) -> None:
    """`simulation.edr` in `folder` (the example's, read with `gmx energy`) has a frame
    every GMX_NSTENERGY steps from 0 to `nsteps`: no gap, no duplicate, to the end, as a
    resumed mdrun that appended must leave it."""
    subprocess.run(
        ["gmx", "-quiet", "energy", "-f", "simulation.edr", "-o", "check.xvg"],
        input="Temperature\n\n", cwd=folder, capture_output=True, text=True, check=True,
        timeout=120,
    )  # fmt: skip
    lines = (folder / "check.xvg").read_text().splitlines()
    times = [round(float(line.split()[0]), 6) for line in lines if line and line[0] not in "#@"]
    step_ps = GMX_DT_PS * GMX_NSTENERGY
    assert times == [round(i * step_ps, 6) for i in range(nsteps // GMX_NSTENERGY + 1)]


def lammps_thermo_steps(text: str) -> list[int]:
    """The step of every thermo line (`  3000   1.61 -4.72 0 -2.29 5.93`) in LAMMPS output
    (a log file, or m27's `[step]`-prefixed lines)."""
    number = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"
    found = re.findall(rf"^(?:\S+ \[\w+\] )?\s*(\d+)(?:\s+{number}){{5}}\s*$", text, re.M)
    return [int(s) for s in found]


#: The LAMMPS example (Lennard-Jones melt): create.in writes the lattice melt.in starts from
LAMMPS_EXAMPLE = ROOT / "examples" / "lammps"


def lammps_pipeline(
    tmp_path: Path, *, steps: int, every: int, script: Path = LAMMPS_EXAMPLE / "melt.in",
    melt: tuple[str, ...] = ("checkpoint: 2s",), options: str = "",
) -> tuple[Path, Path]:  # fmt: skip
    """The example's lattice (256 atoms), then `script` as the `melt` step (its `melt`
    fields; its command's extra `options`), run in tmp_path/out: the pipeline file and
    that folder."""
    out = tmp_path / "out"
    fields = "\n            ".join(melt)
    path = tmp_path / "lmp.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: lmp-e2e
        pipeline:
          - name: lattice
            type: cpu
            command: lmp -in {LAMMPS_EXAMPLE / "create.in"} -var cells 4 -var out {out} -log none
            output: {out}/system.data
          - name: melt
            type: gpu
            depends_on: [lattice]
            workdir: {out}
            {fields}
            command: lmp -in {script} -var steps {steps} -var every {every} -log melt.log {options}
        """)
    )
    return path, out
