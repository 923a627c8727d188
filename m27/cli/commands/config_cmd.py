"""`m27 config`: every effective setting and where it came from.

It also lists the other ``M27_*`` variables and the pass-through ``CUDA_LAUNCH_BLOCKING``
so "what does this node see?" has one answer. A variable whose name contains TOKEN, SECRET
or PASSWORD (the Telegram token lives in ``M27_TELEGRAM_TOKEN``) is never printed, not even
its name, since terminal output ends up in bug reports; a password inside a URL is masked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from m27 import tables
from m27._exceptions import ConfigError
from m27.checkpoint import native_hashing
from m27.cli.commands import SUMMARY
from m27.config import CHUNK_SIZE_ENV, KEYS, config_path, load_settings, m27_home
from m27.tables import Col
from m27.units import format_duration, format_size

_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "CREDENTIAL")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
_PASS_THROUGH = ("CUDA_LAUNCH_BLOCKING",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "config",
        help=SUMMARY["config"],
        description="Show each setting, its value and its source (default, file:line, env).",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def is_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret (then neither it nor its name shows)."""
    upper = name.upper()
    return any(marker in upper for marker in _SECRET_MARKERS)


def _redact(value: str) -> str:
    """Hide a password in a URL (``postgresql://user:pw@host`` -> ``postgresql://***@host``)."""
    return _URL_USERINFO.sub(r"\g<scheme>***@", value)


def report(env: Mapping[str, str]) -> dict[str, Any]:
    """What `m27 config --json` prints; raises ConfigError for a bad file or variable."""
    settings = load_settings(env)
    known = {f"M27_{key.upper()}" for key in KEYS} | {"M27_CONFIG", "M27_HOME"}
    environment = {
        name: _redact(value)
        for name, value in sorted(env.items())
        if (name.startswith("M27_") and name not in known) or name in _PASS_THROUGH
        if not is_secret(name)
    }
    return {
        "home": str(m27_home(env)),
        "config_file": str(config_path(env)),
        "settings": {
            key: {"value": getattr(settings, key), "source": settings.sources[key]} for key in KEYS
        },
        "environment": environment,
        # built at install when a C compiler was there (csrc/spans.c, docs/checkpoints.md)
        "checkpoint_hashing": "compiled" if native_hashing() else "python",
    }


def _shown(key: str, settings: Mapping[str, Any]) -> str:
    """The value as a person writes it: 30m, not 1800.0 (--json keeps plain numbers)."""
    value = settings[key]["value"]
    shown_as = KEYS[key].shown_as
    if shown_as == "duration":
        return format_duration(float(value))
    if shown_as == "size":
        return f"{format_size(int(value))} ({value} bytes)"
    if shown_as == "celsius":
        return f"{float(value):g}C"
    return str(value)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    try:
        data = report(env)
    except ConfigError as exc:
        print(f"m27 config: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    settings = data["settings"]
    rows = [(key, _shown(key, settings), settings[key]["source"]) for key in settings]
    rows += [(name, value, "environment") for name, value in data["environment"].items()]
    print(f"home:   {data['home']}")
    missing = "" if os.path.exists(data["config_file"]) else "  (missing: defaults apply)"
    print(f"config: {data['config_file']}{missing}")
    if data["checkpoint_hashing"] == "compiled":
        print("hashing: compiled (checkpoint chunks are hashed by m27.checkpoint._spans)")
    else:
        print(
            "hashing: Python (m27 was installed without a C compiler: a mostly-unchanged "
            "checkpoint save is ~10 % slower; reinstall with gcc to build it)"
        )
    print()
    tables.show([Col("setting"), Col("value", wrap=True), Col("source", wrap=True)], rows)
    if CHUNK_SIZE_ENV in env and settings["diff_threshold"]["source"] != f"env {CHUNK_SIZE_ENV}":
        print(f"\nnote: {CHUNK_SIZE_ENV} is set but M27_DIFF_THRESHOLD overrides it")
    return 0
