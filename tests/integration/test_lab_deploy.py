"""`m27 deploy` against Prefect on PostgreSQL: what a deployment holds, what `prefect
deploy` of deployments/prefect.yaml makes of the same, and a bad file refused first. (A
deployment's runs on the lab's workers: test_scale.py.)"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from m27._exceptions import SpecError
from m27.cli.commands import deploy as deploy_cmd
from m27.cli.commands import pool as pool_cmd
from tests.commands import cli
from tests.integration.conftest_scale import (
    SLEEPER,
    Lab,
    postgres_prefect,  # noqa: F401  (fixture)
    sync_client,
)

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def lab(
    postgres_prefect: Lab,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("deploy")
    spec = base / "sleeper.yaml"
    spec.write_text(SLEEPER)
    with temporary_settings({PREFECT_API_URL: postgres_prefect.api_url}):
        assert cli(pool_cmd, ["pool", "init"]) == 0
        yield {"lab": postgres_prefect, "spec": spec, "base": base}


def _deploy(lab: dict[str, Any], name: str, tier: str, *extra: str) -> None:
    argv = ["deploy", str(lab["spec"]), "--name", name, "--tier", tier, *extra]
    assert cli(deploy_cmd, argv) == 0


def test_deploy_creates_then_updates_one_deployment(lab: dict[str, Any]) -> None:
    _deploy(
        lab,
        "nightly",
        "background",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--set",
        "SECONDS=7",
    )
    _deploy(lab, "nightly", "ready", "--cron", "30 3 * * *", "--set", "SECONDS=8")
    with sync_client(lab["lab"]) as client:
        dep = client.read_deployment_by_name("m27-pipeline/nightly")
        schedules = client.read_deployment_schedules(dep.id)
        client.delete_deployment(dep.id)
    assert dep.work_pool_name == "m27" and dep.work_queue_name == "ready"
    assert dep.parameters == {
        "spec_path": str(lab["spec"].resolve()),
        "overrides": {"SECONDS": "8"},
        "pipeline_name": "sleeper",
    }
    assert [(s.schedule.cron, s.schedule.timezone) for s in schedules] == [("30 3 * * *", "UTC")]
    assert dep.entrypoint == "flows/pipeline.py:pipeline_flow"
    assert dep.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $M27_FLOWS_DIR }}"}}
    ]


def test_prefect_yaml_deploys_what_m27_deploy_would(lab: dict[str, Any]) -> None:
    import sys

    from tests.integration.conftest_scale import ROOT

    env = lab["lab"].client_env(PREFECT_HOME=str(lab["base"] / "cli-home"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            "deployments/prefect.yaml",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    _deploy(lab, "via-m27", "background")
    with sync_client(lab["lab"]) as client:
        yaml_dep = client.read_deployment_by_name("m27-pipeline/md-example-nightly")
        m27_dep = client.read_deployment_by_name("m27-pipeline/via-m27")
        client.delete_deployment(yaml_dep.id)
        client.delete_deployment(m27_dep.id)
    same = ("entrypoint", "work_pool_name", "work_queue_name", "pull_steps")
    assert {k: getattr(yaml_dep, k) for k in same} == {k: getattr(m27_dep, k) for k in same}
    assert set(yaml_dep.parameters) == set(m27_dep.parameters)
    assert sorted(yaml_dep.tags) == ["m27", "pipeline:md-example", "tier:background"]


def test_deploy_refuses_a_bad_pipeline_before_calling_prefect(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline:\n  - name: x\n    type: tpu\n    command: echo\n")
    with pytest.raises(SpecError):
        cli(deploy_cmd, ["deploy", str(bad), "--name", "bad"])
