"""What the warm runner sets up once for every run it forks, and how thin its client is."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import (
    PREFECT_API_SSL_CERT_FILE,
    PREFECT_API_URL,
    PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    temporary_settings,
)

from m27.cli.prefect_run import run_settings, small_ca_file

ROOT = Path(__file__).resolve().parents[2]


def test_the_small_ca_file_holds_one_certificate_that_ssl_loads(tmp_path: Path) -> None:
    path = small_ca_file(tmp_path)
    assert path is not None and path.is_relative_to(tmp_path)
    assert path.read_text().count("-----BEGIN CERTIFICATE-----") == 1
    context = ssl.create_default_context(cafile=str(path))
    assert len(context.get_ca_certs()) == 1
    assert context.verify_mode == ssl.CERT_REQUIRED  # TLS, if ever used, still verifies


def test_no_small_ca_file_where_it_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "prefect").write_text("a file where the folder would be")
    assert small_ca_file(tmp_path) is None


def test_the_nodes_own_http_server_gets_the_small_bundle_and_no_csrf(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    with (
        temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api"}),
        run_settings(ca, own_server=True),
    ):
        assert PREFECT_API_SSL_CERT_FILE.value() == str(ca)
        assert PREFECT_CLIENT_CSRF_SUPPORT_ENABLED.value() is False
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None


def test_a_lab_server_keeps_its_tls_bundle_and_csrf(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    with (
        temporary_settings({PREFECT_API_URL: "https://prefect.lab:4200/api"}),
        run_settings(ca, own_server=False),
    ):
        assert PREFECT_API_SSL_CERT_FILE.value() == os.environ.get("SSL_CERT_FILE")  # as before
        assert PREFECT_CLIENT_CSRF_SUPPORT_ENABLED.value() is True
    mp = pytest.MonkeyPatch()
    with mp.context() as env:
        env.setenv("PREFECT_API_SSL_CERT_FILE", "/own.pem")
        with (
            temporary_settings(
                {PREFECT_API_URL: "http://127.0.0.1:1/api", PREFECT_API_SSL_CERT_FILE: "/own.pem"}
            ),
            run_settings(ca),
        ):
            assert PREFECT_API_SSL_CERT_FILE.value() == "/own.pem"  # the user's choice wins


def test_the_client_imports_neither_settings_nor_the_service_nor_psutil(tmp_path: Path) -> None:
    """No runner serves this home, so the client gives up after one connect; what it
    imported on the way is what every warm `m27 run` pays for."""
    code = (
        "import sys\n"
        "from m27.cli import warm_client as warm\n"
        "served = warm.run_warm(['one.yaml'])\n"
        "heavy = ('m27.config', 'm27.node.service', 'psutil', 'prefect', 'yaml')\n"
        "print(json.dumps([served, [m for m in heavy if m in sys.modules]]))\n"
    )
    env = {**os.environ, "M27_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == [None, []]
