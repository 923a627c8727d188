"""`m27 run` with Telegram configured: the phone hears the outcome and the bot answers while
the run goes on, with no `m27 notifier` or `m27 bot` service running."""

from __future__ import annotations

import subprocess
import textwrap
import threading
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state
from tests.integration.fake_bot_api import running
from tests.waiting import wait_until

pytestmark = pytest.mark.service

TOKEN = "555:embedded-secret"


def test_run_sends_its_outcome_and_answers_status_from_the_phone(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "answered"
    spec = tmp_path / "tg.yaml"
    # The step lasts until the bot has answered from inside the run (the test says when).
    spec.write_text(
        textwrap.dedent(f"""\
        name: tg
        pipeline:
          - name: slow
            type: cpu
            command: python -c "import os, time; [time.sleep(0.05) for _ in iter(lambda:os.path.exists('{flag}'), True)]"
    """)
    )
    with running(TOKEN) as api:
        monkeypatch.setenv("M27_TELEGRAM_TOKEN", TOKEN)
        monkeypatch.setenv("M27_TELEGRAM_CHAT_IDS", "42")
        monkeypatch.setenv("M27_TELEGRAM_API_URL", api.base_url)
        api.push_message(42, "/status")
        api.push_message(99, "/status")  # not allow-listed: gets nothing
        box: list[subprocess.CompletedProcess[str]] = []
        runner = threading.Thread(target=lambda: box.append(m27("run", str(spec), "--plain")))
        runner.start()

        def answered() -> bool:
            return any("runs:" in text for text in api.sent(42))

        try:
            wait_until(
                lambda: answered() or not runner.is_alive(),
                timeout=300,
                interval=0.05,
                what="the bot's /status answer during the run",
            )
        finally:
            flag.write_text("go")
            runner.join(300)
        assert not runner.is_alive() and box, "m27 run did not end"
        done = box[0]
        assert answered(), done.stdout + done.stderr
        assert done.returncode == 0, done.stdout + done.stderr
        # `m27 run` waits for its notifier to send the outcome before it exits
        sent = api.sent(42)
        assert api.sent(99) == []
    (run,) = node_state(m27_home).runs.values()
    assert any("Run succeeded" in text and run.run_id in text for text in sent), sent
    assert any("runs:" in text for text in sent), sent  # the bot's /status answer
    assert TOKEN not in done.stdout + done.stderr
