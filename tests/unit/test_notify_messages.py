"""Telegram message texts: one golden file per kind, escaping, and the length limit."""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from m27 import events as ev
from m27.notify.facts import NodeFacts
from m27.notify.messages import MAX_TEXT, Message, hello_message, render

GOLDEN = Path(__file__).parent / "golden" / "notify"
REGEN = "M27_REGEN_GOLDEN=1 pytest tests/unit/test_notify_messages.py"
T0 = 1_700_000_000.0


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("M27_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
    expected = path.read_text(encoding="utf-8").rstrip("\n") if path.exists() else ""
    if text != expected:
        diff = "\n".join(
            difflib.unified_diff(
                expected.splitlines(), text.splitlines(), str(path), "rendered", lineterm=""
            )
        )
        pytest.fail(f"{name} differs from its golden file:\n{diff}\nRegenerate with: {REGEN}")


def fold(events: list[ev.Event]) -> tuple[NodeFacts, list[Message]]:
    facts = NodeFacts()
    out: list[Message] = []
    for seq, e in enumerate(events, start=1):
        facts.apply(seq, e)
        msg = render(e, facts)
        if msg is not None:
            out.append(msg)
    return facts, out


def submitted(
    run: str = "md-0412", url: str | None = "http://prefect:4200/runs/flow-run/abc"
) -> ev.RunSubmitted:
    return ev.RunSubmitted(
        T0, run, "md", "/lab/md.yaml", ("prep", "md_simulation", "analysis"), prefect_url=url
    )


def started(step: str, gpus: tuple[int, ...] = (), attempt: int = 1) -> ev.StepStarted:
    return ev.StepStarted(
        T0 + 1,
        "md-0412",
        step,
        attempt,
        100,
        100,
        ("python", "x.py"),
        gpus,
        log_path=f"/m27/runs/md-0412/{step}.log",
    )


def only(messages: list[Message], kind: str) -> str:
    texts = [m.text for m in messages if m.kind == kind]
    assert len(texts) == 1, (kind, messages)
    return texts[0]


def test_run_succeeded_reports_duration_steps_gpu_hours_energy_and_prefect_link() -> None:
    _, msgs = fold(
        [
            submitted(),
            started("prep"),
            ev.StepSucceeded(T0, "md-0412", "prep", 1, 60.0),
            started("md_simulation", (0, 1)),
            ev.StepSucceeded(T0, "md-0412", "md_simulation", 1, 5400.0),
            ev.StepEnergyMeasured(T0, "md-0412", "md_simulation", 0, 1.8e6),
            ev.StepEnergyMeasured(T0, "md-0412", "md_simulation", 1, 1.8e6),
            started("analysis", (0,)),
            ev.StepSucceeded(T0, "md-0412", "analysis", 1, 1800.0),
            ev.RunSucceeded(T0, "md-0412", 7380.0),
        ]
    )
    text = only(msgs, "run_succeeded")
    assert "3/3 steps" in text and "3.50 GPU-h" in text and "1.00 kWh" in text
    check_golden("run_succeeded", text)


def test_a_resumed_run_counts_the_steps_done_in_the_run_it_resumes() -> None:
    _, msgs = fold(
        [
            submitted(),
            ev.StepSkipped(T0, "md-0412", "prep", "succeeded in the resumed run"),
            started("md_simulation", (0,)),
            ev.StepSucceeded(T0, "md-0412", "md_simulation", 1, 60.0),
            ev.StepSkipped(T0, "md-0412", "analysis", "upstream step x did not succeed"),
            ev.RunSucceeded(T0, "md-0412", 61.0),
        ]
    )
    assert "2/3 steps" in only(msgs, "run_succeeded")


def test_run_succeeded_without_energy_or_prefect_url_leaves_them_out() -> None:
    _, msgs = fold(
        [
            submitted(url=None),
            started("prep"),
            ev.StepSucceeded(T0, "md-0412", "prep", 1, 2.0),
            ev.RunSucceeded(T0, "md-0412", 3.0),
        ]
    )
    text = only(msgs, "run_succeeded")
    assert "kWh" not in text and "Prefect" not in text
    check_golden("run_succeeded_minimal", text)


def failing_run(log_tail: str, signal: int | None = None, exit_code: int | None = 1) -> str:
    _, msgs = fold(
        [
            submitted(),
            started("prep"),
            ev.StepSucceeded(T0, "md-0412", "prep", 1, 60.0),
            started("md_simulation", (0,), attempt=2),
            ev.StepFailed(
                T0,
                "md-0412",
                "md_simulation",
                2,
                3600.0,
                "step command failed",
                exit_code=exit_code,
                signal=signal,
                log_tail=log_tail,
            ),
            ev.RunFailed(T0, "md-0412", 3700.0, failed_steps=("md_simulation",)),
        ]
    )
    return only(msgs, "run_failed")


def test_run_failed_names_step_exit_code_log_lines_and_resume_command() -> None:
    tail = "".join(f"step {i} energy -{i}.5\n" for i in range(30)) + "Fatal: <atoms> & bonds\n"
    text = failing_run(tail)
    assert "md_simulation" in text and "exit code 1" in text
    assert "m27 run --resume md-0412" in text
    assert "Fatal: &lt;atoms&gt; &amp; bonds" in text and "step 19 " not in text
    check_golden("run_failed", text)


def test_a_step_that_exited_0_but_failed_says_why_on_one_line() -> None:
    """It read `exit code 0`, then `reason: declared output missing: ...` under it."""
    _, msgs = fold(
        [
            submitted(),
            started("prep"),
            ev.StepFailed(
                T0, "md-0412", "prep", 1, 2.0, "declared output missing: a.pdb", exit_code=0
            ),
            ev.RunFailed(T0, "md-0412", 3.0, failed_steps=("prep",)),
        ]
    )
    text = only(msgs, "run_failed")
    assert "step <b>prep</b> (attempt 1): exited 0, but declared output missing: a.pdb" in text
    assert "exit code 0" not in text and "reason:" not in text


def test_run_killed_by_a_signal_reads_as_a_crash() -> None:
    text = failing_run("Segmentation fault\n", signal=9, exit_code=None)
    assert "Run crashed" in text and "SIGKILL" in text
    check_golden("run_crashed", text)


def test_a_run_whose_process_died_is_reported_crashed_with_the_resume_command() -> None:
    _, msgs = fold(
        [
            submitted(),
            started("prep"),
            ev.RunCrashed(T0 + 5, "md-0412", "process 4242 died without recording an end"),
        ]
    )
    text = only(msgs, "run_failed")
    assert "Run crashed" in text and "<b>prep</b>" in text
    assert "m27 run --resume md-0412" in text and "process 4242 died" in text
    check_golden("run_crashed_process", text)


def test_a_crashed_run_the_node_resumes_by_itself_says_so_instead_of_the_command() -> None:
    """`on_crash: resume`: the service resumes it; `/resume` now would be refused."""
    _, msgs = fold(
        [
            replace(submitted(), on_crash="resume"),
            started("prep"),
            ev.RunCrashed(T0 + 5, "md-0412", "process 4242 died without recording an end"),
        ]
    )
    text = only(msgs, "run_failed")
    assert "The node resumes it by itself (<code>on_crash: resume</code>)" in text
    assert "m27 run --resume" not in text


def test_a_crashed_run_the_node_did_not_resume_after_all_says_why_and_how() -> None:
    why = "it is ana's run and this service runs as m27: its steps would run as m27"
    _, msgs = fold(
        [
            replace(submitted(), on_crash="resume"),
            ev.RunCrashed(T0 + 5, "md-0412", "process 4242 died without recording an end"),
            ev.AutoResumeSkipped(T0 + 6, "md-0412", why),
        ]
    )
    (_, text) = [m.text for m in msgs]
    assert "Crashed run not resumed" in text and "it is ana's run and this service" in text
    assert "m27 run --resume md-0412" in text
    check_golden("auto_resume_skipped", text)


def test_a_huge_log_tail_is_trimmed_to_fit_telegram() -> None:
    text = failing_run("".join("x" * 5000 + "\n" for _ in range(20)))
    assert len(text) <= MAX_TEXT
    assert "m27 run --resume md-0412" in text


def test_step_retried() -> None:
    _, msgs = fold(
        [
            submitted(),
            started("md_simulation", (0,)),
            ev.StepFailed(
                T0,
                "md-0412",
                "md_simulation",
                1,
                95.0,
                "CUDA error",
                exit_code=139,
                will_retry=True,
            ),
        ]
    )
    assert [m.kind for m in msgs] == ["step_retried"]
    check_golden("step_retried", msgs[0].text)


def test_checkpoint_restored() -> None:
    _, msgs = fold(
        [
            submitted(),
            ev.CheckpointRestored(
                T0, "md-0412", "md_simulation", "/ckpt/md-0412/md_simulation/000012", 12000
            ),
        ]
    )
    check_golden("checkpoint_restored", only(msgs, "checkpoint_restored"))


def test_a_restored_capture_names_its_files_and_the_step_they_record() -> None:
    restored = ev.CheckpointRestored(
        T0, "md-0412", "md_simulation", "/ckpt/files/ckpt-3.json", 0, files=("sim.cpt",)
    )
    _, msgs = fold([submitted(), restored])
    assert "restored sim.cpt from <code>/ckpt/files/ckpt-3.json</code>" in only(
        msgs, "checkpoint_restored"
    )
    _, msgs = fold([submitted(), replace(restored, engine_step=45000)])
    text = only(msgs, "checkpoint_restored")
    assert "restored sim.cpt at step 45000 from" in text and "resumed at step 0" not in text


def test_gpu_health_messages() -> None:
    _, msgs = fold(
        [
            ev.GpuOverheated(T0, 1, 91.4, 85.0),
            ev.GpuThrottled(T0, 1, ("hw_thermal_slowdown", "sw_power_cap")),
            ev.GpuLost(T0, 2, "GPU-8f2c", "fell off the bus (Xid 79)"),
        ]
    )
    check_golden("gpu_hot", only(msgs, "gpu_hot"))
    check_golden("gpu_throttled", only(msgs, "gpu_throttled"))
    check_golden("gpu_lost", only(msgs, "gpu_lost"))


def test_only_a_second_agent_start_is_a_restart() -> None:
    _, msgs = fold(
        [
            ev.AgentStarted(T0, 10, "gpu01", 4, "nvml"),
            ev.AgentStarted(T0 + 60, 11, "gpu01", 4, "nvml"),
        ]
    )
    assert [m.kind for m in msgs] == ["agent_restarted"]
    check_golden("agent_restarted", msgs[0].text)


def test_run_cancelled_says_who_asked() -> None:
    _, msgs = fold(
        [
            submitted(),
            ev.CancelRequested(T0, "md-0412", by="telegram:42"),
            ev.RunCancelled(T0, "md-0412", "cancelled by request"),
        ]
    )
    text = only(msgs, "run_cancelled")
    assert "telegram:42" in text
    check_golden("run_cancelled", text)


def test_test_message() -> None:
    check_golden("test", hello_message("gpu01", "2024-05-01 12:00:00").text)


def test_user_text_is_escaped_everywhere() -> None:
    run = "<b>x</b>&"
    _, msgs = fold(
        [
            ev.RunSubmitted(T0, run, "<i>p</i>", "p.yaml", ("<s>",), prefect_url='http://h/"><x>'),
            ev.StepFailed(T0, run, "<s>", 1, 1.0, "<oops>", exit_code=1),
            ev.RunFailed(T0, run, 1.0, reason="</pre>"),
        ]
    )
    text = only(msgs, "run_failed")
    for raw in ("<b>x</b>", "<i>p</i>", "<oops>", "</pre>", '"><x>'):
        assert raw not in text
    assert "&lt;b&gt;x&lt;/b&gt;&amp;" in text


def test_node_name_appears_in_the_header() -> None:
    facts = NodeFacts()
    e = ev.GpuLost(T0, 0)
    facts.apply(1, e)
    msg = render(e, facts, node="gpu<01>")
    assert msg is not None and "[gpu&lt;01&gt;]" in msg.text.splitlines()[0]


def test_uninteresting_events_render_nothing() -> None:
    _, msgs = fold(
        [
            submitted(),
            started("prep"),
            ev.StepSucceeded(T0, "md-0412", "prep", 1, 1.0),
            ev.AgentStarted(T0, 1),
        ]
    )
    assert msgs == []
