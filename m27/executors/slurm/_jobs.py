"""Talking to Slurm: submit, look up and cancel one job through its command-line tools.

``scontrol show job -o`` is the source of a job's state: it needs no accounting daemon
and answers for finished jobs too, for ``MinJobAge`` seconds (300 by default). A job the
controller has forgotten is looked up in ``sacct`` (when slurmdbd runs) and then in the
``jobcomp/filetxt`` file, if the cluster keeps one.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from m27._exceptions import RunnerError

#: States after which the job will not run again.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
#: Terminal states that a job submitted with --requeue may leave again (Slurm requeues
#: it): they count as final only once they have lasted a few polls.
REQUEUEABLE_STATES = frozenset({"NODE_FAIL", "PREEMPTED"})

_CMD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about a job now; ``exit_code``/``signal`` come from ``ExitCode=rc:sig``."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    node: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class SlurmError(RunnerError):
    """A Slurm command failed; ``transient`` when retrying later may help (no controller).

    Part of the M27Error tree (a step could not be started or supervised), so that a
    failing ``scancel`` or ``sbatch`` reaches a user as one line, never a traceback.
    Context: ``command`` (the tool), ``job_id`` (when one is concerned), ``transient``.
    """

    transient: bool

    def __init__(self, message: str, transient: bool = False, **context: Any) -> None:
        super().__init__(message, transient=transient, **context)


class SlurmCli(Protocol):
    """The few Slurm operations the executor needs (tests give a fake)."""

    def submit(self, script: Path, env: Mapping[str, str]) -> str: ...

    def show(self, job_id: str) -> JobInfo | None: ...

    def cancel(self, job_id: str) -> None: ...


def parse_show(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol show job -o`` line.

    Values may hold spaces (``Command=``, ``WorkDir=``, ``Reason=``): a token without an
    ``=`` sign belongs to the value before it.
    """
    fields: dict[str, str] = {}
    last = ""
    for token in line.strip().split(" "):
        key, eq, value = token.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][\w/:]*", key):
            fields[key] = value
            last = key
        elif last:
            fields[last] += " " + token
    return fields


def parse_exit(text: str) -> tuple[int | None, int | None]:
    """``"3:0"`` -> (3, None); ``"0:15"`` -> (None, 15): killed by signal 15."""
    match = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not match:
        return None, None
    code, sig = int(match.group(1)), int(match.group(2))
    return (None, sig) if sig else (code, None)


def info_from_fields(job_id: str, f: Mapping[str, str]) -> JobInfo:
    state = f.get("JobState", "UNKNOWN").split()[0]
    code, sig = parse_exit(f.get("ExitCode", ""))
    reason = f.get("Reason", "")
    node = f.get("BatchHost", "") or f.get("NodeList", "")
    return JobInfo(
        job_id=job_id,
        state=state,
        reason="" if reason in ("None", "(null)") else reason,
        exit_code=code,
        signal=sig,
        restarts=int(f.get("Restarts", "0") or 0),
        node="" if node in ("(null)", "None") else node,
    )


class SubprocessSlurm:
    """The real tools: sbatch, scontrol, scancel (and sacct when it answers)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(env) if env is not None else None
        self._jobcomp: Path | bool | None = False  # False: not looked up yet

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                env=dict(env) if env is not None else self._env,
                timeout=_CMD_TIMEOUT_S,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} not found: is Slurm installed here?", command=argv[0]
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"{argv[0]} did not answer in {_CMD_TIMEOUT_S:.0f}s", True, command=argv[0]
            ) from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            # "sbatch: error: Batch job submission failed: ..." (on each line) names the
            # tool once, in one line
            message = "; ".join(
                line.strip().removeprefix(f"{argv[0]}: ").removeprefix("error: ")
                for line in message.splitlines()
            )
            transient = bool(re.search(r"contact|connect|timed? ?out|try again", message, re.I))
            raise SlurmError(f"{argv[0]}: {message}", transient, command=argv[0])
        return done.stdout

    def submit(self, script: Path, env: Mapping[str, str]) -> str:
        out = self._run(["sbatch", "--parsable", "--export=ALL", str(script)], env=env)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {out.strip()!r}", command="sbatch")
        return job_id

    def show(self, job_id: str) -> JobInfo | None:
        try:
            out = self._run(["scontrol", "show", "job", "-o", job_id])
        except SlurmError as exc:
            if "Invalid job id" not in str(exc):
                raise
            return self._finished(job_id)
        for line in out.splitlines():
            fields = parse_show(line)
            if fields.get("JobId") == job_id:
                return info_from_fields(job_id, fields)
        return self._finished(job_id)

    def cancel(self, job_id: str) -> None:
        try:
            self._run(["scancel", job_id])
        except SlurmError as exc:
            raise SlurmError(
                f"cannot cancel Slurm job {job_id}: {exc}",
                exc.transient,
                command="scancel",
                job_id=job_id,
            ) from None

    def _finished(self, job_id: str) -> JobInfo | None:
        """A job the controller forgot: sacct if it answers, else the jobcomp file."""
        try:
            out = self._run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"])
        except SlurmError:
            out = ""
        for line in out.splitlines():
            state, _, exit_text = line.partition("|")
            if state:
                code, sig = parse_exit(exit_text)
                return JobInfo(job_id, state.split()[0], exit_code=code, signal=sig)
        return self._from_jobcomp(job_id)

    def _from_jobcomp(self, job_id: str) -> JobInfo | None:
        if self._jobcomp is False:
            self._jobcomp = None
            try:
                config = parse_config(self._run(["scontrol", "show", "config"]))
            except SlurmError:
                config = {}
            if config.get("JobCompType") == "jobcomp/filetxt" and config.get("JobCompLoc"):
                self._jobcomp = Path(config["JobCompLoc"])
        if not isinstance(self._jobcomp, Path):
            return None
        try:
            text = self._jobcomp.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        found = None
        for line in text.splitlines():
            fields = parse_show(line)
            if fields.get("JobId") == job_id:
                found = fields  # the last line wins: a requeued job has one per end
        if found is None:
            return None
        # jobcomp/filetxt writes ExitCode=N (no signal part) and JobState=STATE.
        exit_text = found.get("ExitCode", "")
        return info_from_fields(job_id, {**found, "ExitCode": _with_signal(exit_text)})


def _with_signal(text: str) -> str:
    return text if ":" in text else f"{text}:0" if text.isdigit() else ""


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as a dict (``Key = Value`` lines)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip()] = value.strip()
    return out


__all__ = [
    "REQUEUEABLE_STATES",
    "TERMINAL_STATES",
    "JobInfo",
    "SlurmCli",
    "SlurmError",
    "SubprocessSlurm",
    "info_from_fields",
    "parse_config",
    "parse_exit",
    "parse_show",
]
