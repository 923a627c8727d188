"""Unit-test fixtures: no step a test started keeps looping after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.agent_helpers import end_steps


@pytest.fixture(autouse=True)
def _end_looping_steps() -> Iterator[None]:
    yield
    end_steps()
