"""What a resumed run skips: the steps done in the run it resumes and in that run's own
ancestors, found from those runs' events alone (m27.store.chain), less the done steps a
step that runs needs and whose outputs are gone (Pipeline.rerun_for_outputs)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest

from flows import _params
from flows.pipeline import _previous_successes
from m27 import events as ev
from m27.spec import SpecError, load_pipeline
from m27.store.chain import Success, chain, gone_note, rerun_note, successes
from m27.store.memory import MemoryEventStore


def _run(run_id: str, resume_of: str | None, ended: dict[str, str]) -> list[ev.Event]:
    out: list[ev.Event] = [
        ev.RunSubmitted(at=1.0, run_id=run_id, pipeline="md", spec_path="md.yaml",
                        steps=("prep", "em", "md"), resume_of=resume_of,
                        step_commands=("prep.sh", "em.sh", "md.sh"))
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


def _store() -> MemoryEventStore:
    store = MemoryEventStore()
    store.append(_run("a", None, {"prep": "succeeded", "em": "failed"}))
    store.append(_run("other", None, {"md": "succeeded"}))  # not in the chain
    store.append(_run("b", "a", {"prep": "done before", "em": "succeeded", "md": "failed"}))
    return store


def test_a_resume_of_a_resume_skips_what_each_run_of_the_chain_did(m27_home: Path) -> None:
    store = _store()
    assert chain(store, "b") == ["b", "a"]
    assert successes(store, ["b", "a"]) == {
        "em": Success("b", "em.sh"),
        "prep": Success("a", "prep.sh"),  # where it ran, not where it was skipped
    }
    assert chain(store, "gone") == []


def test_a_skip_names_where_the_step_succeeded_when_that_run_left_the_log(
    m27_home: Path,
) -> None:
    store = MemoryEventStore()
    store.append(
        [
            ev.RunSubmitted(1.0, "c", "md", "md.yaml", ("prep", "em"), resume_of="pruned"),
            ev.StepSkipped(2.0, "c", "prep", ev.StepSkipped.done_in("pruned")),
            ev.StepSkipped(2.0, "c", "em", ev.StepSkipped.DONE_BEFORE),  # an older log's words
        ]
    )
    assert successes(store, chain(store, "c")) == {
        "prep": Success("pruned", ""),
        "em": Success("c", ""),
    }


def test_the_flow_skips_the_chain_s_successes_and_restores_from_its_folders(
    m27_home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "md.yaml"
    spec.write_text(
        "name: md\nsteps:\n"
        "  - {name: prep, type: cpu, command: prep.sh, output: prep.txt}\n"
        "  - {name: em, type: cpu, command: em.sh, depends_on: [prep]}\n"
        "  - {name: md, type: cpu, command: md.sh, depends_on: [em]}\n"
    )
    pipeline = load_pipeline(spec)
    done, dirs, fresh = _previous_successes(_store(), "b", pipeline, [])
    # prep.txt is gone, but only em (done) needs it: prep stays done
    assert done == {"prep": "a", "em": "b"} and fresh == frozenset()
    assert dirs == [m27_home / "checkpoints" / "b", m27_home / "checkpoints" / "a"]
    assert _previous_successes(_store(), None, pipeline, []) == ({}, [], frozenset())


def _pipeline(tmp_path: Path) -> Path:
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "name: p\nsteps:\n"
        "  - {name: prep, type: cpu, command: prep.sh, output: [in/a.txt, in/b.txt]}\n"
        "  - {name: em, type: cpu, command: em.sh, depends_on: [prep], output: 'em/*.gro'}\n"
        "  - {name: md, type: cpu, command: md.sh, depends_on: [em]}\n"
        "  - {name: plot, type: cpu, command: plot.sh, depends_on: [prep]}\n"
    )
    (tmp_path / "in").mkdir()
    (tmp_path / "em").mkdir()
    return spec


def test_a_done_step_runs_again_when_a_step_that_runs_needs_its_gone_output(
    tmp_path: Path,
) -> None:
    pipeline = load_pipeline(_pipeline(tmp_path))
    for made in ("in/a.txt", "in/b.txt", "em/x.gro"):
        (tmp_path / made).write_text("x")
    # every output there: nothing runs again
    assert pipeline.rerun_for_outputs({"prep", "em"}) == {}
    # em's pattern matches nothing now, and md runs: em runs again; it needs prep, whose
    # in/b.txt is gone: prep too (each with what is missing, in the pipeline's order)
    (tmp_path / "em" / "x.gro").unlink()
    (tmp_path / "in" / "b.txt").unlink()
    assert pipeline.rerun_for_outputs({"prep", "em"}) == {
        "prep": ["in/b.txt"],
        "em": ["em/*.gro"],
    }
    # the same outputs gone, but every step that needs them is done: nothing runs again
    assert pipeline.rerun_for_outputs({"prep", "em", "md", "plot"}) == {}
    # plot runs and needs prep's outputs; em's are needed only by done md
    assert pipeline.rerun_for_outputs({"prep", "em", "md"}) == {"prep": ["in/b.txt"]}


def test_the_note_names_the_step_its_run_and_what_is_gone() -> None:
    assert gone_note("prep", ["a.txt"], "r1") == (
        "step prep succeeded in run r1, but its output a.txt is gone and a step that runs "
        "now needs it: it runs again, from the start"
    )
    many = gone_note("prep", ["a", "b", "c", "d", "e"], "r1")
    assert "its outputs a, b, c and 2 more are gone" in many


def test_a_step_run_again_for_its_outputs_starts_from_no_checkpoint(tmp_path: Path) -> None:
    """Its checkpoint where it succeeded is of a finished step: an engine resumed from it
    has nothing left to do and writes none of the outputs the resume needs."""
    import numpy as np

    from flows._run import _Run
    from m27.checkpoint import Checkpointer

    home = tmp_path / "home"
    old = home / "checkpoints" / "old"
    with Checkpointer(old / "prep") as ck:
        ck.save({"x": np.zeros(4)}, step=1)
    (tmp_path / "p.yaml").write_text(
        "name: p\nsteps:\n  - {name: prep, type: cpu, command: prep.sh, checkpoint: 5m}\n"
    )
    pipeline = load_pipeline(tmp_path / "p.yaml")

    def run(fresh: frozenset[str]) -> _Run:
        return _Run("new", pipeline, cast(Any, None), home, cast(Any, None), [old], fresh)

    found = run(frozenset()).resume_from("prep")  # failed there: goes on from it
    assert found is not None and Path(found).parent == old / "prep"
    assert run(frozenset({"prep"})).resume_from("prep") is None


def test_rerun_runs_the_step_and_every_step_after_it_from_the_start(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Resuming b (prep done in a, em done in b) with --rerun prep: prep, em and md run,
    none from a checkpoint of a or b; plot, after prep too, would have run anyway."""
    spec = _pipeline(tmp_path)
    pipeline = load_pipeline(spec)
    logger = logging.getLogger("test-rerun")
    monkeypatch.setattr("flows.pipeline.get_run_logger", lambda: logger)
    with caplog.at_level(logging.WARNING, logger="test-rerun"):
        done, _, fresh = _previous_successes(_store(), "b", pipeline, ["prep"])
    assert done == {} and fresh == {"prep", "em", "md", "plot"}
    assert caplog.messages == [rerun_note(["prep"], ["prep", "em", "md", "plot"])]
    # --rerun em: prep stays done in a; em and md run again
    for made in ("in/a.txt", "in/b.txt"):
        (tmp_path / made).write_text("x")
    done, _, fresh = _previous_successes(_store(), "b", pipeline, ["em"])
    assert done == {"prep": "a"} and fresh == {"em", "md"}


def test_the_rerun_note_names_what_runs_with_the_steps_asked_for() -> None:
    assert rerun_note(["md"], ["md"]) == (
        "--rerun md: it runs again from the start (no checkpoint of an earlier run is restored)"
    )
    assert rerun_note(["a", "b"], ["a", "b", "c", "d"]).endswith(
        "they run again from the start (no checkpoint of an earlier run is restored), and so "
        "do the steps waiting on them: c, d"
    )
    many = rerun_note(["a"], ["a", *(f"s{i}" for i in range(12))])
    assert many.endswith("s8, s9 and 2 more")


@pytest.mark.parametrize(
    ("rerun", "resume_of", "message"),
    [
        ("em", "b", "rerun: must be a list of step names, got 'em'"),
        ([1], "b", "rerun: must be a list of step names, got [1]"),
        (["em"], None, "rerun: needs resume_of: a run that resumes none runs every step"),
        (["emm"], "b", "rerun: pipeline 'p' has no step 'emm' (did you mean 'em'?"),
    ],
)
def test_a_rerun_parameter_the_flow_cannot_use_is_refused_in_one_line(
    tmp_path: Path, rerun: object, resume_of: str | None, message: str
) -> None:
    """A deployment's Custom run in Prefect's UI takes `rerun` as JSON a person typed."""
    pipeline = load_pipeline(_pipeline(tmp_path))
    with pytest.raises(SpecError, match=r"flow parameters: ") as refused:
        _params.rerun_steps(rerun, resume_of, pipeline)
    assert message in str(refused.value)
    assert _params.rerun_steps(["md", "em", "md"], "b", pipeline) == ["md", "em"]
    assert _params.rerun_steps(None, None, pipeline) == []
