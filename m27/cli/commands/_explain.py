"""What a step's `checkpoint:` will do, in words, for `m27 validate`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m27.config import load_settings
from m27.executors.engines import (
    CheckpointPlan,
    plan_for_step,
    recipe_named,
    saves_at_stop,
    uses_checkpointer,
)
from m27.spec import Step
from m27.units import format_duration


@dataclass(frozen=True)
class Explained:
    """One step's checkpoint plan and the warnings about it."""

    plan: CheckpointPlan | None
    checkpointer: bool = False
    warnings: tuple[str, ...] = field(default=())
    #: its Python notices a stop signal (m27.watch_stop) and can save first
    saves_at_stop: bool = False

    def to_dict(self) -> dict[str, Any] | None:
        if self.plan is None:
            return None
        p = self.plan
        return {
            "every": p.every,
            "recipe": p.recipe,
            "argv": list(p.argv),
            "files": list(p.files),
            "resume": list(p.resume),
            "signal": p.signal,
            "notes": list(p.notes),
            "checkpointer": self.checkpointer,
            "saves_at_stop": self.saves_at_stop,
            "warnings": list(self.warnings),
        }

    def lines(self, name: str) -> list[str]:
        p = self.plan
        if p is None:
            return []
        every = format_duration(p.every) if p.every is not None else ""
        how = f"{p.recipe} recipe" if p.recipe else "no recipe"
        # without `every:` the files are captured as the program writes them, on no clock
        when = f"every {every}" if every else "when the program writes its files"
        out = [f"{name}: checkpoint {when} ({how})"]
        if p.recipe:
            out.append(f"  command: {shlex.join(p.argv)}")
        out += [f"  {note}" for note in p.notes]
        if p.files:
            often = f", at most once per {every}" if p.every is not None else ""
            when = f"when they change and are complete{often}, and when the program exits"
            # said once: a recipe's note names the files or the resume with its reason
            said = {note.partition(":")[0] for note in p.notes}
            if "files" in said:
                out.append(f"  captured into the checkpoint store {when}")
            else:
                out.append(
                    f"  files: {', '.join(p.files)} (captured into the checkpoint store {when})"
                )
            resume = shlex.join(p.resume)
            if not (resume and f"on resume: {resume}" in [n.partition(" (")[0] for n in p.notes]):
                out.append(f"  resume: {resume or '(no extra arguments)'}")
            out.append(
                f"  signal: SIG{p.signal} before a stop, then a bounded grace"
                if getattr(recipe_named(p.recipe), "saves_at_stop", True)
                else f"  signal: SIG{p.signal} ends it at a stop (a cancel, timeout or "
                f"preemption); {p.recipe} saves nothing then: a resume starts from the last "
                "capture"
            )
        elif self.checkpointer:
            out.append("  m27.Checkpointer: M27_CHECKPOINT_INTERVAL and M27_RESUME_FROM")
            grace = format_duration(load_settings().checkpoint_grace)
            out.append(
                f"  stop: it calls m27.watch_stop, so it can save at SIGTERM (a cancel, timeout"
                f" or preemption) or Slurm's SIGUSR1; SIGKILL {grace} later"
                if self.saves_at_stop
                else "  stop: SIGTERM (a cancel, timeout or preemption) ends it unsaved, as it "
                "does not call m27.watch_stop: a resume starts from its last periodic save"
            )
        out += [f"warning: {name}: {w}" for w in self.warnings]
        return out


def explain_checkpoint(step: Step, base: Path) -> Explained:
    """How `step` is checkpointed; `base` is the folder it runs in (Pipeline.workdir_of)."""
    plan = plan_for_step(step)
    if plan is None:
        return Explained(None)
    checkpointer = not plan.files and uses_checkpointer(step.argv, base)
    stop = checkpointer and saves_at_stop(step.argv, base)
    warnings: list[str] = []
    recipe = recipe_named(plan.recipe)
    if recipe is not None and not step.checkpoint_files:
        warnings += recipe.warnings(plan.argv, base)
    # nothing saved at a stop: Python without watch_stop, or a program that ignores signals
    unsaved = (checkpointer and not stop) or not getattr(recipe, "saves_at_stop", True)
    timeout, every = step.timeout, plan.every
    if unsaved and timeout is not None and every is not None and every >= timeout:
        warnings.append(
            f"timeout: {format_duration(timeout)} stops each attempt before its first "
            f"checkpoint (every {format_duration(every)}), and it does not save at the stop: "
            "every attempt starts over"
        )
    if not plan.files and not checkpointer and recipe is None:  # a recipe says its own
        program = step.argv[0] if step.argv else "?"
        warnings.append(
            f"checkpoint: has no effect: no recipe knows {program!r}, there is no "
            "checkpoint.files, and the command does not appear to use m27.Checkpointer"
        )
    return Explained(plan, checkpointer, tuple(warnings), stop)
