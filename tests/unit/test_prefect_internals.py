"""m27 leans on a few Prefect internals (m27/lab/_prefect.py): fail loudly when they move.

The worker's hooks are only right for the Prefect they were read against. These tests pin
that Prefect: the installed version, pyproject's exact pin, and the source of every
upstream function the hooks depend on. When one fails after an upgrade, re-read the named
function, check the hook's assumption (the comment beside it in ``UPSTREAM``), then update
the hash and ``PREFECT_VERSION``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import tomllib
from pathlib import Path
from typing import Any

import prefect
from prefect.utilities.dispatch import get_registry_for_type
from prefect.workers.base import BaseWorker
from prefect.workers.process import ProcessWorker

from m27.lab import _prefect
from m27.lab.worker import M27Worker

ROOT = Path(__file__).resolve().parents[2]


def _upstream(key: str) -> Any:
    module, _, qualname = key.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__func__", obj)  # a module-level classmethod object


def test_installed_prefect_is_the_one_the_hooks_were_read_against() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"prefect=={_prefect.PREFECT_VERSION}" in deps, deps
    assert prefect.__version__ == _prefect.PREFECT_VERSION


def test_every_wrapped_upstream_function_is_unchanged() -> None:
    changed = []
    for key, expected in _prefect.UPSTREAM.items():
        digest = hashlib.sha256(inspect.getsource(_upstream(key)).encode()).hexdigest()
        if digest != expected:
            changed.append(f"  {key}: sha256 {digest} (m27/lab/_prefect.py has {expected})")
    assert not changed, (
        f"Prefect {prefect.__version__} changed what m27's worker hooks depend on:\n"
        + "\n".join(changed)
        + "\nre-read each, check the assumption beside it in UPSTREAM, then update the hash"
    )


def test_the_worker_runs_upstreams_own_process_run_with_the_hooked_context() -> None:
    """Not a copy of ProcessWorker.run: the same code object, one global name rebound."""
    run = _prefect.hooked_process_run
    assert run.__code__ is ProcessWorker.run.__code__  # type: ignore[attr-defined]
    assert run.__globals__["FlowRunExecutorContext"] is _prefect.HookedContext  # type: ignore[attr-defined]
    # the rebinding is local to m27's worker: Prefect's own ProcessWorker is untouched
    assert ProcessWorker.run.__globals__["FlowRunExecutorContext"] is not _prefect.HookedContext


def test_only_the_m27_worker_type_is_registered_not_the_hook_base() -> None:
    registry = get_registry_for_type(BaseWorker)
    assert registry is not None
    assert registry["process"] is ProcessWorker
    assert registry["m27"] is M27Worker
    assert _prefect.HookedProcessWorker not in registry.values()
