"""`m27 run` end to end: a real Prefect server, real step processes, the event log."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from m27.cli.commands.run import ABORTED
from tests.e2e._helpers import (
    M27,
    SLEEPER,
    as_from_a_terminal,
    gated_script,
    group_alive,
    m27_env,
    node_state,
    prefect_flow_run_state,
    prefect_log_messages,
    spawn_m27,
    wait_running,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.service

DIAMOND = textwrap.dedent("""\
    name: diamond
    pipeline:
      - name: a
        type: cpu
        command: python -c "print('from a')"
      - name: b
        type: cpu
        depends_on: [a]
        command: python -c "import os, sys; print('b runs'); sys.exit(0 if os.path.exists('flag') else 3)"
      - name: c
        type: gpu
        depends_on: [a]
        command: python -c "import os; print('c on GPU', os.environ['CUDA_VISIBLE_DEVICES'])"
      - name: d
        type: cpu
        depends_on: [b, c]
        command: python -c "print('d')"
      - name: e
        type: gpu_light
        depends_on: [c]
        command: python -c "print('e')"
""")


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


Tasks = dict[str, tuple[str, str]]


def _flow_run(prefect_api: str, flow_run_id: str) -> tuple[str, str, Tasks]:
    """(flow run name, state type, {task run name: (state name, message)}) straight from
    Prefect."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def fetch() -> tuple[str, str, Tasks]:
        async with get_client() as client:
            fr = await client.read_flow_run(flow_run_id)
            tasks = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))
            )
            assert fr.state is not None
            return (
                fr.name,
                fr.state.type.value,
                {t.name: (t.state.name, t.state.message or "") for t in tasks if t.state},
            )

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        return asyncio.run(fetch())


def test_diamond_with_a_failing_branch_finishes_the_others_and_fails_the_run(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = _write(tmp_path, DIAMOND)
    done = m27("run", str(spec), "--plain")
    assert done.returncode == 1, done.stdout + done.stderr
    state = node_state(m27_home)
    (run,) = state.runs.values()
    status = {n: s.status for n, s in run.steps.items()}
    assert status == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "skipped",
        "e": "succeeded",
    }
    assert run.status == "failed"
    assert run.steps["b"].exit_code == 3
    assert "b runs" in run.steps["b"].log_tail
    assert "upstream step b" in run.steps["d"].reason
    assert "[c] c on GPU" in done.stdout
    assert "resume: m27 run --resume" in done.stdout
    # the same run in Prefect: named <pipeline>/<run>, one task run per step, Failed
    assert run.flow_run_id
    # (a warm run's client may exit a moment before its child sets the final state)
    seen: list[tuple[str, str, Tasks]] = []
    wait_until(
        lambda: seen.append(_flow_run(prefect_env, run.flow_run_id)) or seen[-1][1] != "RUNNING",
        timeout=120,
    )
    name, state_type, found = seen[-1]
    tasks = {task: state for task, (state, _) in found.items()}
    assert name == f"diamond/{run.run_id}"
    assert state_type == "FAILED"
    assert tasks["a"] == "Completed" and tasks["b"] == "Failed"
    assert tasks["d"] == "UpstreamFailed" and tasks["e"] == "Completed"
    # the step log holds the output of the step
    log = (m27_home / "runs" / run.run_id / "a.log").read_text()
    assert "from a" in log
    listed = m27("runs", "--json")
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [(run.run_id, "failed")]
    shown = m27("logs", run.run_id[:12], "b")
    assert "b runs" in shown.stdout
    status = m27("status", run.run_id)
    assert status.returncode == 0, status.stderr
    assert "exited with code 3" in status.stdout and "upstream step b" in status.stdout
    detail = json.loads(m27("status", "last", "--json").stdout)
    assert detail["status"] == "failed" and detail["steps"]["b"]["exit_code"] == 3
    assert detail["steps"]["c"]["gpus"] in ([0], [1])


def test_a_steps_stderr_shows_once_in_the_terminal_and_in_prefects_logs(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    # Prefect logs a step's stderr as WARNING, the level its console shows: each line was
    # printed twice (and Prefect's "Task run failed with state ..." after m27's own line).
    spec = _write(
        tmp_path,
        textwrap.dedent("""\
            name: noisy
            pipeline:
              - name: a
                type: cpu
                command: python -c "import sys; print('progress 1 of 2', file=sys.stderr); sys.exit(3)"
        """),
    )
    done = m27("run", str(spec), "--plain")
    assert done.returncode == 1, done.stdout + done.stderr
    terminal = done.stdout + done.stderr
    assert terminal.count("progress 1 of 2") == 1 and "[a] progress 1 of 2" in terminal
    assert "Task run" not in terminal and "Finished in state" not in terminal
    assert "a: failed (attempt 1): exited with code 3" in terminal
    (run,) = node_state(m27_home).runs.values()
    seen: list[list[str]] = []
    wait_until(
        lambda: (
            seen.append(prefect_log_messages(prefect_env, run.flow_run_id))
            or any("progress 1 of 2" in m for m in seen[-1])
        ),
        timeout=120,
    )


def test_a_retried_steps_failed_attempt_is_in_its_prefect_log_before_the_retry(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    # The task run's log went `started (attempt 1)`, `boom`, `ok`, `started (attempt 2)`:
    # the failed attempt was not said, the retry's start came after its output, and the
    # task ended `succeeded in 0.0s` as though one attempt had done it.
    spec = _write(
        tmp_path,
        textwrap.dedent("""\
            name: flaky
            pipeline:
              - name: a
                type: cpu
                retries: 1
                command: sh -c 'if [ -f again ]; then echo ok; else touch again; echo boom >&2; exit 3; fi'
        """),
    )
    done = m27("run", str(spec), "--plain")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = node_state(m27_home).runs.values()
    ended: list[tuple[str, str, Tasks]] = []
    wait_until(
        lambda: ended.append(_flow_run(prefect_env, run.flow_run_id)) or ended[-1][1] != "RUNNING",
        timeout=120,
    )
    state, message = ended[-1][2]["a"]
    assert state == "Completed" and message.startswith("succeeded in ")
    assert message.endswith(" (attempt 2)")

    def said() -> list[str] | None:
        texts = prefect_log_messages(prefect_env, run.flow_run_id)
        return texts if "ok" in texts else None

    texts = wait_until(said, timeout=120, what="the step's output in Prefect")
    lines = [t for t in texts if t in ("boom", "ok") or t.startswith(("started", "failed"))]
    assert [line.split(" (")[0] for line in lines] == ["started", "boom", "failed", "started", "ok"]
    assert lines[2] == "failed (attempt 1): exited with code 3 - retrying"
    assert lines[3].startswith("started (attempt 2, pid ")


def test_a_reader_that_goes_away_stops_the_output_not_the_run(
    tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    # `m27 run p.yaml | head -3`: head exits, and each later write to stdout raised
    # BrokenPipeError: a traceback from the progress thread, a warning per output line.
    gated_script(tmp_path / "step.py", "for i in range(100):\n    print('line', i, flush=True)\n")
    spec = _write(
        tmp_path,
        "name: piped\npipeline:\n  - name: a\n    type: cpu\n    command: python step.py\n",
    )
    proc = spawn_m27("run", str(spec), "--plain", cwd=tmp_path, stderr_apart=True)
    try:
        assert proc.stdout is not None
        assert "pipeline piped" in proc.stdout.readline()
        proc.stdout.close()  # as head does: every line the step prints now meets EPIPE
        (tmp_path / "go").touch()
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Broken pipe" not in stderr, stderr
    (run,) = node_state(m27_home).runs.values()
    assert run.status == "succeeded"
    log = Path(run.steps["a"].log_path).read_text()
    assert "line 99" in log  # the output lost is the terminal's copy only


def test_an_output_that_cannot_be_written_stops_the_output_not_the_run(
    tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    # `m27 run p.yaml > out.txt` on a full disk (here /dev/full: every write is ENOSPC)
    # refused the run before it began, with `m27: [Errno 28] No space left on device`.
    spec = _write(
        tmp_path, "name: full\npipeline:\n  - name: a\n    type: cpu\n    command: echo hi\n"
    )
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "m27.cli", "run", str(spec), "--plain"],
            env=m27_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=240,
        )
    assert done.returncode == 0, done.stderr
    assert "m27: cannot write the output: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr
    (run,) = node_state(m27_home).runs.values()
    assert run.status == "succeeded"


@pytest.mark.parametrize(
    ("writes", "field", "what"),
    [
        # Both "succeeded" before, each with the other's data mixed into its files.
        ("out.txt", "output: out.txt", "output"),
        # The seed pipeline's `gmx mdrun -deffnm simulation` declares no output: two runs
        # of it in one folder wrote one simulation.cpt, and each resumed the other's.
        ("state.dat", "checkpoint: {every: 60s, files: [state.dat]}", "checkpoint file"),
    ],
)
def test_a_second_run_writing_the_same_files_is_refused_until_the_first_ends(
    m27: M27, tmp_path: Path, m27_home: Path, writes: str, field: str, what: str
) -> None:
    gated_script(tmp_path / "write.py", f"open({writes!r}, 'w').write('x')\n")
    spec = _write(
        tmp_path,
        "name: writer\npipeline:\n  - name: write\n    type: cpu\n"
        f"    command: python write.py\n    {field}\n",
    )
    first = spawn_m27("run", str(spec), "--plain")
    try:
        running = wait_until(
            lambda: next(
                (
                    r
                    for r in node_state(m27_home).runs.values()
                    if r.steps["write"].status == "running"
                ),
                None,
            ),
            timeout=240,
            what="the first run's step running",
        )
        second = m27("run", str(spec), "--plain")
        assert second.returncode == 2, second.stdout + second.stderr
        assert (
            f"{what} {tmp_path / writes} is being written by run {running.run_id}" in second.stderr
        )
        assert "Traceback" not in second.stdout + second.stderr
        assert list(node_state(m27_home).runs) == [running.run_id]  # nothing of the second
        (tmp_path / "go").write_text("")
        out, _ = first.communicate(timeout=240)
        assert first.returncode == 0, out
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    third = m27("run", str(spec), "--plain")  # the files are free again at once
    assert third.returncode == 0, third.stdout + third.stderr


def test_resume_reruns_only_the_steps_that_did_not_succeed(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = _write(tmp_path, DIAMOND)
    first = m27("run", str(spec), "--plain")
    assert first.returncode == 1
    old = next(iter(node_state(m27_home).runs.values()))
    (tmp_path / "flag").write_text("now b succeeds")
    again = m27("run", "--resume", old.run_id, "--plain")
    assert again.returncode == 0, again.stdout + again.stderr
    state = node_state(m27_home)
    new = state.runs[next(r for r in state.runs if r != old.run_id)]
    assert new.resume_of == old.run_id and new.status == "succeeded"
    assert {n for n, s in new.steps.items() if s.status == "skipped"} == {"a", "c", "e"}
    assert {n for n, s in new.steps.items() if s.status == "succeeded"} == {"b", "d"}
    assert new.steps["b"].attempts == 1


def test_resume_runs_a_done_step_again_when_its_output_is_gone_and_a_step_needs_it(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = _write(
        tmp_path,
        textwrap.dedent("""\
            name: outputs
            pipeline:
              - name: prep
                type: cpu
                command: python -c "open('in.txt', 'w').write('prepared')"
                output: in.txt
              - name: use
                type: cpu
                depends_on: [prep]
                command: python -c "import os, sys; print(open('in.txt').read()); sys.exit(0 if os.path.exists('flag') else 3)"
        """),
    )
    first = m27("run", str(spec), "--plain")
    assert first.returncode == 1
    (old,) = node_state(m27_home).runs
    (tmp_path / "in.txt").unlink()  # a clean-up between the runs
    (tmp_path / "flag").write_text("now use succeeds")
    again = m27("run", "--resume", old, "--plain")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        f"m27 run: note: step prep succeeded in run {old}, but its output in.txt is gone and "
        "a step that runs now needs it: it runs again, from the start"
    ) in again.stderr
    state = node_state(m27_home)
    new = state.runs[next(r for r in state.runs if r != old)]
    assert {n: s.status for n, s in new.steps.items()} == {"prep": "succeeded", "use": "succeeded"}
    assert "[use] prepared" in again.stdout


def test_bad_input_exits_2_and_leaves_nothing_in_the_log(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = _write(tmp_path, "pipeline:\n  - name: a\n    type: cpux\n    command: echo hi\n")
    done = m27("run", str(spec))
    assert done.returncode == 2
    assert "p.yaml:3" in done.stderr and "cpux" in done.stderr
    assert node_state(m27_home).runs == {}
    undefined = _write(
        tmp_path, "pipeline:\n  - name: a\n    type: cpu\n    command: echo {{NOPE}}\n", "u.yaml"
    )
    done = m27("run", str(undefined))
    assert done.returncode == 2 and "NOPE" in done.stderr
    assert node_state(m27_home).runs == {}


def _wait_running(home: Path, pipeline: str = "sleeper") -> tuple[str, int]:
    """The run id and process group of the `long` step (SLEEPER's), once it runs."""
    run, step = wait_running(home, pipeline, "long", timeout=60)
    assert step.pgid is not None
    return run.run_id, step.pgid


def test_m27_cancel_stops_the_step_process_group_and_records_the_run_cancelled(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec = _write(tmp_path, SLEEPER)
    proc = spawn_m27("run", str(spec), "--plain")
    try:
        run_id, pgid = _wait_running(m27_home)
        follower = spawn_m27("logs", run_id, "long", "-f")
        done = m27("cancel", run_id)
        assert done.returncode == 0, done.stdout + done.stderr
        assert proc.wait(timeout=60) == 1
        # `m27 logs -f` followed the step's output live and ended when the step did
        followed, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0 and "started" in followed
    finally:
        proc.kill()
    run = node_state(m27_home).runs[run_id]
    assert run.status == "cancelled"
    assert run.steps["long"].status == "cancelled"
    assert run.steps["after"].status in ("cancelled", "skipped")
    wait_until(lambda: not group_alive(pgid), timeout=15)


def test_ctrl_c_cancels_the_run(m27: M27, tmp_path: Path, m27_home: Path) -> None:
    spec = _write(tmp_path, SLEEPER)
    proc = spawn_m27("run", str(spec), "--plain", preexec_fn=as_from_a_terminal)
    try:
        run_id, pgid = _wait_running(m27_home)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert node_state(m27_home).runs[run_id].status == "cancelled"
    assert "cancelling" in out
    wait_until(lambda: not group_alive(pgid), timeout=15)


#: A step that ignores TERM: cancelling it waits out the 10 s grace, time for a second Ctrl-C.
STUBBORN = textwrap.dedent("""\
    name: stubborn
    pipeline:
      - name: long
        type: gpu
        command: python -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('started', flush=True); time.sleep(300)"
    """)


def test_ctrl_c_twice_aborts_at_once_and_the_run_is_not_left_running(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = _write(tmp_path, STUBBORN)
    proc = spawn_m27("run", str(spec), "--plain", preexec_fn=as_from_a_terminal)
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        run_id, pgid = _wait_running(m27_home, "stubborn")
        proc.send_signal(signal.SIGINT)
        # The second press once the first was handled (two signals sent back to back can
        # merge into one pending signal in the kernel, as two key presses never do).
        wait_until(lambda: any("cancelling" in line for line in lines), timeout=60)
        proc.send_signal(signal.SIGINT)  # "Ctrl-C again to abort"
        proc.wait(timeout=60)
        reader.join(30)
    finally:
        proc.kill()
    out = "".join(lines)
    assert proc.returncode == 130, out  # as the shell expects of an interrupted command
    assert "m27: interrupted" in out and "Traceback" not in out, out
    # the user stopped it: cancelled, not `failed: m27 run stopped: KeyboardInterrupt: `
    run = node_state(m27_home).runs[run_id]
    assert (run.status, run.reason) == ("cancelled", ABORTED)
    # the step ignores TERM: the node service's crash watcher kills it after the grace
    wait_until(lambda: not group_alive(pgid), timeout=60)
    # Prefect's engine called the interrupted flow run Crashed; the node service gives it
    # the log's end, as the UI must show what happened
    wait_until(
        lambda: prefect_flow_run_state(prefect_env, run.flow_run_id) == "CANCELLED",
        timeout=60,
        what="the aborted run Cancelled in Prefect",
    )
