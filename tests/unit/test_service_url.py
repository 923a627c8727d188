"""Which PREFECT_API_URL names the node service's server (m27.node.service.same_server):
a run whose URL names another one is refused, so the comparison must not be fooled by
spelling, nor join two servers."""

from __future__ import annotations

import pytest

from m27.node.service import same_server


@pytest.mark.parametrize(
    "other",
    [
        "http://127.0.0.1:4200/api",
        "http://127.0.0.1:4200/api/",
        "http://localhost:4200/api",
        "HTTP://LOCALHOST:4200/api",
        " http://127.0.0.1:4200/api ",
    ],
)
def test_one_server_written_another_way_is_the_same(other: str) -> None:
    assert same_server("http://127.0.0.1:4200/api", other)


@pytest.mark.parametrize(
    "other",
    [
        "http://127.0.0.1:4201/api",  # another port
        "https://127.0.0.1:4200/api",  # another scheme
        "http://10.0.0.5:4200/api",  # another host
        "http://127.0.0.1:4200/prefect/api",  # another path
        "http://127.0.0.1:notaport/api",  # unreadable: never equal to a real one
    ],
)
def test_another_server_is_not_the_same(other: str) -> None:
    assert not same_server("http://127.0.0.1:4200/api", other)


def test_the_default_port_of_the_scheme_counts_as_written() -> None:
    assert same_server("https://prefect.lab.example/api", "https://prefect.lab.example:443/api")
    assert not same_server("https://prefect.lab.example/api", "http://prefect.lab.example/api")
