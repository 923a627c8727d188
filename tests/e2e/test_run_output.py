"""A step that prints a great deal: all of it on the terminal and in the step log, a bounded
part in Prefect's logs, and the program never held back by either."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state, prefect_log_messages
from tests.waiting import wait_until

LINES = 300_000  # `seq` prints ~2 MB: a record per line was 300,000 rows in Prefect


def test_a_chatty_step_reaches_prefect_in_batches_up_to_the_limit(
    m27: M27,
    tmp_path: Path,
    m27_home: Path,
    prefect_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("M27_PREFECT_LOG_LIMIT", "100KiB")
    spec = tmp_path / "chatty.yaml"
    spec.write_text(
        f"name: chatty\npipeline:\n  - name: spam\n    type: cpu\n    command: seq 1 {LINES}\n"
    )

    done = m27("run", str(spec), "--plain", timeout=600)

    assert done.returncode == 0, done.stderr[-2000:]
    shown = [line for line in done.stdout.splitlines() if " [spam] " in line]
    assert len(shown) == LINES and shown[-1].endswith(f"[spam] {LINES}")
    (run,) = node_state(m27_home).runs.values()
    log = (m27_home / "runs" / run.run_id / "spam.log").read_text().splitlines()
    assert log[1:-1] == [str(i) for i in range(1, LINES + 1)]

    warning = (
        "the step's output after its first 100.0KiB is not sent to Prefect"
        f" (prefect_log_limit); all of it is in the step log: m27 logs {run.run_id} spam"
    )

    def logged() -> list[str] | None:
        messages = prefect_log_messages(prefect_env, run.flow_run_id)
        return messages if warning in messages else None

    messages = wait_until(logged, timeout=60, interval=0.5, what="the limit's warning in Prefect")
    output = [m for m in messages if m[:1].isdigit()]
    # The lines of each read are one record, in order, and they stop at the limit: what
    # reached Prefect is the first lines, whole. A read holds up to 64 KiB and at least one
    # of seq's writes into a pipe (4 KiB blocks): 100 KiB is at most 25 records (how many
    # depends on how fast the reader keeps up: 11 were seen), where a record per line was
    # some 20,000.
    assert 1 <= len(output) <= 25
    sent = "\n".join(output).split("\n")
    assert sent == [str(i) for i in range(1, len(sent) + 1)]
    # counted as the limit counts: each record's text (records are not joined)
    assert 90 * 1024 < sum(len(m) for m in output) <= 100 * 1024
    assert messages.index(warning) > messages.index(output[-1])
