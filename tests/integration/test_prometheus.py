"""The exporter, the rules and the boards against a real Prometheus while a real pipeline runs.

Grafana itself cannot be installed here, so every panel's PromQL (template variables
replaced by concrete values) is evaluated through Prometheus' HTTP API instead, at a moment
when the pipeline's GPU step was running, and must return series carrying every label its
legend uses. Every recording rule must produce series at that moment; every alert rule
must be healthy, and the run-failed and exporter-down alerts must actually go off.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e._helpers import call_m27, node_state
from tests.integration.conftest import PROMETHEUS_DIR, ROOT, Prometheus, require_binary
from tests.waiting import wait_until

pytestmark = pytest.mark.service

NODE = "it-node"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")

PIPELINE = textwrap.dedent("""\
    name: itpipe
    pipeline:
      - name: prep
        type: cpu
        command: python -c "print('prep')"
      - name: train
        type: gpu
        depends_on: [prep]
        checkpoint: 60s
        command: python train.py
      - name: broken
        type: cpu
        depends_on: [prep]
        command: python -c "import sys; sys.exit(3)"
""")

TRAIN = textwrap.dedent("""\
    import time
    import numpy as np
    from m27.checkpoint import Checkpointer
    from m27.monitoring.energy import report_flops

    report_flops(4e12)
    with Checkpointer() as ck:
        for i in range(10):
            time.sleep(0.5)
            ck.save({"x": np.full(4096, i, dtype=np.float32)}, i)
""")


def panel_targets() -> list[tuple[str, str, str, str]]:
    """(board, panel title, expr, legend) for every target of every panel, rows included."""
    out: list[tuple[str, str, str, str]] = []

    def walk(board: str, panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(board, panel.get("panels", []))
            for target in panel.get("targets", []):
                out.append((board, panel["title"], target["expr"], target.get("legendFormat", "")))

    for path in DASHBOARDS:
        walk(path.stem, json.loads(path.read_text())["panels"])
    return out


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def substitute(expr: str, instance: str) -> str:
    """What Grafana would send with concrete variable values picked."""
    for var, value in (
        ("$__rate_interval", "4s"),
        ("$__interval", "1s"),
        ("$__range", "1m"),
        ("$instance", instance),
        ("$node", NODE),
        ("$gpu", "0|1"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def test_promtool_accepts_the_config_and_the_rules() -> None:
    promtool = require_binary("promtool")
    for args in (
        ["check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
        ["check", "rules", *map(str, RULE_FILES)],
    ):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = require_binary("promtool")
    tests = sorted(str(p) for p in (PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert tests
    done = subprocess.run(
        [promtool, "test", "rules", *tests], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


class RunningExporter:
    """`m27 exporter`'s pieces in this process: the HTTP server and the background passes."""

    def __init__(self, port: int) -> None:
        from prometheus_client import start_http_server

        from m27.gpu import detect
        from m27.monitoring.exporter import Sampler, build_registry
        from m27.store.sqlite import open_store

        self.store = open_store()
        self.sampler = Sampler(detect(), self.store, node=NODE)
        self.server, self.thread = start_http_server(
            port, addr="127.0.0.1", registry=build_registry(self.sampler)
        )
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(0.25):
            self.sampler.tick_if_stale(0.5)

    def close(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        self.ticker.join()
        self.server.shutdown()
        self.server.server_close()
        self.sampler.close()
        self.store.close()


@pytest.fixture
def exporter(prometheus: Prometheus, m27_home: Path) -> Iterator[RunningExporter]:
    running = RunningExporter(prometheus.exporter_port)
    try:
        yield running
    finally:
        running.close()


def test_boards_and_rules_evaluate_on_a_real_prometheus_while_a_pipeline_runs(
    prometheus: Prometheus,
    exporter: RunningExporter,
    prefect_env: str,
    m27_home: Path,
    tmp_path: Path,
) -> None:
    instance = f"127.0.0.1:{prometheus.exporter_port}"
    prometheus.wait_for(f'up{{job="m27", instance="{instance}"}} == 1')
    (tmp_path / "train.py").write_text(TRAIN)
    spec = tmp_path / "itpipe.yaml"
    spec.write_text(PIPELINE)
    done = call_m27("run", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr  # `broken` fails the run

    # The exporter records a step's energy on its first pass after the lease's release,
    # which may come after `m27 run` has exited: wait for that event (bounded).
    def measured() -> Any:
        (run,) = node_state(m27_home).runs.values()
        return run if run.steps["train"].energy_j > 0 else None

    run = wait_until(measured, timeout=60, interval=0.1, what="the train step's energy recorded")
    train = run.steps["train"]
    assert train.status == "succeeded" and train.started_at and train.ended_at
    assert train.ended_at - train.started_at > 3.0
    at = train.ended_at - 0.3  # the GPU step is running and has checkpointed

    # The exporter recorded the step's GPU energy when its lease was released. How many
    # joules depends on when the passes ran (a loaded machine samples late), so the test
    # holds it to what cannot depend on timing: the only GPU step got a share, and never
    # more than the simulated GPUs' energy counters counted in all (60-300 W integrated).
    assert train.energy_j > 0
    assert not run.steps["prep"].energy_j and not run.steps["broken"].energy_j
    with exporter.sampler.lock:
        counted = sum(s.energy_j or 0.0 for s in exporter.sampler.last.samples)
    assert train.energy_j <= counted
    # Prometheus has scraped the run's end.
    prometheus.wait_for(f'm27_runs_total{{instance="{instance}", outcome="failed"}} == 1')

    for board, title, expr, legend in panel_targets():
        query = substitute(expr, instance)
        result = prometheus.query(query, at)
        assert result, f"{board} / {title}: no series for {query}"
        wanted = set(LEGEND_LABEL.findall(legend))
        for series in result:
            missing = wanted - series["metric"].keys()
            assert not missing, f"{board} / {title}: series {series['metric']} lacks {missing}"

    for rule in rules():
        if "record" in rule:
            level = rule["record"].split(":")[0]
            result = prometheus.query(rule["record"], at)
            assert result, f"recording rule {rule['record']} produced nothing"
            labels = {"gpu": {"gpu", "uuid", "model", "node"}}.get(level, {level})
            for series in result:
                assert labels <= series["metric"].keys(), (rule["record"], series["metric"])
        else:
            prometheus.query(rule["expr"], at)  # evaluates without error

    loaded = prometheus.api("rules")["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in loaded for r in g["rules"]}
    assert len(health) == len(rules())
    assert all(h == ("ok", "") for h in health.values()), health

    def alert_state(name: str) -> str | None:
        for alert in prometheus.api("alerts")["alerts"]:
            if alert["labels"]["alertname"] == name:
                return str(alert["state"])
        return None

    wait_until(lambda: alert_state("M27RunFailed") == "firing", 60, 0.25, "M27RunFailed firing")

    exporter.close()
    wait_until(
        lambda: alert_state("M27ExporterDown") in ("pending", "firing"),
        60,
        0.25,
        "M27ExporterDown pending",
    )
