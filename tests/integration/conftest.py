"""A real Prometheus for the session, scraping one m27 exporter port with m27's rules loaded.

Prometheus comes from the Debian package (``infra/scripts/install-services.sh``). Without
it, a local run skips the tests that need it; with ``CI=true`` they fail instead, so CI can
never pass by skipping.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.services import free_port, unavailable, wait_http
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "infra" / "prometheus"


def require_binary(name: str) -> str:
    """The path of `name`; fails under CI=true, skips elsewhere, when it is missing."""
    path = shutil.which(name)
    if path is not None:
        return path
    unavailable(f"{name} is not installed: run `sudo infra/scripts/install-services.sh`")


@dataclass
class Prometheus:
    """A running Prometheus: its API, and the exporter port its ``m27`` job scrapes."""

    url: str
    exporter_port: int
    data_dir: Path

    def api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # a bad query: show Prometheus' reason
            pytest.fail(f"Prometheus {path} {params}: {exc.code} {exc.read().decode()[:500]}")
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (at `at`, or now)."""
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until `expr` returns at least one series; fails after `timeout` seconds."""
        return wait_until(lambda: self.query(expr), timeout, 0.25, f"a series for {expr!r}")


def _config(exporter_port: int) -> str:
    rules = sorted(str(p) for p in (PROMETHEUS_DIR / "rules").glob("*.yml"))
    return json.dumps(  # JSON is YAML: no quoting surprises in paths
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "scrape_configs": [
                {
                    "job_name": "m27",
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                }
            ],
        },
        indent=2,
    )


@pytest.fixture(scope="session")
def prometheus() -> Iterator[Prometheus]:
    binary = require_binary("prometheus")
    work = Path(tempfile.mkdtemp(prefix="m27-prometheus-"))
    port, exporter_port = free_port(), free_port()
    config = work / "prometheus.yml"
    config.write_text(_config(exporter_port))
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    if not wait_http(f"{url}/-/ready", proc, timeout=300):
        proc.kill()
        log.close()
        text = (work / "prometheus.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"prometheus did not start:\n{text}")
    try:
        yield Prometheus(url, exporter_port, work)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
