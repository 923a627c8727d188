"""/resume from the phone, on a node that allows it (`M27_TELEGRAM_RESUME=1`): the bot runs
`m27 run --resume RUN --detach`, in the run's environment, not its own, and answers with
the new run; a run that cannot be resumed gets the command's own reason. Without the
setting the bot only names the command."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state, spawn_m27
from tests.integration.fake_bot_api import running
from tests.waiting import wait_until

pytestmark = pytest.mark.service

TOKEN = "555:resume-secret"
CHAT = 42


def test_resume_from_the_phone_starts_the_resume_on_the_node(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "flaky.yaml"
    spec.write_text(
        textwrap.dedent("""\
        name: flaky
        pipeline:
          - name: prep
            type: cpu
            command: python -c "print('prepared')"
          - name: md
            type: gpu
            depends_on: [prep]
            command: lab-md
    """)
    )
    # The engine is on the PATH of the shell that ran the pipeline (`module load`), not
    # on the bot's: the resume must run where the run did.
    tools = tmp_path / "modules" / "bin"
    tools.mkdir(parents=True)
    (tools / "lab-md").write_text("#!/bin/sh\ntest -e fixed || exit 3\n")
    (tools / "lab-md").chmod(0o755)
    bot_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{bot_path}")
    failed = m27("run", str(spec), "--plain")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    monkeypatch.setenv("PATH", bot_path)
    (first,) = node_state(m27_home).runs
    (tmp_path / "fixed").write_text("")  # what the person fixed before asking
    with running(TOKEN) as api:
        monkeypatch.setenv("M27_TELEGRAM_TOKEN", TOKEN)
        monkeypatch.setenv("M27_TELEGRAM_CHAT_IDS", str(CHAT))
        monkeypatch.setenv("M27_TELEGRAM_API_URL", api.base_url)
        monkeypatch.setenv("M27_TELEGRAM_RESUME", "1")
        api.push_message(CHAT, f"/resume {first}")
        api.push_message(CHAT, "/resume nosuchrun")
        bot = spawn_m27("bot", "--poll-timeout", "1", cwd=tmp_path)
        try:
            wait_until(
                lambda: sum(t.startswith(("Resumed", "Could not")) for t in api.sent(CHAT)) == 2,
                timeout=300,
                what="the bot's two /resume answers",
            )
        finally:
            bot.terminate()
            out, _ = bot.communicate(timeout=60)
        replies = [t for t in api.sent(CHAT) if t.startswith(("Resumed", "Could not"))]
    runs = node_state(m27_home).runs
    (second,) = (r for r in runs if r != first)
    assert replies[0].startswith(f"Resumed {first} as run {second}: it "), replies
    assert replies[1] == (
        "Could not resume nosuchrun (exit 2): no run matches 'nosuchrun' (see `m27 runs`)"
    )
    assert "Traceback" not in out and TOKEN not in out
    wait_until(
        lambda: node_state(m27_home).runs[second].status == "succeeded",
        timeout=120,
        what="the resumed run succeeding",
    )
    resumed = node_state(m27_home).runs[second]
    assert resumed.resume_of == first
    assert {n: s.status for n, s in resumed.steps.items()} == {
        "prep": "skipped",
        "md": "succeeded",
    }
