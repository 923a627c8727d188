"""`m27 notify test|status|retry` as a user runs them, against a local Bot API server."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27.cli import main
from m27.notify.outbox import Draft, Outbox
from tests.integration.fake_bot_api import FakeBotApi, running

pytestmark = pytest.mark.service

TOKEN = "777:cli-token-secret"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBotApi]:
    with running(TOKEN) as server:
        monkeypatch.setenv("M27_TELEGRAM_TOKEN", TOKEN)
        monkeypatch.setenv("M27_TELEGRAM_CHAT_IDS", "1,2")
        monkeypatch.setenv("M27_TELEGRAM_API_URL", server.base_url)
        yield server


def test_notify_test_sends_to_every_chat(
    api: FakeBotApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["notify", "test"]) == 0
    out = capsys.readouterr().out
    assert "chat 1: sent as @m27_test_bot" in out and "chat 2: sent" in out
    assert all("m27 test message" in t for t in api.sent()) and len(api.sent()) == 2


def test_notify_test_reports_a_refusing_chat(
    api: FakeBotApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.fail("400", "sendMessage")
    assert main(["notify", "test"]) == 1
    captured = capsys.readouterr()
    assert "chat 1: FAILED" in captured.err and "Chat not found" in captured.err
    assert TOKEN not in captured.out + captured.err


def test_notify_test_with_a_rejected_token_never_prints_it(
    api: FakeBotApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_TELEGRAM_TOKEN", "777:wrong-token-also-secret")
    assert main(["notify", "test"]) == 1
    captured = capsys.readouterr()
    assert "rejected the bot token" in captured.err
    assert "wrong-token-also-secret" not in captured.out + captured.err


def test_a_bot_api_servers_bare_address_works_and_a_dead_one_is_named(
    api: FakeBotApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the address a self-hosted server is started on, without /bot (the token went into
    # the port: `Invalid port: '8081***'`)
    monkeypatch.setenv("M27_TELEGRAM_API_URL", api.base_url.removesuffix("/bot"))
    assert main(["notify", "test"]) == 0
    assert len(api.sent()) == 2
    capsys.readouterr()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("M27_TELEGRAM_API_URL", f"http://127.0.0.1:{port}")
    assert main(["notify", "test"]) == 1
    err = capsys.readouterr().err
    assert "getMe failed" in err and f"(Bot API http://127.0.0.1:{port}/bot<token>)" in err
    assert TOKEN not in err


def test_a_world_readable_token_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN)
    f.chmod(0o644)
    monkeypatch.delenv("M27_TELEGRAM_TOKEN", raising=False)
    monkeypatch.setenv("M27_TELEGRAM_TOKEN_FILE", str(f))
    monkeypatch.setenv("M27_TELEGRAM_CHAT_IDS", "1")
    assert main(["notify", "test"]) == 2
    err = capsys.readouterr().err
    assert "chmod 600" in err and TOKEN not in err


def test_notify_without_a_token_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("M27_TELEGRAM_TOKEN", raising=False)
    assert main(["notify", "test"]) == 2


def test_status_lists_parked_messages_and_retry_requeues_them(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    box = Outbox(m27_home / "notify.db")
    box.enqueue([Draft(5, "run_failed", "x"), Draft(6, "run_succeeded", "y")], [9], 0.0, cursor=6)
    box.park(box.pending()[0].id, 1, "Forbidden: bot was blocked", permanent=True)
    assert main(["notify", "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cursor"] == 6 and data["counts"] == {"pending": 1, "sent": 0, "parked": 1}
    assert data["parked"][0]["error"] == "Forbidden: bot was blocked"
    assert main(["notify", "retry"]) == 0
    assert "1 parked message(s) back" in capsys.readouterr().out
    assert box.counts()["parked"] == 0
    box.close()


def test_status_of_a_node_that_never_notified_says_the_outbox_is_empty(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["notify", "status"]) == 0
    assert capsys.readouterr().out.splitlines() == ["cursor: event 0", "outbox: empty"]
    box = Outbox(m27_home / "notify.db")
    box.enqueue([Draft(5, "run_failed", "x")], [9], 0.0, cursor=5)
    box.close()
    assert main(["notify", "status"]) == 0
    assert "outbox: 0 parked, 1 pending, 0 sent" in capsys.readouterr().out
