"""What a resumed run skips: the steps done in the run it resumes and in that run's own
ancestors, found from those runs' events alone (flows.pipeline._previous_successes)."""

from __future__ import annotations

from pathlib import Path

from flows.pipeline import _previous_successes
from m27 import events as ev
from m27.store.memory import MemoryEventStore


def _run(run_id: str, resume_of: str | None, ended: dict[str, str]) -> list[ev.Event]:
    out: list[ev.Event] = [
        ev.RunSubmitted(at=1.0, run_id=run_id, pipeline="md", spec_path="md.yaml",
                        steps=("prep", "em", "md"), resume_of=resume_of)
    ]  # fmt: skip
    for step, how in ended.items():
        if how == "succeeded":
            out.append(ev.StepSucceeded(at=2.0, run_id=run_id, step=step, attempt=1, duration_s=1))
        elif how == "done before":
            reason = ev.StepSkipped.DONE_BEFORE
            out.append(ev.StepSkipped(at=2.0, run_id=run_id, step=step, reason=reason))
        else:
            out.append(ev.StepFailed(at=2.0, run_id=run_id, step=step, attempt=1,
                                     duration_s=1, reason="exited with code 3"))  # fmt: skip
    return out


def test_a_resume_of_a_resume_skips_what_each_run_of_the_chain_did(m27_home: Path) -> None:
    store = MemoryEventStore()
    store.append(_run("a", None, {"prep": "succeeded", "em": "failed"}))
    store.append(_run("other", None, {"md": "succeeded"}))  # not in the chain
    store.append(_run("b", "a", {"prep": "done before", "em": "succeeded", "md": "failed"}))
    done, dirs = _previous_successes(store, "b")
    assert done == {"prep", "em"}
    assert dirs == [m27_home / "checkpoints" / "b", m27_home / "checkpoints" / "a"]
    assert _previous_successes(store, None) == (set(), [])
    assert _previous_successes(store, "gone") == (set(), [])
