"""The lab's service files hold together (no Docker engine here: checked structurally)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
COMPOSE = INFRA / "compose.yaml"
UNITS = sorted((INFRA / "systemd").glob("*.service"))
M27_SERVICES = {"agent", "worker", "exporter", "notifier", "bot"}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_compose_has_every_lab_service_with_an_image_and_a_command() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "prefect-server", "prometheus", "grafana"} | M27_SERVICES
    for name, svc in services.items():
        assert svc.get("image"), f"{name} has no image"
        # grafana alone runs its image's own entrypoint
        assert svc.get("command") or name == "grafana", f"{name} has no command"
    for name in M27_SERVICES:
        assert services[name]["command"][0] == "m27"
        assert services[name]["environment"]["M27_HOME"] == "/var/lib/m27"
    assert services["agent"]["command"] == ["m27", "agent"]
    assert services["worker"]["command"] == ["m27", "worker"]


def test_prefect_runs_on_postgresql_and_grafana_gets_the_boards() -> None:
    services = compose()["services"]
    url = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert url.startswith("postgresql+asyncpg://")
    mounts = services["grafana"]["volumes"]
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    assert any(m.startswith("../grafana/dashboards:") for m in mounts)
    for mount in mounts + services["prometheus"]["volumes"]:
        source = mount.split(":")[0]
        if source.startswith("."):
            assert (INFRA / source).resolve().exists(), mount


def test_every_named_volume_is_declared() -> None:
    data = compose()
    declared = set(data["volumes"])
    used = set()
    for svc in data["services"].values():
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/", "$")):
                used.add(source)
    assert used == declared


def test_every_compose_variable_is_documented() -> None:
    text = COMPOSE.read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = (INFRA / "m27.env.example").read_text()
    documented = set(re.findall(r"^([A-Z0-9_]+)=", example, re.M))
    assert used <= documented, used - documented
    header = text.split("name: m27")[0]
    for var in used - {"M27_TELEGRAM_CHAT_IDS"}:
        assert var in header, f"{var} not described in compose.yaml's header"


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_unit_runs_an_m27_command_with_the_node_home(unit: Path) -> None:
    text = unit.read_text()
    service = unit.stem.removeprefix("m27-")
    exec_line = re.search(r"^ExecStart=(.*)$", text, re.M)
    assert exec_line is not None
    argv = exec_line.group(1).split()
    assert argv[0].endswith("/m27") and argv[1] == service
    assert "Environment=M27_HOME=/var/lib/m27" in text
    assert "EnvironmentFile=-/etc/m27/m27.env" in text
    assert "Restart=on-failure" in text and "WantedBy=multi-user.target" in text


def test_there_is_a_unit_per_node_service() -> None:
    assert {u.stem.removeprefix("m27-") for u in UNITS} == M27_SERVICES


def test_systemd_analyze_accepts_the_units(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (the structural tests above still ran)")
    for unit in UNITS:  # point ExecStart at an executable that exists here
        text = unit.read_text().replace("/opt/m27/venv/bin/m27", sys.executable)
        (tmp_path / unit.name).write_text(text)
    out = subprocess.run(
        [tool, "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_start_postgres_script_is_valid_bash() -> None:
    script = INFRA / "scripts" / "start-postgres.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert "apt-get install" in script.read_text()


def test_the_images_build_stage_copies_what_a_wheel_with_the_hasher_needs(tmp_path: Path) -> None:
    """The Dockerfile copied neither LICENSE (setuptools: `Pattern 'LICENSE' did not match
    any files`, an error from 2027) nor setup.py and csrc/, and built on the slim image
    with no compiler: the image's checkpoints hashed from Python. The build stage's COPY
    lines, staged as Docker would, must build a wheel with the compiled hasher and both
    licenses."""
    import zipfile

    stage = (INFRA / "Dockerfile").read_text().split("\nFROM ")[1]  # the build stage
    copies = re.findall(r"^COPY (?!--)(.+)$", stage, flags=re.M)
    assert copies, stage
    for line in copies:
        *sources, dest = line.split()
        for source in sources:
            target = tmp_path / dest / (Path(source).name if dest.endswith("/") else "")
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("*.so"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "did not match any files" not in built.stderr, built.stderr[-3000:]
    (wheel,) = (tmp_path / "w").glob("m27-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("m27/checkpoint/_spans.") and n.endswith(".so") for n in names)
    licenses = [n for n in names if "/licenses/" in n]
    assert any(n.endswith("licenses/LICENSE") for n in licenses), licenses
    assert any(n.endswith("xxhash/LICENSE") for n in licenses), licenses
