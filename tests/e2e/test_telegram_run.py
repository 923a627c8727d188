"""`m27 run` with Telegram configured: the phone hears the outcome and the bot answers while
the run goes on, with no `m27 notifier` or `m27 bot` service running."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state
from tests.integration.fake_bot_api import running

pytestmark = pytest.mark.service

TOKEN = "555:embedded-secret"


def test_run_sends_its_outcome_and_answers_status_from_the_phone(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "tg.yaml"
    spec.write_text(
        textwrap.dedent("""\
        name: tg
        pipeline:
          - name: slow
            type: cpu
            command: python -c "import time; time.sleep(6); print('done')"
    """)
    )
    with running(TOKEN) as api:
        monkeypatch.setenv("M27_TELEGRAM_TOKEN", TOKEN)
        monkeypatch.setenv("M27_TELEGRAM_CHAT_IDS", "42")
        monkeypatch.setenv("M27_TELEGRAM_API_URL", api.base_url)
        api.push_message(42, "/status")
        api.push_message(99, "/status")  # not allow-listed: gets nothing
        done = m27("run", str(spec), "--plain")
        assert done.returncode == 0, done.stdout + done.stderr
        sent = api.sent(42)
        assert api.sent(99) == []
    (run,) = node_state(m27_home).runs.values()
    assert any("Run succeeded" in text and run.run_id in text for text in sent), sent
    assert any("runs:" in text for text in sent), sent  # the bot's /status answer
    assert TOKEN not in done.stdout + done.stderr
