"""An event log m27 cannot open says what is wrong with it and what to do, not SQLite's
bare text ("file is not a database"), and never blames a full disk that is not one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from m27 import StoreError
from m27.cli.main import main
from m27.store._sql import SQLITE_PATH_MAX, disk_full
from m27.store.sqlite import SqliteEventStore


def test_a_damaged_log_says_how_to_start_a_new_one_and_what_that_costs(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = m27_home / "events.db"
    log.write_bytes(os.urandom(8192))
    assert main(["runs"]) == 1
    err = capsys.readouterr().err
    assert f"cannot open event log {log}: file is not a database. The event log is damaged" in err
    assert f"`m27 agent stop`) and move {log} aside" in err
    assert f"`sqlite3 {log} .recover`" in err and "Traceback" not in err


def test_a_folder_where_the_log_should_be_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "events.db").mkdir()
    with pytest.raises(StoreError, match=r"events\.db is a folder; m27 keeps its event log"):
        SqliteEventStore(tmp_path / "events.db")


def test_a_path_too_long_for_sqlite_says_so(tmp_path: Path) -> None:
    deep = tmp_path
    while len(str(deep)) <= SQLITE_PATH_MAX:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    with pytest.raises(StoreError, match=r"characters long; SQLite opens at most 512"):
        SqliteEventStore(deep / "events.db")


def test_a_filesystem_without_blocks_is_not_a_full_disk() -> None:
    # M27_HOME=/proc/self: "unable to open database file (the disk holding it is full)"
    assert not disk_full("/proc/self")
