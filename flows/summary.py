"""What a finished run shows in Prefect besides its states and logs: one summary artifact
and a link to each plot it wrote.

Keys (lowercase letters, digits, dashes; README "See it in Prefect"):

- ``m27-run-<pipeline>``: markdown, one version per run: every step with its status,
  GPUs, attempts, duration, energy and checkpoints, then the outputs as absolute paths;
- ``m27-plot-<pipeline>-<step>``: a link artifact to each image a step declared as output
  (``.png``, ``.svg``, ``.jpg``, ``.jpeg``, ``.gif``, ``.pdf``) and wrote, as a
  ``file://`` URL (the UI runs on the same machine as the node service).

Checkpoints have their own artifacts (``m27-ckpt-<pipeline>-<step>``, registered as they
are committed). Everything here is best effort: the run's outcome is in the event log
already, so a Prefect hiccup only costs the UI entry (a warning in the flow's log).
"""

from __future__ import annotations

from pathlib import Path

from m27.events.state import NodeState, RunState
from m27.monitoring.energy import energy_by_step, format_energy
from m27.paths import slug
from m27.units import format_duration

__all__ = ["PLOT_SUFFIXES", "plot_key", "plots", "summary_key", "summary_markdown"]

PLOT_SUFFIXES = frozenset({".png", ".svg", ".jpg", ".jpeg", ".gif", ".pdf"})


def summary_key(pipeline: str) -> str:
    return slug(f"m27-run-{pipeline}")


def plot_key(pipeline: str, step: str) -> str:
    return slug(f"m27-plot-{pipeline}-{step}")


def _absolute(run: RunState, output: str, workdir: Path | None) -> Path:
    path = Path(output)
    return path if path.is_absolute() or workdir is None else workdir / path


def plots(run: RunState, workdir: Path | None) -> list[tuple[str, Path]]:
    """(step, file) for every image output a succeeded step wrote."""
    found = []
    for name, step in run.steps.items():
        if step.status != "succeeded":
            continue
        for output in step.outputs:
            path = _absolute(run, output, workdir)
            if path.suffix.lower() in PLOT_SUFFIXES and path.is_file():
                found.append((name, path.resolve()))
    return found


def summary_markdown(state: NodeState, run_id: str, workdir: Path | None = None) -> str:
    """The run summary: steps (status, GPUs, attempts, time, energy, checkpoints), outputs."""
    run = state.runs[run_id]
    energy = energy_by_step(state)
    took = format_duration(run.duration_s) if run.duration_s is not None else "-"
    lines = [
        f"### Run `{run.run_id}` of `{run.pipeline}`: {run.status} in {took}",
        "",
        "| step | status | GPUs | attempts | duration | energy | checkpoints |",
        "|---|---|---|---|---|---|---|",
    ]
    total = 0.0
    for name, s in run.steps.items():
        gpus = ",".join(str(g) for g in s.gpus) if s.gpus else "-"
        duration = format_duration(s.duration_s) if s.duration_s is not None else "-"
        joules = energy.get((run.run_id, name))
        total += joules or 0.0
        shown = format_energy(joules) if joules else "-"
        ckpt = str(s.checkpoints) if s.checkpoints else "-"
        if s.checkpoints and s.checkpoint_step is not None:  # None: files no recipe reads
            ckpt += f" (last at step {s.checkpoint_step})"
        status = s.status if not s.reason or s.status == "succeeded" else f"{s.status}: {s.reason}"
        lines.append(
            f"| `{name}` | {status.replace('|', '/')} | {gpus} | {s.attempts} | {duration} "
            f"| {shown} | {ckpt} |"
        )
    if total:
        lines += ["", f"GPU energy of the run: {format_energy(total)}"]
    outputs = [
        (name, _absolute(run, o, workdir)) for name, s in run.steps.items() for o in s.outputs
    ]
    if outputs:
        lines += ["", "Outputs:", ""]
        lines += [f"- `{name}`: `{path}`" for name, path in outputs]
    if run.resume_of:
        again = ", ".join(f"`{name}`" for name in run.rerun)
        asked = f" Asked to run {again} again (`--rerun`)." if run.rerun else ""
        lines += ["", f"Resumes run `{run.resume_of}`.{asked}"]
    return "\n".join(lines) + "\n"


def publish(state: NodeState, run_id: str, workdir: Path | None) -> None:
    """Create the run's summary and plot artifacts in the current flow run."""
    from prefect import get_run_logger
    from prefect.artifacts import create_link_artifact, create_markdown_artifact

    run = state.runs[run_id]
    try:
        create_markdown_artifact(
            summary_markdown(state, run_id, workdir),
            key=summary_key(run.pipeline),
            description=f"summary of run {run_id}",
        )
        for step, path in plots(run, workdir):
            create_link_artifact(
                path.as_uri(),
                link_text=path.name,
                key=plot_key(run.pipeline, step),
                description=f"{path.name} written by {step} in run {run_id}",
            )
    except Exception as exc:  # the run's outcome is in the log; the UI entry is a bonus
        get_run_logger().warning("could not register the run summary artifact: %s", exc)
