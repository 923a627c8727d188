"""Node settings: defaults, then ``~/.m2config`` (INI), then environment variables.

The INI file is the one the first users already wrote (its format: docs/config.md):
sections ``[performance]`` and ``[checkpoint]``, inline ``#`` comments, values with units (``50ms``,
``128KB``). Every effective value remembers where it came from (``Settings.sources``) so
``m27 config`` can answer "why is it 256 KiB?" without guessing.

Precedence, lowest first: default < file < ``M2_CHUNK_SIZE`` < ``M27_<KEY>``. A typo fails
loudly with the file, the line and a suggestion: a silently ignored ``io_timout`` would be
worse than an error.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from m27._exceptions import ConfigError

# (config_path and m27_home live in m27.paths now; re-exported where callers find them)
from m27.paths import config_path as config_path
from m27.paths import m27_home as m27_home
from m27.paths import not_a_file, user_home
from m27.units import closest, parse_duration, parse_size, quoted


def _default_cpu_slots() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    """Effective node settings; ``sources[key]`` says where each value came from."""

    gpu_streams: int = 4
    memory_overprovision: float = 1.0
    io_timeout: float = 0.05
    cpu_slots: int = field(default_factory=_default_cpu_slots)
    #: the cores a GPU step runs on: "share" (its GPUs' share of the node's cores, see
    #: m27.gpu.cpus), "all", or "auto" (share on NVML GPUs, all on simulated ones)
    gpu_cpus: str = "auto"
    compression_level: int = 3
    diff_threshold: int = 131072
    keep_last: int = 3
    max_in_flight: int = 2
    checkpoint_threads: int = 0
    #: how often the runner looks at a self-checkpointing program's files (seconds)
    capture_poll: float = 1.0
    #: how long a program gets to write its checkpoint after its signal, before SIGKILL
    checkpoint_grace: float = 60.0
    gpu_temperature: float = 80.0
    #: seconds an on-demand node service waits with no runs and no steps before it stops
    service_idle: float = 1800.0
    #: bytes of a step's output sent to Prefect's logs; the rest is only in the step log
    prefect_log_limit: int = 10 * 1024 * 1024
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class _Key:
    section: str
    parse: Callable[[str], Any]
    accepted: str
    #: how `m27 config` shows the value: "duration" (50ms, 30m), "size" or "celsius"
    shown_as: str = ""


def _int_between(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if value < low or (high is not None and value > high):
            raise ValueError("out of range")
        return value

    return parse


def _positive_float(text: str) -> float:
    value = float(text.strip())
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("out of range")
    return value


def _celsius(text: str) -> float:
    """A GPU temperature threshold: above 0 and at most 150 C (GPUs shut down near 100 C, so
    a larger value is a typo such as 800 for 80, and the alert would never fire)."""
    value = _positive_float(text)
    if value > 150:
        raise ValueError("out of range")
    return value


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError("not one of the choices")
        return value

    return parse


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError("out of range")
    return value


#: The checkpoint chunk sizes a Checkpointer takes (it hashes 16-byte lanes; a chunk of a
#: GiB or more would make every changed byte rewrite a GiB).
CHUNK_SIZES = "from 64B to 1GiB, a multiple of 16 bytes"


def _chunk_size(value: int) -> int:
    if not 64 <= value <= 1024**3 or value % 16:
        raise ValueError("out of range")
    return value


KEYS: dict[str, _Key] = {
    "gpu_streams": _Key(
        "performance", _int_between(1, 256), "a whole number from 1 to 256, e.g. 4"
    ),
    "memory_overprovision": _Key("performance", _positive_float, "a number > 0, e.g. 1.2"),
    "io_timeout": _Key(
        "performance", _positive_duration, "a duration > 0, e.g. 50ms or 0.05", "duration"
    ),
    "cpu_slots": _Key(
        "performance", _int_between(1, 65536), "a whole number from 1 to 65536, e.g. 8"
    ),
    "gpu_cpus": _Key(
        "performance",
        _one_of("auto", "share", "all"),
        "auto, share (each GPU step on its GPUs' share of the cores) or all",
    ),
    "compression_level": _Key(
        "checkpoint", _int_between(0, 22), "a whole number from 0 (store raw) to 22"
    ),
    "diff_threshold": _Key(
        "checkpoint",
        lambda text: _chunk_size(parse_size(text)),
        f"a size {CHUNK_SIZES}, e.g. 128KB or 1MiB",
        "size",
    ),
    "keep_last": _Key(
        "checkpoint", _int_between(1, 1_000_000), "a whole number from 1 to 1000000, e.g. 3"
    ),
    # each save in flight holds a staging copy of the state: 2**31 of them hung the saver
    "max_in_flight": _Key("checkpoint", _int_between(1, 64), "a whole number from 1 to 64, e.g. 2"),
    "checkpoint_threads": _Key(
        "checkpoint",
        _int_between(0, 256),
        "a whole number from 0 to 256 (0: one per core, at most 4)",
    ),
    "capture_poll": _Key(
        "checkpoint", _positive_duration, "a duration > 0, e.g. 1s or 500ms", "duration"
    ),
    "checkpoint_grace": _Key(
        "checkpoint", _positive_duration, "a duration > 0, e.g. 60s", "duration"
    ),
    "gpu_temperature": _Key(
        "alerts", _celsius, "degrees Celsius above 0 and at most 150, e.g. 80", "celsius"
    ),
    "service_idle": _Key(
        "service", _positive_duration, "a duration > 0, e.g. 30m or 1800", "duration"
    ),
    "prefect_log_limit": _Key("service", parse_size, "a size >= 0, e.g. 10MiB (0: none)", "size"),
}
SECTIONS = ("performance", "checkpoint", "alerts", "service")

#: The seed's chunk-size variable; a bare number is KiB (the seed sets ``M2_CHUNK_SIZE=256``).
CHUNK_SIZE_ENV = "M2_CHUNK_SIZE"

_SECTION_LINE = re.compile(r"^\s*\[([^\]]*)\]")
_KEY_LINE = re.compile(r"^([^\s=:#;\[][^=:]*?)\s*[=:]")


def load_settings(env: Mapping[str, str] | None = None, path: Path | str | None = None) -> Settings:
    """Settings from defaults, the INI file (if it exists) and the environment.

    Raises :class:`~m27.ConfigError` naming the file and line (or the variable) of the
    first bad entry, with the accepted form or a "did you mean".
    """
    env = os.environ if env is None else env
    # A missing ~/.m2config means "defaults"; a file the user named ($M27_CONFIG) or code
    # passed must exist: a typo in its path would otherwise silently drop every setting.
    named = path is None and bool(env.get("M27_CONFIG"))
    explicit = path is not None or named
    file = Path(path).expanduser() if path is not None else config_path(env)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    defaults = Settings()
    for key in KEYS:
        values[key] = getattr(defaults, key)
        sources[key] = "default"

    problems: list[_Problem] = []
    if file.exists():
        problems += _load_file(file, _display(file, env), values, sources)
    elif named:
        raise ConfigError(
            f"config file {file} (named by M27_CONFIG) does not exist", file=str(file)
        )
    elif explicit:
        raise ConfigError(f"config file {file} does not exist", file=str(file))

    chunk = env.get(CHUNK_SIZE_ENV)
    if chunk is not None:
        values["diff_threshold"] = _parse_chunk_size(chunk)
        sources["diff_threshold"] = f"env {CHUNK_SIZE_ENV}"
    for key, spec in KEYS.items():
        name = f"M27_{key.upper()}"
        raw = env.get(name)
        if raw is None:
            continue
        try:
            values[key] = spec.parse(raw)
        except (ValueError, OverflowError):
            problems.append(
                _Problem(
                    f"env {name}={quoted(raw)}: {key} must be {spec.accepted}",
                    {"env": name, "key": key, "value": raw},
                )
            )
            continue
        sources[key] = f"env {name}"
    _raise_all(problems)
    return Settings(**values, sources=MappingProxyType(sources))


@dataclass(frozen=True)
class _Problem:
    message: str
    context: dict[str, Any]


def _raise_all(problems: list[_Problem]) -> None:
    """One ConfigError for every bad entry found (one per line, like `m27 validate`): a
    user fixes them all in one pass, not one per try. A single one keeps its fields."""
    if len(problems) == 1:
        raise ConfigError(problems[0].message, **problems[0].context)
    if problems:
        files = {p.context["file"] for p in problems if "file" in p.context}
        raise ConfigError(
            "\n".join(p.message for p in problems),
            problems=len(problems),
            **({"file": files.pop()} if len(files) == 1 else {}),
        )


def _load_file(
    file: Path, shown: str, values: dict[str, Any], sources: dict[str, str]
) -> list[_Problem]:
    """Read `file` into `values`/`sources`; a file that does not parse raises at once,
    a bad section, key or value is returned (with the others) and left at its default."""
    kind = not_a_file(file)
    if kind is not None:  # a pipe (`M27_CONFIG=<(...)`) hung; every m27 process reads it
        raise ConfigError(
            f"cannot read the settings file {shown}: it is {kind}, not a file", file=str(file)
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the settings file {shown}: {why}", file=str(file)) from exc
    parser = configparser.ConfigParser(
        inline_comment_prefixes=("#", ";"),
        interpolation=None,
        strict=True,
        default_section="\0no-default-section",  # so [DEFAULT] is checked like any other
    )
    try:
        parser.read_string(text, source=str(file))
    except configparser.DuplicateOptionError as exc:
        raise ConfigError(
            f"{shown}:{exc.lineno}: {exc.option} is set twice in [{exc.section}]",
            file=str(file),
            line=exc.lineno,
            key=exc.option,
        ) from None
    except configparser.DuplicateSectionError as exc:
        raise ConfigError(
            f"{shown}:{exc.lineno}: section [{exc.section}] appears twice",
            file=str(file),
            line=exc.lineno,
        ) from None
    except configparser.MissingSectionHeaderError as exc:
        why = _unclosed(text, exc.lineno) or (
            "a setting before any [section] header "
            f"(use one of {', '.join(f'[{name}]' for name in SECTIONS)})"
        )
        raise ConfigError(f"{shown}:{exc.lineno}: {why}", file=str(file), line=exc.lineno) from None
    except configparser.ParsingError as exc:
        lineno = exc.errors[0][0] if exc.errors else 0
        why = _unclosed(text, lineno) or "cannot parse this line (expected key = value)"
        raise ConfigError(f"{shown}:{lineno}: {why}", file=str(file), line=lineno) from None

    section_lines, key_lines = _line_numbers(text)
    problems: list[_Problem] = []
    for section in parser.sections():
        where = section_lines.get(section, 0)
        if section.lower() not in SECTIONS:
            problems.append(
                _Problem(
                    f"{shown}:{where}: unknown section [{section}]{_suggest(section, SECTIONS)}",
                    {"file": str(file), "line": where, "section": section},
                )
            )
            continue
        for key, raw in parser.items(section):
            line = key_lines.get((section, key), where)
            spec = KEYS.get(key)
            context: dict[str, Any] = {"file": str(file), "line": line, "key": key}
            if spec is None:
                here = [k for k, known in KEYS.items() if known.section == section.lower()]
                message = f"unknown key {key!r} in [{section}]{_suggest(key, KEYS, here)}"
            elif spec.section != section.lower():
                message = f"{key} belongs in [{spec.section}], not [{section}]"
            else:
                try:
                    values[key] = spec.parse(raw)
                except (ValueError, OverflowError):  # 9999...9TB is an inf before int()
                    message = f"{key} = {quoted(raw)} is not valid: use {spec.accepted}"
                    context["value"] = raw
                else:
                    sources[key] = f"{shown}:{line}"
                    continue
            problems.append(_Problem(f"{shown}:{line}: {message}", context))
    return problems


def _unclosed(text: str, lineno: int) -> str | None:
    """What is wrong with line `lineno` when it is a section header without its `]`
    (`[checkpoint`): configparser called it a setting before any section, or a line that
    is not `key = value`."""
    lines = text.splitlines()
    line = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    if line.startswith("[") and "]" not in line:
        return f"{quoted(line)} is not a section header: it needs its closing ]"
    return None


def _line_numbers(text: str) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Where each section header and key sits; configparser keeps no line numbers."""
    sections: dict[str, int] = {}
    keys: dict[tuple[str, str], int] = {}
    current = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = _SECTION_LINE.match(line)
        if header:
            current = header.group(1).strip()
            sections.setdefault(current, number)
            continue
        key = _KEY_LINE.match(line)
        if key and current:
            keys.setdefault((current, key.group(1).strip().lower()), number)
    return sections, keys


def _parse_chunk_size(raw: str) -> int:
    """``M2_CHUNK_SIZE``: a bare number is KiB (the seed's 256 meant 256 KiB); units work too."""
    text = raw.strip()
    try:
        value = int(float(text) * 1024) if re.fullmatch(r"\d+(\.\d+)?", text) else parse_size(text)
        value = _chunk_size(value)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0:
        raise ConfigError(
            f"env {CHUNK_SIZE_ENV}={quoted(raw)}: use a number of KiB (e.g. 256) or a size "
            f"with a unit (e.g. 256KB, 1MiB): {CHUNK_SIZES}",
            env=CHUNK_SIZE_ENV,
            key="diff_threshold",
            value=raw,
        )
    return value


def _suggest(
    word: str, choices: Mapping[str, Any] | tuple[str, ...], listed: list[str] | None = None
) -> str:
    """A close match among `choices`, else the `listed` ones (default: all of them)."""
    options = sorted(choices)
    if (match := closest(word, options)) is not None:
        return f"; did you mean {match!r}?"
    return f"; known: {', '.join(sorted(listed) if listed is not None else options)}"


def _display(file: Path, env: Mapping[str, str]) -> str:
    """``~/.m2config`` for the usual file (as users write it), the full path otherwise."""
    try:
        return "~/" + str(file.relative_to(user_home(env)))
    except ValueError:
        return str(file)
