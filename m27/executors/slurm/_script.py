"""A step's ``slurm:`` options, checked, and the sbatch script they render to.

Rendering is a pure function of its inputs (no environment, no clock), so the scripts are
compared with golden files and a user can read exactly what m27 submits: the script is
kept next to the job's output as ``job.sh``.

Precedence of options, lowest first: the site file (``$M27_SLURM_CONFIG``, default
``$M27_HOME/slurm.yaml``), the entry of the step's tier in ``tiers:`` (how a tier maps to a
QOS, a nice value or a partition), then the step's own ``slurm:`` keys.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from m27._exceptions import ConfigError, SpecError
from m27.config import m27_home
from m27.spec import SLURM_KEYS, yaml_shape_problem
from m27.units import parse_duration, parse_size

#: Keys a ``slurm:`` mapping (or the site file, or a tier's entry) may hold; the table
#: lives in spec so that `m27 validate` reports an unknown key with its file:line.
OPTION_KEYS = SLURM_KEYS
#: Keys a tier's entry may not set (a tier cannot name another tier).
_NOT_IN_TIER = ("tier", "tiers")
#: Default lead time of the pre-timeout signal. Slurm checks time limits about every 30 s
#: and may send the signal up to a minute early, so 90 s leaves at least 30 s to save.
DEFAULT_SIGNAL_BEFORE = 90
DEFAULT_MAX_REQUEUES = 20
DEFAULT_POLL_S = 1.0

_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")
#: sbatch --mem: whole units, K/M/G/T (powers of 1024), an optional B, any case.
_SLURM_MEM = re.compile(r"^\d+([KMGT]B?)?$", re.IGNORECASE)
#: A value sbatch reads from an #SBATCH line as it is written, without quotes.
_PLAIN_VALUE = re.compile(r"[^\s\"'\\#]*")
#: Characters that end or split an #SBATCH line: blanks and every control character.
_NOT_IN_DIRECTIVE = re.compile(r"[\s\x00-\x1f\x7f]")
#: Control characters (an `extra` option may hold blanks, quoted as sbatch reads them).
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


@dataclass(frozen=True)
class SlurmOptions:
    """Checked options of one Slurm step; None means "let the cluster decide"."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    mem: str | None = None
    cpus: int | None = None
    gpus: int | None = None
    gres: str | None = None
    constraint: str | None = None
    nice: int | None = None
    extra: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    signal_before: int = DEFAULT_SIGNAL_BEFORE
    requeue: bool = True
    max_requeues: int = DEFAULT_MAX_REQUEUES
    poll: float = DEFAULT_POLL_S
    tier: str | None = None
    tiers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def wants_gpus(self) -> bool:
        """Whether Slurm hands this job GPUs (and so sets CUDA_VISIBLE_DEVICES itself)."""
        if self.gpus:
            return True
        if self.gres and re.search(r"(^|,)gpu(:|$|,)", self.gres):
            return True
        return any(re.match(r"--(gpus|gres=gpu|gpus-per-\w+)\b", arg) for arg in self.extra)


def site_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$M27_SLURM_CONFIG``, else ``$M27_HOME/slurm.yaml``."""
    env = os.environ if env is None else env
    explicit = env.get("M27_SLURM_CONFIG")
    return Path(explicit).expanduser() if explicit else m27_home(env) / "slurm.yaml"


def load_site_options(path: Path | None = None) -> Mapping[str, Any]:
    """The site's defaults for every Slurm step (empty when `$M27_HOME/slurm.yaml` does
    not exist; a missing file that `$M27_SLURM_CONFIG` names is an error, as a missing
    `$M27_CONFIG` is: a typo there silently dropped the site's account and tiers)."""
    named = path is None and bool(os.environ.get("M27_SLURM_CONFIG"))
    path = path or site_config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if named:
            raise ConfigError(f"M27_SLURM_CONFIG={path}: no such file", file=str(path)) from None
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}", file=str(path)) from exc
    try:
        # aliases of aliases would make safe_load take minutes or all memory
        if (bad := yaml_shape_problem(text)) is not None:
            raise ConfigError(f"{path}:{bad}", file=str(path))
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}", file=str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of Slurm options", file=str(path))
    return data


def parse_options(
    options: Mapping[str, Any],
    *,
    site: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    step: str = "",
    gpus: int = 0,
) -> SlurmOptions:
    """Merge site < tier < step options and check every value; errors name the key.

    `gpus` is what the step itself asks for (its ``gpus:``; 1 for a gpu or gpu_light
    step): Slurm is asked for that many when no option names GPUs (``gpus``, ``gres``, a
    GPU ``extra`` argument), so ``type: gpu`` gets a GPU on a cluster as it does here.
    """
    site = site or {}
    _check_keys(site, "site slurm config", step)
    _check_keys(options, "slurm", step)
    tiers: dict[str, Mapping[str, Any]] = {}
    for source in (site, options):
        raw = source.get("tiers") or {}
        if not isinstance(raw, Mapping):
            raise SpecError("slurm.tiers must map tier names to options", step=step, key="tiers")
        for name, entry in raw.items():
            if not isinstance(entry, Mapping):
                raise SpecError(
                    f"slurm.tiers.{name} must be a mapping of options", step=step, key="tiers"
                )
            _check_keys(entry, f"slurm.tiers.{name}", step, allowed_tier=False)
            tiers[str(name)] = entry
    merged: dict[str, Any] = {k: v for k, v in site.items() if k != "tiers"}
    tier = options.get("tier", site.get("tier"))
    if tier is not None:
        if str(tier) not in tiers:
            known = ", ".join(sorted(tiers)) or "none are configured"
            raise SpecError(
                f"slurm.tier {tier!r} is not in slurm.tiers ({known})", step=step, key="tier"
            )
        merged.update(tiers[str(tier)])
    merged.update({k: v for k, v in options.items() if k != "tiers"})
    if merged.get("time") is None and timeout is not None:
        merged["time"] = timeout
    built = _build(merged, tiers, step)
    if gpus > 0 and built.gpus is None and built.gres is None and not built.wants_gpus:
        built = replace(built, gpus=gpus)
    return built


def _check_keys(
    mapping: Mapping[str, Any], where: str, step: str, allowed_tier: bool = True
) -> None:
    for key in mapping:
        if key not in OPTION_KEYS or (not allowed_tier and key in _NOT_IN_TIER):
            raise SpecError(
                f"unknown key {key!r} in {where} (use {', '.join(OPTION_KEYS)})",
                step=step,
                key=key,
            )


def _build(m: Mapping[str, Any], tiers: Mapping[str, Mapping[str, Any]], step: str) -> SlurmOptions:
    def text(key: str) -> str | None:
        value = m.get(key)
        if value is None:
            return None
        if isinstance(value, bool | Mapping | list):
            raise SpecError(f"slurm.{key} must be a string, not {value!r}", step=step, key=key)
        if _NOT_IN_DIRECTIVE.search(str(value)):
            # a line break would end the #SBATCH line and put the rest into the job script
            # as a command (and sbatch reads no directive after it); a blank splits a value
            raise SpecError(
                f"slurm.{key} {str(value)!r} holds a blank or control character; Slurm "
                "names have none",
                step=step,
                key=key,
            )
        return str(value)

    def integer(key: str, low: int, default: int | None = None) -> int | None:
        value = m.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"slurm.{key} must be a whole number >= {low}", step=step, key=key)
        return value

    def texts(key: str) -> tuple[str, ...]:
        value = m.get(key) or ()
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
            raise SpecError(f"slurm.{key} must be a list of strings", step=step, key=key)
        return tuple(value)

    extra = texts("extra")
    for arg in extra:
        if not arg.startswith("-") or _CONTROL.search(arg):
            raise SpecError(
                f"slurm.extra items are sbatch options, not {arg!r}", step=step, key="extra"
            )
    if m.get("gpus") is not None and m.get("gres") is not None:
        raise SpecError("slurm: give gpus or gres, not both", step=step, key="gres")
    requeue = m.get("requeue", True)
    if not isinstance(requeue, bool):
        raise SpecError("slurm.requeue must be true or false", step=step, key="requeue")
    nice = m.get("nice")
    if nice is not None and (isinstance(nice, bool) or not isinstance(nice, int)):
        raise SpecError("slurm.nice must be a whole number", step=step, key="nice")
    try:
        poll = parse_duration(m.get("poll", DEFAULT_POLL_S))
    except ValueError as exc:
        raise SpecError(f"slurm.poll: {exc}", step=step, key="poll") from None
    if poll <= 0:
        raise SpecError("slurm.poll must be positive", step=step, key="poll")
    setup = texts("setup")
    if any("\0" in line for line in setup):
        raise SpecError("slurm.setup lines must not hold a NUL byte", step=step, key="setup")
    tier = m.get("tier")
    return SlurmOptions(
        partition=text("partition"),
        account=text("account"),
        qos=text("qos"),
        time=slurm_time(m["time"], step) if m.get("time") is not None else None,
        mem=slurm_mem(m["mem"], step) if m.get("mem") is not None else None,
        cpus=integer("cpus", 1),
        gpus=integer("gpus", 0),
        gres=text("gres"),
        constraint=text("constraint"),
        nice=nice,
        extra=extra,
        setup=setup,
        signal_before=integer("signal_before", 0, DEFAULT_SIGNAL_BEFORE) or 0,
        requeue=requeue,
        max_requeues=integer("max_requeues", 0, DEFAULT_MAX_REQUEUES) or 0,
        poll=poll,
        tier=None if tier is None else str(tier),
        tiers=dict(tiers),
    )


def slurm_mem(value: Any, step: str = "") -> str:
    """A Slurm memory size: Slurm's own form as written (``32G``, ``500M``, ``0`` for all
    of a node's memory; a bare number is megabytes), or an m27 size (``32GiB``,
    ``1.5GiB``) as whole megabytes, which sbatch would refuse as written."""
    text = str(value).strip()
    if not isinstance(value, bool) and _SLURM_MEM.match(text):
        return text
    try:
        size = parse_size(value)
    except ValueError:
        raise SpecError(
            f"slurm.mem: not a memory size: {value!r} (use e.g. 32G, 500M or 32GiB)",
            step=step,
            key="mem",
        ) from None
    mib = math.ceil(size / 2**20)
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def slurm_time(value: Any, step: str = "") -> str:
    """A Slurm time limit: whole minutes (``90``), Slurm's own forms (``1:30:00``,
    ``2-00:00:00``) as written, or an m27 duration (``90m``, ``2h``, ``300s``) rounded up
    to whole minutes, Slurm's granularity."""
    if isinstance(value, str) and _SLURM_TIME.match(value.strip()):
        return value.strip()
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise SpecError(
            f"slurm.time: not a time limit: {value!r} (use minutes as a number (240), "
            "Slurm's 4:00:00 or 1-00:00:00, or 4h, 90m)",
            step=step,
            key="time",
        ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value * 60.0  # a bare number is minutes, as in sbatch --time
    if seconds <= 0:
        raise SpecError("slurm.time must be positive", step=step, key="time")
    return str(max(1, math.ceil(seconds / 60.0)))


@dataclass(frozen=True)
class ScriptInput:
    """Everything one job's script depends on (and nothing else)."""

    run_id: str
    step: str
    attempt: int
    argv: tuple[str, ...]
    job_dir: Path
    workdir: Path | None
    python: str
    options: SlurmOptions
    #: a self-checkpointing program: what its restarts add (`-cpi simulation.cpt`)
    resume_args: tuple[str, ...] = ()
    #: the engine recipe that checks them against the files at each restart ("": none)
    recipe: str = ""
    #: the signal the step gets when Slurm sends USR1 (GROMACS checkpoints on TERM)
    child_signal: str = "USR1"
    #: requeue after USR1 even when the step exits 0 (mdrun does after its checkpoint)
    requeue_on_clean_exit: bool = False


def directives(s: ScriptInput) -> list[str]:
    """The ``#SBATCH`` options, in a fixed order."""
    o = s.options
    out = [
        f"--job-name={job_name(s.run_id, s.step)}",
        f"--output={_path_value(s.job_dir / 'stdout', pattern=True)}",
        f"--error={_path_value(s.job_dir / 'stderr', pattern=True)}",
        # A requeued job appends to the same files instead of truncating them.
        "--open-mode=append",
    ]
    if s.workdir is not None:
        out.append(f"--chdir={_path_value(s.workdir)}")
    pairs = [
        ("time", o.time),
        ("partition", o.partition),
        ("account", o.account),
        ("qos", o.qos),
        ("nice", o.nice),
        ("mem", o.mem),
        ("cpus-per-task", o.cpus),
        ("constraint", o.constraint),
    ]
    out += [f"--{name}={value}" for name, value in pairs if value is not None]
    if o.gpus:
        out.append(f"--gres=gpu:{o.gpus}")
    elif o.gres:
        out.append(f"--gres={o.gres}")
    if o.requeue:
        out.append("--requeue")
        if o.signal_before > 0:
            out.append(f"--signal=B:USR1@{o.signal_before}")
    else:
        out.append("--no-requeue")
    return out + list(o.extra)


def _path_value(path: Path, pattern: bool = False) -> str:
    """A path as sbatch reads it from an #SBATCH line: a blank ends the value there and a
    `#` outside quotes begins a comment (a pipeline in `~/My Project` made sbatch refuse the
    script: `Invalid directive found in batch script: Project`), so such a path is put in
    double quotes with `"` and `\\` escaped; in an --output/--error `pattern`, `%` is
    Slurm's (`%j`: the job id) and a literal one is written `%%`."""
    text = str(path).replace("%", "%%") if pattern else str(path)
    if not _PLAIN_VALUE.fullmatch(text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def job_name(run_id: str, step: str) -> str:
    return f"m27.{run_id}.{step}"


def render_script(s: ScriptInput) -> str:
    """The batch script: traps the signals, picks the checkpoint, runs and requeues."""
    q = shlex.quote
    o = s.options
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {d}" for d in directives(s)]
    lines += [
        f"# m27 run {s.run_id}, step {s.step}, attempt {s.attempt}: written by m27.executors.slurm",
        "# USR1 (sent by Slurm before the time limit) and TERM (scancel, preemption) are",
        "# passed on to the step, which saves a checkpoint and exits; after USR1 the job",
        "# requeues itself and the next start resumes from the newest valid checkpoint.",
        "set -u",
        f"m27_dir={q(str(s.job_dir))}",
        "m27_child=''",
        "m27_usr1=0",
        "m27_pass() {",
        '    if [ -n "$m27_child" ]; then kill -s "$1" "$m27_child" 2>/dev/null || true; fi',
        "}",
        f"trap 'm27_usr1=1; m27_pass {s.child_signal}' USR1",
        "trap 'm27_pass TERM' TERM",
        *o.setup,
        f'm27_resume="$({q(s.python)} -m m27.executors.slurm._resume '
        '"${M27_CHECKPOINT_DIR:-}" "${M27_RESUME_FROM:-}")" || m27_resume="${M27_RESUME_FROM:-}"',
        'if [ -n "$m27_resume" ]; then export M27_RESUME_FROM="$m27_resume"; '
        "else unset M27_RESUME_FROM; fi",
        'export M27_SLURM_JOB_ID="${SLURM_JOB_ID:-}"',
        *(
            ()
            if o.wants_gpus
            # Slurm unsets it for a job without GPUs, so CUDA would see every GPU.
            else ("export CUDA_VISIBLE_DEVICES=''",)
        ),
        'printf \'%s\\t%s\\t%s\\t%s\\n\' "${SLURM_RESTART_COUNT:-0}" "$(hostname)" '
        '"${CUDA_VISIBLE_DEVICES-}" "$m27_resume" >>"$m27_dir/starts"',
        *_resume_lines(s),
        f"{shlex.join(s.argv)}{_RESUME_ARGS if s.resume_args else ''} &",
        "m27_child=$!",
        "# wait returns early when a trapped signal arrives: wait again until the step ends.",
        "while :; do",
        '    wait "$m27_child"',
        "    m27_rc=$?",
        '    kill -0 "$m27_child" 2>/dev/null || break',
        "done",
    ]
    if o.requeue:
        lines += [
            'if [ "$m27_usr1" = 1 ] && '
            + ("" if s.requeue_on_clean_exit else '[ "$m27_rc" != 0 ] && ')
            + f'[ "${{SLURM_RESTART_COUNT:-0}}" -lt {o.max_requeues} ]; then',
            '    echo "m27: step stopped for the time limit (exit $m27_rc); requeueing job '
            '$SLURM_JOB_ID" >&2',
            '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
        ]
    lines.append('exit "$m27_rc"')
    return "\n".join(lines) + "\n"


_RESUME_ARGS = ' ${m27_extra[@]+"${m27_extra[@]}"}'


def _resume_lines(s: ScriptInput) -> list[str]:
    """A restarted job of a self-checkpointing program resumes from the file it wrote."""
    if not s.resume_args:
        return []
    static = f"m27_extra=({shlex.join(s.resume_args)})"
    if not s.recipe:
        return ["m27_extra=()", f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then {static}; fi']
    # the recipe decides at the restart, from the files the last start wrote (CP2K's
    # m27-resume.inp; mdrun's -noappend when its outputs do not match), as m27 does
    # before a resume it starts itself; if it cannot run, the arguments as planned
    ask = shlex.join(
        [
            s.python,
            "-m",
            "m27.executors.slurm._resume",
            "--args",
            s.recipe,
            str(len(s.resume_args)),
            *s.resume_args,
            *s.argv,
        ]
    )
    return [
        "m27_extra=()",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f'    if m27_args="$({ask})"; then eval "m27_extra=($m27_args)"; else {static}; fi',
        "fi",
    ]


__all__ = [
    "DEFAULT_SIGNAL_BEFORE",
    "OPTION_KEYS",
    "ScriptInput",
    "SlurmOptions",
    "directives",
    "job_name",
    "load_site_options",
    "parse_options",
    "render_script",
    "site_config_path",
    "slurm_time",
]
