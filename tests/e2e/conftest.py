"""Fixtures for driving `m27` against the session's real Prefect server."""

from __future__ import annotations

import pytest

from tests.e2e._helpers import M27, call_m27


@pytest.fixture
def m27(prefect_env: str) -> M27:
    return call_m27
