"""The runner against real child processes: limits, process groups, commands that cannot start."""

from __future__ import annotations

import gc
import os
import signal
import threading
from pathlib import Path

import pytest

from m27._exceptions import RunnerError
from m27.events import StepCancelled, StepFailed, StepStarted, StepSucceeded
from m27.executors.local import StepLaunch, StepResult, run_step
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import PY, collect, events, launch, of, running


@pytest.fixture
def store() -> MemoryEventStore:
    return MemoryEventStore()


# --- limits: timeout and cancel --------------------------------------------------------

#: The step timeouts below leave the child this long to start and print its sleepers' pids
#: (a loaded 2-core machine can take seconds to start Python): the timeout must fire after
#: the group exists, or there is nothing to check.
READY_S = 5.0

SPAWN_SLEEPERS = """
import subprocess, sys, time
kids = [subprocess.Popen(["sleep", "1000"]) for _ in range(2)]
print(*[k.pid for k in kids], flush=True)
time.sleep(1000)
"""


def test_timeout_kills_the_whole_group_including_grandchildren(store: MemoryEventStore) -> None:
    lines: list[tuple[str, str]] = []
    step = launch(SPAWN_SLEEPERS, timeout=READY_S, grace=0.2, retries=0)
    result = run_step(step, store, on_lines=collect(lines))

    assert not result.ok and result.reason == f"timed out after {READY_S}s"
    assert result.signal == signal.SIGTERM and result.exit_code is None
    pids = [int(p) for p in lines[0][1].split()]
    assert len(pids) == 2 and not any(running(p) for p in pids)
    (failed,) = of(store, StepFailed)
    assert isinstance(failed, StepFailed) and failed.reason == f"timed out after {READY_S}s"


def test_time_held_as_a_guest_does_not_count_against_the_timeout(
    store: MemoryEventStore,
) -> None:
    """A `timeout: 10m` guest held nine minutes while its GPU's primary computed was
    killed `timed out` after one minute of running. Held for all of its life here (the
    held seconds grow as the clock does), it never times out and ends on its own."""
    import time

    start = time.monotonic()
    step = launch("import time; time.sleep(1.0); print('done')", timeout=0.2, grace=0.2)
    result = run_step(step, store, held=lambda: time.monotonic() - start)
    assert result.ok and result.log_tail == "done", result.reason


def test_a_timeout_says_how_long_the_step_ran_and_how_long_it_was_held(
    store: MemoryEventStore,
) -> None:
    looks = iter([0.0])  # nothing held when it starts, 600 ms by the time it is looked at

    def held() -> float:
        return next(looks, 0.6)

    step = launch("import time; time.sleep(1000)", timeout=0.2, grace=0.2)
    result = run_step(step, store, held=held)
    assert not result.ok and result.reason == (
        "timed out after 200ms of running (and 600ms held as a guest)"
    )


def test_group_ignoring_sigterm_is_killed_after_grace(store: MemoryEventStore) -> None:
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SPAWN_SLEEPERS
    lines: list[tuple[str, str]] = []
    result = run_step(launch(code, timeout=READY_S, grace=0.2), store, on_lines=collect(lines))

    # The reason says why it ended `grace` after the timeout, and with SIGKILL.
    assert result.signal == signal.SIGKILL and result.reason == (
        f"timed out after {READY_S}s; it did not stop on SIGTERM within 200ms,"
        " so it was killed (SIGKILL)"
    )
    assert not any(running(int(p)) for p in lines[0][1].split())


def test_paused_group_is_resumed_so_it_can_act_on_sigterm(store: MemoryEventStore) -> None:
    """The agent pauses guests with SIGSTOP; a stopped process ignores SIGTERM until SIGCONT."""
    code = SPAWN_SLEEPERS.replace(
        "time.sleep(1000)", "import os, signal; os.killpg(0, signal.SIGSTOP)"
    )
    lines: list[tuple[str, str]] = []
    result = run_step(launch(code, timeout=READY_S, grace=30), store, on_lines=collect(lines))

    assert result.signal == signal.SIGTERM and result.reason == f"timed out after {READY_S}s"
    assert not any(running(int(p)) for p in lines[0][1].split())


def test_background_leftovers_are_stopped_when_the_main_process_exits(
    store: MemoryEventStore,
) -> None:
    code = (
        "import subprocess; p = subprocess.Popen(['sleep', '1000'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    lines: list[tuple[str, str]] = []
    result = run_step(launch(code, grace=0.2), store, on_lines=collect(lines))

    assert result.ok
    assert not running(int(lines[0][1]))


def test_cancel_stops_the_group_and_records_cancelled_without_retry(
    store: MemoryEventStore,
) -> None:
    cancel = threading.Event()
    lines: list[tuple[str, str]] = []

    def on_lines(stream: str, batch: list[str]) -> None:
        lines.extend((stream, line) for line in batch)
        cancel.set()

    step = launch(SPAWN_SLEEPERS, retries=3, grace=0.2)
    result = run_step(step, store, on_lines=on_lines, cancel=cancel)

    assert result.cancelled and not result.ok and result.attempts == 1
    assert result.reason == "cancelled"
    assert [type(e) for e in events(store)] == [StepStarted, StepCancelled]
    assert not any(running(int(p)) for p in lines[0][1].split())


def test_cancel_before_start_runs_nothing(store: MemoryEventStore) -> None:
    cancel = threading.Event()
    cancel.set()
    result = run_step(launch("print('never')"), store, cancel=cancel)

    assert result.cancelled and result.attempts == 0
    assert [type(e) for e in events(store)] == [StepCancelled]


# --- commands that cannot start --------------------------------------------------------


def _cannot_start(store: MemoryEventStore, step: StepLaunch) -> tuple[StepResult, StepFailed]:
    result = run_step(step, store)
    assert not result.ok and result.attempts == 1
    (failed,) = events(store)
    assert isinstance(failed, StepFailed) and not failed.will_retry
    assert failed.reason == result.reason and failed.exit_code == result.exit_code
    return result, failed


def test_missing_executable_fails_cleanly_with_127(store: MemoryEventStore, m27_home: Path) -> None:
    step = StepLaunch("r1", "s1", ("m27-no-such-command", "x"), retries=2)
    result, failed = _cannot_start(store, step)

    assert result.exit_code == 127 and result.reason == "command not found: m27-no-such-command"
    assert "m27: command not found" in failed.log_tail
    assert "m27: command not found" in (m27_home / "runs" / "r1" / "s1.log").read_text()


def test_a_bare_name_of_a_file_in_the_workdir_says_to_write_its_path(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    (tmp_path / "m27-job.sh").write_text("#!/bin/sh\n")
    result, _ = _cannot_start(store, StepLaunch("r1", "s1", ("m27-job.sh",), workdir=tmp_path))
    assert (result.exit_code, result.reason) == (
        127,
        "command not found: m27-job.sh (the workdir has it: write ./m27-job.sh)",
    )


def test_file_without_execute_bit_fails_with_126(store: MemoryEventStore, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    result, _ = _cannot_start(store, StepLaunch("r1", "s1", (str(script),)))

    assert (result.exit_code, result.reason) == (
        126,
        f"permission denied: {script}: it is not executable (`chmod +x {script}`, or run it"
        " with its interpreter)",
    )


def test_a_folder_as_the_program_says_so(store: MemoryEventStore, tmp_path: Path) -> None:
    result, _ = _cannot_start(store, StepLaunch("r1", "s1", (str(tmp_path),)))
    assert (result.exit_code, result.reason) == (
        126,
        f"permission denied: {tmp_path}: it is a folder, not a program",
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "echo hi\n",
            "it has no #! line, so it cannot be started as a program (a shell would run it"
            " with /bin/sh): put `#!/bin/sh` (or its interpreter) first, or write `sh {}`",
        ),
        ("#!/no/such/sh\necho hi\n", "bad interpreter"),
        ("\x7fELF for another machine", "Exec format error"),
    ],
)
def test_script_that_cannot_execute_fails_with_126(
    store: MemoryEventStore, tmp_path: Path, text: str, reason: str
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(text)
    script.chmod(0o755)
    result, _ = _cannot_start(store, StepLaunch("r1", "s1", (str(script),)))
    said = reason.format(script)
    assert (result.exit_code, result.reason) == (126, f"cannot execute {script}: {said}")


def test_a_missing_workdir_is_made_and_one_that_cannot_be_fails_cleanly(
    store: MemoryEventStore, tmp_path: Path, m27_home: Path
) -> None:
    made = tmp_path / "replicas" / "7"
    result = run_step(launch("import os; print(os.getcwd())", workdir=made), store)
    assert result.ok and made.is_dir() and result.log_tail.splitlines()[-1] == str(made)
    log = (m27_home / "runs" / "r1" / "s1.log").read_text()
    assert f"m27: made the workdir {made}" in log

    (tmp_path / "file").write_text("in the way")
    store = MemoryEventStore()
    result, _ = _cannot_start(store, launch("print(1)", workdir=tmp_path / "file" / "sub"))
    assert (result.exit_code, result.reason) == (
        126,
        f"cannot create the workdir {tmp_path / 'file' / 'sub'}: Not a directory",
    )


def test_the_folders_of_declared_outputs_exist_before_the_step_starts(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    code = "open('out/deep/x.txt', 'w').write('x'); open('y.txt', 'w').write('y')"
    step = launch(code, workdir=tmp_path, outputs=("out/deep/x.txt", "y.txt"))
    result = run_step(step, store)

    assert result.ok, result.reason
    assert (tmp_path / "out" / "deep" / "x.txt").read_text() == "x"


def test_an_output_folder_that_cannot_be_made_fails_before_the_step_runs(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    (tmp_path / "out").write_text("a file where the folder should be")
    step = launch("open('ran', 'w')", workdir=tmp_path, outputs=("out/x.txt",))
    result, _ = _cannot_start(store, step)

    assert result.reason == "cannot create the folder of output out/x.txt: File exists"
    assert not (tmp_path / "ran").exists()


def test_unwritable_log_location_fails_cleanly(store: MemoryEventStore, tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    result, _ = _cannot_start(store, launch("print(1)", log_path=tmp_path / "file" / "s1.log"))
    assert result.reason.startswith("cannot prepare the step")


def test_launch_without_a_command_is_rejected() -> None:
    with pytest.raises(RunnerError, match="needs a command"):
        StepLaunch("r1", "s1", ())


# --- hygiene ---------------------------------------------------------------------------


def test_no_file_descriptors_leak(store: MemoryEventStore, tmp_path: Path) -> None:
    run_step(launch("print(1)"), store)  # warm up lazily opened files (selectors, logging)
    gc.collect()  # earlier tests' garbage (a store not closed) is not closed in between
    before = sorted(os.listdir("/proc/self/fd"))
    run_step(launch("print(1)"), store)
    run_step(launch("raise SystemExit(4)", retries=1), store)
    run_step(launch("import time; time.sleep(5)", timeout=0.2, grace=0.1), store)
    run_step(StepLaunch("r1", "s1", ("m27-no-such-command",)), store)
    gc.collect()
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_concurrent_steps_keep_their_output_apart(store: MemoryEventStore, m27_home: Path) -> None:
    names = [f"s{i}" for i in range(4)]
    results: dict[str, StepResult] = {}

    def work(name: str) -> None:
        code = f"for i in range(300): print('{name}', i)"
        results[name] = run_step(StepLaunch("r1", name, (PY, "-c", code)), store)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert all(results[n].ok for n in names)
    for name in names:
        body = (m27_home / "runs" / "r1" / f"{name}.log").read_text().splitlines()[1:-1]
        assert body == [f"{name} {i}" for i in range(300)]
    assert len(of(store, StepSucceeded)) == 4
