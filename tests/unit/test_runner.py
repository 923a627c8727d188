"""The runner against real child processes: how a step ends, its environment, its output."""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from m27.clock import FakeClock
from m27.events import StepFailed, StepStarted, StepSucceeded
from m27.executors._launch import Sink
from m27.executors._proc import LineSplitter
from m27.executors.local import StepLaunch, resolve_argv, run_step
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import PY, collect, events, launch, of


@pytest.fixture
def store() -> MemoryEventStore:
    return MemoryEventStore()


# --- how a process ends ----------------------------------------------------------------


def test_exit_zero_records_started_then_succeeded(store: MemoryEventStore, m27_home: Path) -> None:
    result = run_step(launch("print('hi')"), store)

    assert result.ok and result.attempts == 1 and result.exit_code == 0
    assert result.reason == "succeeded" and result.log_tail == "hi"
    started, succeeded = events(store)
    assert isinstance(started, StepStarted) and isinstance(succeeded, StepSucceeded)
    assert (started.run_id, started.step, started.attempt) == ("r1", "s1", 1)
    assert started.pgid == started.pid > 0
    assert started.command == (PY, "-c", "print('hi')")
    assert started.log_path == str(m27_home / "runs" / "r1" / "s1.log")
    assert started.host and started.resume_from is None
    assert succeeded.attempt == 1


def test_exit_code_three_is_a_failure_with_the_stderr_tail(store: MemoryEventStore) -> None:
    code = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    result = run_step(launch(code), store)

    assert not result.ok and not result.cancelled
    assert (result.exit_code, result.signal) == (3, None)
    assert result.reason == "exited with code 3"
    (failed,) = of(store, StepFailed)
    assert isinstance(failed, StepFailed)
    assert failed.exit_code == 3 and failed.log_tail == "boom" and not failed.will_retry


def test_death_by_signal_records_the_signal_not_an_exit_code(store: MemoryEventStore) -> None:
    result = run_step(launch("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), store)

    assert (result.exit_code, result.signal) == (None, signal.SIGKILL)
    # m27 kills only on a timeout or a cancel, which say so: an unexplained SIGKILL is most
    # often the kernel's out-of-memory killer, and the reason says where to look
    assert result.reason == "killed by SIGKILL (out of memory? see `dmesg`)"
    (failed,) = of(store, StepFailed)
    assert isinstance(failed, StepFailed) and failed.signal == signal.SIGKILL


# --- environment -----------------------------------------------------------------------

SHOWN = (
    "M27_RUN_ID M27_STEP M27_ATTEMPT M27_HOME M27_CHECKPOINT_DIR M27_CHECKPOINT_INTERVAL"
    " M27_RESUME_FROM CUDA_VISIBLE_DEVICES CUDA_LAUNCH_BLOCKING MY_VAR"
)
DUMP_ENV = (
    "import json, os; print(json.dumps({k: os.environ[k] for k in "
    + repr(SHOWN.split())
    + " if k in os.environ}))"
)


def test_child_gets_m27_variables_and_its_gpus(
    store: MemoryEventStore, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("M27_RESUME_FROM", "/inherited/from/parent")
    ckpt = tmp_path / "ckpt" / "s1"
    lines: list[tuple[str, str]] = []
    step = launch(
        DUMP_ENV,
        env={"MY_VAR": "x", "M27_STEP": "overridden"},
        gpus=(0, 2),
        checkpoint_dir=ckpt,
        checkpoint_interval=30,
    )
    assert run_step(step, store, on_lines=collect(lines)).ok

    env = json.loads(lines[0][1])
    assert env == {
        "M27_RUN_ID": "r1",
        "M27_STEP": "s1",
        "M27_ATTEMPT": "1",
        "M27_HOME": str(m27_home),
        "M27_CHECKPOINT_DIR": str(ckpt),
        "M27_CHECKPOINT_INTERVAL": "30.0",
        "CUDA_VISIBLE_DEVICES": "0,2",
        "CUDA_LAUNCH_BLOCKING": "1",
        "MY_VAR": "x",
    }
    assert ckpt.is_dir()
    started = of(store, StepStarted)[0]
    assert isinstance(started, StepStarted) and started.gpus == (0, 2)


def test_step_without_gpus_cannot_see_the_parents_gpus(
    store: MemoryEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    lines: list[tuple[str, str]] = []
    run_step(launch(DUMP_ENV), store, on_lines=collect(lines))

    assert json.loads(lines[0][1])["CUDA_VISIBLE_DEVICES"] == ""


def test_resume_path_is_asked_before_each_attempt(store: MemoryEventStore) -> None:
    answers = iter([None, "/ckpt/r1/s1/000002"])
    code = (
        "import os, sys; print(os.environ.get('M27_RESUME_FROM', '-'), os.environ['M27_ATTEMPT']);"
        " sys.exit(0 if 'M27_RESUME_FROM' in os.environ else 1)"
    )
    lines: list[tuple[str, str]] = []
    result = run_step(
        launch(code, retries=1), store, on_lines=collect(lines), resume_from=lambda: next(answers)
    )

    assert result.ok and result.attempts == 2
    assert [line for _, line in lines] == ["- 1", "/ckpt/r1/s1/000002 2"]
    resumes = [e.resume_from for e in of(store, StepStarted) if isinstance(e, StepStarted)]
    assert resumes == [None, "/ckpt/r1/s1/000002"]


def test_bare_python_means_this_interpreter(store: MemoryEventStore) -> None:
    lines: list[tuple[str, str]] = []
    step = StepLaunch("r1", "s1", ("python", "-c", "import sys; print(sys.executable)"))
    assert run_step(step, store, on_lines=collect(lines)).ok

    assert lines == [("stdout", PY)]
    started = of(store, StepStarted)[0]
    assert isinstance(started, StepStarted) and started.command[0] == PY
    assert resolve_argv(("/usr/bin/python3", "x.py")) == ("/usr/bin/python3", "x.py")


def _other_python(folder: Path) -> Path:
    """A `python3` that is not m27's: a script saying so (a conda env's, in real life)."""
    folder.mkdir()
    fake = folder / "python3"
    fake.write_text('#!/bin/sh\necho other python "$@"\n')
    fake.chmod(0o755)
    return fake


def test_python_in_a_folder_the_steps_env_path_adds_first_runs(
    store: MemoryEventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _other_python(tmp_path / "env-bin")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    lines: list[tuple[str, str]] = []
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    step = StepLaunch("r1", "s1", ("python3", "analyse.py"), env=env)
    assert run_step(step, store, on_lines=collect(lines)).ok

    assert lines == [("stdout", "other python analyse.py")]
    started = of(store, StepStarted)[0]
    assert isinstance(started, StepStarted) and started.command == (str(fake), "analyse.py")


def test_python_after_the_inherited_path_or_on_it_is_still_m27s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _other_python(tmp_path / "env-bin")
    monkeypatch.setenv("PATH", f"/usr/bin:{fake.parent}")
    # on the PATH m27 inherited (a pyenv shim's folder): not searched
    assert resolve_argv(("python3", "x.py"), f"{fake.parent}:/usr/bin") == (PY, "x.py")
    # added after the inherited folders: a shell would find the inherited one first
    monkeypatch.setenv("PATH", "/usr/bin")
    assert resolve_argv(("python", "x.py"), f"/usr/bin:{fake.parent}") == (PY, "x.py")
    # an added folder without one, and an empty entry, are passed over
    empty = tmp_path / "empty"
    empty.mkdir()
    assert resolve_argv(("python3",), f"{empty}::/usr/bin") == (PY,)


# --- output ----------------------------------------------------------------------------

HANDSHAKE = """
import os, sys, time
def say(stream, text, ack):
    print(text, file=stream, flush=True)
    end = time.monotonic() + 120  # a bound for a broken parent, not a speed claim
    while not os.path.exists(ack):
        if time.monotonic() > end:
            sys.exit(9)
        time.sleep(0.005)
d = sys.argv[1]
say(sys.stdout, "out-1", d + "/a")
say(sys.stderr, "err-1", d + "/b")
say(sys.stdout, "out-2", d + "/c")
"""


def test_lines_reach_callback_and_log_live_in_order(
    store: MemoryEventStore, tmp_path: Path, m27_home: Path
) -> None:
    """The child waits for each line to be seen before writing the next: live, not at exit."""
    log_path = m27_home / "runs" / "r1" / "s1.log"
    caller = threading.get_ident()
    seen: list[tuple[str, str]] = []
    logged_when_seen: list[str] = []

    def on_lines(stream: str, lines: list[str]) -> None:
        assert threading.get_ident() == caller  # Prefect's run logger is bound to it
        (line,) = lines  # the child writes the next line only after this one is seen
        seen.append((stream, line))
        logged_when_seen.append(log_path.read_text().splitlines()[-1])
        (tmp_path / "abc"[len(seen) - 1]).touch()

    step = StepLaunch("r1", "s1", (PY, "-c", HANDSHAKE, str(tmp_path)))
    assert run_step(step, store, on_lines=on_lines).ok

    assert seen == [("stdout", "out-1"), ("stderr", "err-1"), ("stdout", "out-2")]
    assert logged_when_seen == ["out-1", "err-1", "out-2"]
    header, *body = log_path.read_text().splitlines()
    assert header.startswith(f"=== attempt 1: {PY} -c '\\nimport os, sys, time\\ndef say")
    assert header.endswith(f"' {tmp_path} ===")
    assert body == [
        "out-1",
        "err-1",
        "out-2",
        "=== attempt 1 succeeded ===",
    ]


def test_invalid_utf8_and_unterminated_last_line_are_kept(store: MemoryEventStore) -> None:
    code = "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe bad\\nno newline at end')"
    lines: list[tuple[str, str]] = []
    assert run_step(launch(code), store, on_lines=collect(lines)).ok

    assert lines == [("stdout", "ok \ufffd\ufffd bad"), ("stdout", "no newline at end")]


def test_huge_burst_on_both_streams_does_not_deadlock(store: MemoryEventStore) -> None:
    code = (
        "import sys\n"
        "for i in range(20000):\n"
        "    sys.stdout.write(f'o{i:05d}' + 'x' * 60 + '\\n')\n"
        "    sys.stderr.write(f'e{i:05d}' + 'y' * 60 + '\\n')\n"
    )
    counts = {"stdout": 0, "stderr": 0}

    def on_lines(stream: str, lines: list[str]) -> None:
        counts[stream] += len(lines)

    result = run_step(launch(code), store, on_lines=on_lines)

    assert result.ok and counts == {"stdout": 20000, "stderr": 20000}
    assert len(result.log_tail.splitlines()) == 50


def test_the_lines_of_one_read_reach_the_callback_in_one_call(tmp_path: Path) -> None:
    """The pipe is read on the caller's thread: a call per line (a Prefect log record each)
    held a program printing two million lines for minutes, blocked on its full pipe."""
    calls: list[tuple[str, list[str]]] = []
    with (tmp_path / "s.log").open("w") as file:
        sink = Sink(file, lambda stream, lines: calls.append((stream, list(lines))))
        sink.emit("stdout", [str(i) for i in range(5000)])
        sink.emit("stderr", ["warning"])
    assert calls == [("stdout", [str(i) for i in range(5000)]), ("stderr", ["warning"])]
    assert (tmp_path / "s.log").read_text().splitlines() == [*map(str, range(5000)), "warning"]


def test_a_step_log_that_cannot_be_written_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It said `cannot write the step log: [Errno 28] ...`: which log, and what then?"""
    import errno
    import io

    class FullDisk(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    seen: list[str] = []
    sink = Sink(FullDisk(), lambda stream, lines: seen.extend(lines))
    sink.path = str(tmp_path / "runs" / "r1" / "sim.log")
    sink.emit("stdout", ["a"])
    sink.emit("stdout", ["b"])
    assert seen == ["a", "b"]  # the lines still reach the terminal and Prefect
    warned = [r.getMessage() for r in caplog.records if "step log" in r.getMessage()]
    assert warned == [
        f"cannot write the step log {sink.path}: No space left on device; the step goes on,"
        " but its output from here on is not kept there"
    ]


def test_a_failing_callback_does_not_stop_the_step(store: MemoryEventStore, m27_home: Path) -> None:
    def on_lines(stream: str, lines: list[str]) -> None:
        raise ValueError("logger broke")

    assert run_step(launch("print('a'); print('b')"), store, on_lines=on_lines).ok
    assert "a\nb\n" in (m27_home / "runs" / "r1" / "s1.log").read_text()


def test_line_splitter_joins_split_characters_and_collapses_progress() -> None:
    splitter = LineSplitter(max_line=8)
    euro = "€".encode()
    assert splitter.feed(b"a" + euro[:1]) == []
    assert splitter.feed(euro[1:] + b"\r\n10%\r20%\r30%\n") == ["a€", "30%"]
    assert splitter.feed(b"0123456789") == ["01234567"]
    assert splitter.finish() == ["89"]
    assert splitter.finish() == []


def test_a_redrawn_progress_line_shows_while_it_runs_at_most_every_interval() -> None:
    """`gmx mdrun -v` redraws `\\rstep N, ...` for days before one newline: nothing of it
    showed (in `m27 run`, `m27 logs -f`, Prefect) until the run had ended."""
    s = LineSplitter(progress_every=5.0)
    assert s.feed(b"starting mdrun\n\rstep 100, will finish 10:00", now=0.0) == ["starting mdrun"]
    assert s.feed(b"\rstep 200, will finish 10:00", now=1.0) == ["step 100, will finish 10:00"]
    assert s.feed(b"\rstep 300, will finish 10:01", now=4.0) == []  # shown 3 s ago
    assert s.feed(b"\rstep 400, will finish 10:01\rstep 5", now=6.0) == [
        "step 400, will finish 10:01"  # the latest complete state, not the half-written one
    ]
    assert s.feed(b"00, will finish 10:02", now=20.0) == []  # not complete until redrawn
    assert s.feed(b"\n", now=21.0) == ["step 500, will finish 10:02"]
    assert s.feed(b"\rstep 600\r", now=30.0) == ["step 600"]
    assert s.feed(b"\ndone\n", now=31.0) == ["done"]  # `step 600` ended as shown: once


def test_a_redrawn_line_keeps_only_its_last_state_and_crlf_split_across_reads_survives() -> None:
    s = LineSplitter()
    s.feed(b"".join(b"\r%08d" % i for i in range(100_000)))  # 900 KB of redraws, no time
    assert len(s._buf) < 20  # only the current state is held
    assert s.finish() == ["00099999"]
    # A CRLF line read in two pieces (`abc\r`, then `\n`) is still `abc`, shown or not.
    for now in (None, 0.0):
        s = LineSplitter()
        first = s.feed(b"abc\r", now=now)
        assert first + s.feed(b"\nxyz\r\n", now=now) == ["abc", "xyz"]


# --- retries and outputs ---------------------------------------------------------------

FAIL_TWICE = """
import sys
from pathlib import Path
counter = Path(sys.argv[1])
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
print("try", n + 1)
sys.exit(1 if n < 2 else 0)
"""


def test_retries_until_success_and_waits_on_the_clock(
    store: MemoryEventStore, tmp_path: Path, m27_home: Path
) -> None:
    clock = FakeClock()
    step = StepLaunch(
        "r1", "s1", (PY, "-c", FAIL_TWICE, str(tmp_path / "n")), retries=2, retry_delay=5
    )
    result = run_step(step, store, clock=clock)

    assert result.ok and result.attempts == 3 and result.duration_s == 10.0
    kinds = [type(e).__name__ for e in events(store)]
    assert kinds == ["StepStarted", "StepFailed"] * 2 + ["StepStarted", "StepSucceeded"]
    assert [e.attempt for e in of(store, StepStarted) if isinstance(e, StepStarted)] == [1, 2, 3]
    assert all(isinstance(e, StepFailed) and e.will_retry for e in of(store, StepFailed))
    log = (m27_home / "runs" / "r1" / "s1.log").read_text()
    headers = [line[12] for line in log.splitlines() if line.startswith("=== attempt")]
    assert headers == ["1", "1", "2", "2", "3", "3"]  # a start and an end line per attempt
    assert "try 1\n" in log and "try 3\n" in log


def test_a_caller_that_waits_out_the_delay_gets_each_failed_attempt_back(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    """With ``delay_outside`` (a leased step: m27.node.lease) a failed attempt with retries
    left ends the call at once, and the next call goes on counting from ``first_attempt``."""
    clock = FakeClock()
    start = clock.now()
    argv = (PY, "-c", FAIL_TWICE, str(tmp_path / "n"))
    step = StepLaunch("r1", "s1", argv, retries=2, retry_delay=5, delay_outside=True)
    first = run_step(step, store, clock=clock)
    assert (first.ok, first.attempts, first.will_retry) == (False, 1, True)
    assert clock.now() == start  # it did not wait
    second = run_step(replace(step, first_attempt=2), store, clock=clock)
    assert (second.attempts, second.will_retry) == (2, True)
    last = run_step(replace(step, first_attempt=3), store, clock=clock)
    assert last.ok and last.attempts == 3 and not last.will_retry
    assert [e.attempt for e in of(store, StepStarted) if isinstance(e, StepStarted)] == [1, 2, 3]
    fails = [(e.attempt, e.will_retry) for e in of(store, StepFailed) if isinstance(e, StepFailed)]
    assert fails == [(1, True), (2, True)]


def test_last_failed_attempt_says_no_retry(store: MemoryEventStore) -> None:
    result = run_step(launch("raise SystemExit(2)", retries=1), store)

    assert result.attempts == 2 and result.exit_code == 2
    retries = [e.will_retry for e in of(store, StepFailed) if isinstance(e, StepFailed)]
    assert retries == [True, False]


def test_missing_declared_output_is_a_retried_failure(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    code = "open('a.txt', 'w').close()"
    step = launch(code, workdir=tmp_path, outputs=("a.txt", "sub/b.txt"), retries=1)
    result = run_step(step, store)

    assert not result.ok and result.attempts == 2 and result.exit_code == 0
    assert result.reason == "declared output missing: sub/b.txt"


def test_declared_outputs_are_recorded_on_success(store: MemoryEventStore, tmp_path: Path) -> None:
    step = launch("open('a.txt', 'w').close()", workdir=tmp_path, outputs=("a.txt",))
    assert run_step(step, store).ok

    succeeded = of(store, StepSucceeded)[0]
    assert isinstance(succeeded, StepSucceeded)
    assert succeeded.outputs == (str(tmp_path / "a.txt"),)  # from the step's own workdir


def test_an_output_pattern_needs_a_match_and_records_what_matched(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    """`output: frames/*.png` was taken as a file name, so the step failed after it ran."""
    code = (
        "import os\n"
        "for i in (2, 1): open(f'frames/f{i}.png', 'w').close()\n"
        "os.makedirs('deep/a/b'); open('deep/a/b/x.dat', 'w').close()\n"
    )
    outs = ("frames/*.png", "deep/**/*.dat", "f?.txt")
    for sub in ("w1", "w2"):
        (tmp_path / sub).mkdir()
    failed = run_step(launch(code, workdir=tmp_path / "w1", outputs=outs), store)
    assert not failed.ok and failed.reason == "declared output missing: f?.txt"

    code += "open('f1.txt', 'w').close()\n"
    work = tmp_path / "w2"
    assert run_step(launch(code, workdir=work, outputs=outs), store).ok
    succeeded = of(store, StepSucceeded)[-1]
    assert isinstance(succeeded, StepSucceeded)
    assert succeeded.outputs == tuple(
        str(work / p) for p in ("frames/f1.png", "frames/f2.png", "deep/a/b/x.dat", "f1.txt")
    )
    assert not (work / "deep" / "**").exists()  # a pattern's folder is not made as written


def test_a_values_glob_characters_are_literal_in_an_output(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    """`output: "{{NAME}}.pdb"` with `--set NAME=run[1]` was the pattern `run[1].pdb`: the
    step that wrote nothing succeeded on a stale `run1.pdb`. Only the file makes patterns."""
    from m27.spec import parse_pipeline

    text = (
        "vars: {NAME: x}\npipeline:\n"
        "  - {name: a, type: cpu, command: 'true', output: ['{{NAME}}.pdb', 'f*/{{NAME}}']}\n"
    )
    outs = parse_pipeline(text, tmp_path / "p.yaml", {"NAME": "run[1]"}).step("a").outputs
    assert outs == ("run[[]1].pdb", "f*/run[[]1]")
    (tmp_path / "run1.pdb").touch()
    (tmp_path / "f0").mkdir()
    (tmp_path / "f0" / "run1").touch()
    failed = run_step(launch("pass", workdir=tmp_path, outputs=outs), store)
    assert not failed.ok and failed.reason == "declared output missing: run[[]1].pdb, f*/run[[]1]"
    code = "open('run[1].pdb', 'w').close(); open('f0/run[1]', 'w').close()"
    assert run_step(launch(code, workdir=tmp_path, outputs=outs), store).ok
    succeeded = of(store, StepSucceeded)[-1]
    assert isinstance(succeeded, StepSucceeded)
    assert succeeded.outputs == (str(tmp_path / "run[1].pdb"), str(tmp_path / "f0/run[1]"))


def test_a_pattern_matching_many_files_is_recorded_as_the_pattern(
    store: MemoryEventStore, tmp_path: Path
) -> None:
    from m27.executors._launch import MATCHES_KEPT

    code = f"for i in range({MATCHES_KEPT + 1}): open(f'out/{{i}}.npy', 'w').close()"
    assert run_step(launch(code, workdir=tmp_path, outputs=("out/*.npy",)), store).ok
    succeeded = of(store, StepSucceeded)[-1]
    assert isinstance(succeeded, StepSucceeded)
    assert succeeded.outputs == (str(tmp_path / "out/*.npy"),)
