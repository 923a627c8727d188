"""The exporter's HTTP server (issue 15): metrics on / and /metrics only, and a burst of
200 concurrent scrapes from localhost all answered (a real listen backlog)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Counter

from m27.monitoring.server import BACKLOG, serve


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("m27_test_scrapes", "a metric to find", registry=registry).inc()
    return registry


def test_metrics_are_served_on_metrics_and_root_and_404_elsewhere() -> None:
    server, thread = serve(_registry(), "127.0.0.1", 0)
    port = server.server_address[1]
    try:
        for path in ("/metrics", "/"):
            status, body = _get(port, path)
            assert status == 200 and b"m27_test_scrapes_total 1.0" in body
        for path in ("/nonexistent", "/metrics/x", "/favicon.ico"):
            assert _get(port, path)[0] == 404
    finally:
        server.shutdown()
        thread.join(10)


def test_a_burst_of_200_concurrent_scrapes_is_answered() -> None:
    assert BACKLOG >= 200
    server, thread = serve(_registry(), "127.0.0.1", 0)
    port = server.server_address[1]
    start = threading.Barrier(200)

    def scrape(_: int) -> int:
        start.wait(timeout=60)
        return _get(port, "/metrics")[0]

    try:
        with ThreadPoolExecutor(200) as pool:
            statuses = list(pool.map(scrape, range(200)))
        assert statuses == [200] * 200
    finally:
        server.shutdown()
        thread.join(10)
