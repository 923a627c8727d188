"""Telegram settings: the token stays secret, token files must be private, filters, quiet hours."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from m27._exceptions import ConfigError
from m27.notify.config import KINDS, QuietHours, Secret, load_config

TOKEN = "123456:AAH-very-secret-token"


def test_secret_never_shows_its_value() -> None:
    s = Secret(TOKEN)
    assert TOKEN not in repr(s) and TOKEN not in str(s) and TOKEN not in f"{s}"
    assert s.reveal() == TOKEN


def test_config_from_environment() -> None:
    cfg = load_config(
        {
            "M27_TELEGRAM_TOKEN": TOKEN,
            "M27_TELEGRAM_CHAT_IDS": "42, -1001; 42",
            "M27_TELEGRAM_API_URL": "http://127.0.0.1:8081/bot/",
        }
    )
    assert cfg.enabled and cfg.chat_ids == (42, -1001)
    assert cfg.api_url == "http://127.0.0.1:8081/bot"
    assert cfg.kinds == frozenset(KINDS)
    assert TOKEN not in repr(cfg) and TOKEN not in str(cfg.describe())
    assert cfg.describe()["telegram.token"] == "*** (set)"


def test_no_token_means_disabled() -> None:
    cfg = load_config({"M27_TELEGRAM_CHAT_IDS": "42"})
    assert not cfg.enabled and cfg.describe()["telegram.token"] == "(not set)"


def test_token_file_with_mode_600_is_read(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    cfg = load_config({"M27_TELEGRAM_TOKEN_FILE": str(f), "M27_TELEGRAM_CHAT_IDS": "1"})
    assert cfg.token == Secret(TOKEN)


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text(TOKEN)
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_config({"M27_TELEGRAM_TOKEN_FILE": str(f)})
    assert TOKEN not in str(info.value)


def test_token_file_in_home_is_found(tmp_path: Path) -> None:
    (tmp_path / "telegram.token").write_text(TOKEN)
    (tmp_path / "telegram.token").chmod(0o600)
    assert load_config({"M27_HOME": str(tmp_path)}).token == Secret(TOKEN)


@pytest.mark.parametrize(
    "bad",
    [
        {"M27_TELEGRAM_CHAT_IDS": "42,abc"},
        {"M27_TELEGRAM_EVENTS": "run_failed,run_exploded"},
        {"M27_TELEGRAM_QUIET_HOURS": "late-night"},
        {"M27_TELEGRAM_TZ": "Mars/Olympus"},
        {"M27_TELEGRAM_API_URL": "api.telegram.org"},
        {"M27_TELEGRAM_API_URL": "http://127.0.0.1:80x81/bot"},
        {"M27_TELEGRAM_API_URL": "http:///bot"},
        {"M27_TELEGRAM_MAX_ATTEMPTS": "0"},
        {"M27_TELEGRAM_RESUME": "maybe"},
    ],
)
def test_bad_values_are_config_errors(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_config(bad)


@pytest.mark.parametrize(
    ("value", "allowed"), [("1", True), ("on", True), ("TRUE", True), ("0", False), ("", False)]
)
def test_resume_from_the_phone_is_off_unless_the_node_says_so(value: str, allowed: bool) -> None:
    assert load_config({"M27_TELEGRAM_RESUME": value}).allow_resume is allowed
    assert load_config({}).allow_resume is False


def test_failures_filter_keeps_failures_and_test_messages() -> None:
    cfg = load_config({"M27_TELEGRAM_EVENTS": "failures"})
    assert cfg.wants("run_failed") and cfg.wants("gpu_lost") and cfg.wants("test")
    assert not cfg.wants("run_succeeded") and not cfg.wants("step_retried")


def test_explicit_kind_list() -> None:
    cfg = load_config({"M27_TELEGRAM_EVENTS": "run_succeeded, gpu_hot"})
    assert cfg.wants("gpu_hot") and not cfg.wants("run_failed")


def at(hour: int, minute: int = 0) -> float:
    return dt.datetime(2024, 5, 1, hour, minute, tzinfo=dt.UTC).timestamp()


def test_quiet_hours_across_midnight_hold_success_until_morning() -> None:
    cfg = load_config({"M27_TELEGRAM_QUIET_HOURS": "22:00-07:00", "M27_TELEGRAM_TZ": "UTC"})
    assert cfg.held("run_succeeded", at(12)) is None
    assert cfg.held("run_succeeded", at(23, 30)) == at(7) + 86400
    assert cfg.held("run_succeeded", at(3)) == at(7)
    assert cfg.held("run_failed", at(3)) is None
    assert cfg.held("gpu_lost", at(3)) is None


def test_quiet_hours_within_a_day() -> None:
    q = QuietHours.parse("12:00-13:30", dt.UTC)
    assert q.contains(at(12, 45)) and not q.contains(at(13, 30)) and not q.contains(at(11))
    assert q.ends_after(at(12, 10)) == at(13, 30)


@pytest.mark.parametrize("bad", ["bad", "98765", ":XYZ", "98765:XY Z", "abc:XYZ"])
def test_a_token_that_is_not_a_bot_token_is_refused_without_showing_it(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config({"M27_TELEGRAM_TOKEN": bad, "M27_TELEGRAM_CHAT_IDS": "1"})
    assert "does not look like a bot token" in str(error.value)
    assert bad not in str(error.value)


def test_an_empty_m27_home_looks_for_the_token_in_the_default_home(tmp_path: Path) -> None:
    home = tmp_path / ".m27"
    home.mkdir()
    (home / "telegram.token").write_text(TOKEN)
    (home / "telegram.token").chmod(0o600)
    assert load_config({"HOME": str(tmp_path), "M27_HOME": ""}).token == Secret(TOKEN)


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://127.0.0.1:8081", "http://127.0.0.1:8081/bot"),  # a self-hosted server's address
        ("http://127.0.0.1:8081/", "http://127.0.0.1:8081/bot"),
        ("https://api.telegram.org/bot", "https://api.telegram.org/bot"),
        ("https://proxy.lab/telegram/bot/", "https://proxy.lab/telegram/bot"),
    ],
)
def test_a_bot_api_servers_address_alone_gets_the_bot_path(given: str, base: str) -> None:
    # without it the token was appended to the port: `Invalid port: '8081***'`
    assert load_config({"M27_TELEGRAM_API_URL": given}).api_url == base
