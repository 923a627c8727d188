"""Which ended runs the node service settles in Prefect (m27.node.settle.ended_runs): the
ones of this host whose flow process is gone; Prefect itself is in test_node_service."""

from __future__ import annotations

from m27 import events as ev
from m27.events.state import fold
from m27.node.settle import ended_runs


def _submitted(run_id: str, pid: int, host: str = "here") -> ev.RunSubmitted:
    return ev.RunSubmitted(
        1.0, run_id, "p", "p.yaml", ("s",), flow_run_id=f"fr-{run_id}", pid=pid, host=host
    )


def test_ended_runs_of_this_host_whose_process_is_gone_are_settled_once() -> None:
    state = fold(
        [
            _submitted("done", 10),
            ev.RunSucceeded(2.0, "done", 1.0),
            _submitted("exiting", 11),  # ended in the log, its process not yet gone
            ev.RunFailed(2.0, "exiting", 1.0, ("s",), "step s failed"),
            _submitted("elsewhere", 12, host="other"),
            ev.RunCancelled(2.0, "elsewhere"),
            _submitted("running", 13),
            _submitted("crashed", 14),
            ev.RunCrashed(2.0, "crashed", "flow run process 14 died"),
        ]
    )
    alive = {11, 13}
    found = ended_runs(state, set(), "here", lambda pid, _started: pid in alive)
    assert sorted(found) == ["fr-crashed", "fr-done"]
    assert found["fr-crashed"].crashed and found["fr-done"].status == "succeeded"
    assert ended_runs(state, {"fr-done", "fr-crashed"}, "here", lambda *_: False) == {
        "fr-exiting": state.runs["exiting"]
    }
