"""The Grafana boards and Prometheus rules only name series the exporter or a rule makes.

The integration suite evaluates every query against a real Prometheus; this check runs
without one, so a renamed metric fails fast on any machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from m27 import events as ev
from tests.unit.exporter_helpers import T0, granted, make_node, queued, started, submitted

ROOT = Path(__file__).resolve().parents[2]
BOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
RULES = sorted((ROOT / "infra" / "prometheus" / "rules").glob("*.yml"))
NAME = re.compile(r"\b((?:m27_|[a-z]+:m27_)[a-zA-Z0-9_:]+)")


def _targets() -> list[dict[str, Any]]:
    out = []
    for path in BOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            out += panel["targets"]
    return out


def _exported_names() -> set[str]:
    node = make_node(gpus=2)
    node.intervals["r1"] = {"md": 60.0}
    node.append(
        submitted("r1", ("md",)),
        queued("r1", "md", T0),
        granted("r1", "md", T0),
        started("r1", "md", T0),
        ev.StepFlopsReported(at=T0, run_id="r1", step="md", flops=1e12),
        ev.CheckpointWritten(
            at=T0,
            run_id="r1",
            step="md",
            path="/c",
            sim_step=1,
            bytes_written=1,
            bytes_total=1,
            duration_s=0.1,
        ),
    )
    node.scrape()
    node.clock.advance(5)
    text = generate_latest(node.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_every_board_and_rule_names_a_series_that_exists() -> None:
    exported = _exported_names()
    recorded = {
        rule["record"]
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    exprs = [t["expr"] for t in _targets()]
    exprs += [
        rule["expr"]
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    unknown = {
        name for expr in exprs for name in NAME.findall(expr) if name not in exported | recorded
    }
    assert unknown == set()


def test_the_three_boards_use_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(
        (ROOT / "grafana" / "provisioning" / "datasources" / "m27-prometheus.yml").read_text()
    )
    uid = provisioned["datasources"][0]["uid"]
    titles = set()
    for path in BOARDS:
        board = json.loads(path.read_text())
        titles.add(board["title"])
        assert board["uid"] and board["panels"]
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == uid
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid
    assert titles == {"m27 / GPU utilization", "m27 / Queue & runs", "m27 / Energy"}
