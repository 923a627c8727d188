"""Notes about a pipeline that is valid but will likely not do what its author meant:
`m27 validate` prints them after `OK` (`--json`: `notes`), `m27 run` on stderr before the
run starts. Notes, not problems: each may be intended (an earlier step may install a
program), but each found at the start saves a failure hours into a run."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
from typing import TYPE_CHECKING

from m27.paths import is_pattern, not_runnable
from m27.units import closest, listed

if TYPE_CHECKING:
    from m27.spec import Pipeline, Step


def pipeline_notes(pipeline: Pipeline, resumed_path: tuple[str, str] | None = None) -> list[str]:
    """Every note about `pipeline` that needs no event log; `resumed_path` is the run a
    resume goes on from and the PATH it ran with (m27.executors.environ)."""
    return (
        missing_programs(pipeline, resumed_path)
        + shell_pythons(pipeline)
        + unrunnable_programs(pipeline)
        + gpu_indexes(pipeline)
        + missing_slurm(pipeline)
        + undeclared_inputs(pipeline)
        + environment_notes(pipeline)
    )


def environment_notes(pipeline: Pipeline) -> list[str]:
    """A line for each `$NAME` in a field m27 reads them in (m27.spec._environ) that m27's
    environment does not set: it became empty, as in sh, and a typo (`$SCRACH`) or a
    variable exported in another shell would otherwise go unseen until the step failed;
    and for each in a `vars:` default, which is a value and not read."""
    shown = shown_path(pipeline)
    lines = []
    for line, field, name in pipeline.unset_env:
        close = closest(name, os.environ)
        hint = f" (did you mean ${close}?)" if close else ""
        lines.append(
            f"{shown}:{line}: {field}: ${name} is not set here, so it is empty{hint}; write "
            "$$ for a `$` that is meant as text"
        )
    for line, field, name in pipeline.env_in_defaults:
        lines.append(
            f"{shown}:{line}: {field}: ${name} stays as written: a variable's value is data, "
            f"not read from the environment; write ${name} where the value is used (env:, "
            f"workdir:, output: read it), or give the value with --set (your shell reads "
            f"${name} there)"
        )
    return lines


def unrunnable_programs(pipeline: Pipeline) -> list[str]:
    """A line for each step whose program, a path that is there now, cannot be started: a
    folder, a file without its execute bit, a script without a ``#!`` line (a shell runs it
    with /bin/sh; a step starts its program without one). Each failed only when the step
    started (`permission denied`, `Exec format error`). (A `workdir:` that is not there is
    made when its step starts.)"""
    shown = shown_path(pipeline)
    lines = []
    why_not = functools.cache(not_runnable)  # 100,000 steps share a few programs
    for step in pipeline.steps:
        if step.executor != "local":  # a Slurm step runs on another node
            continue
        if step.shell or step.container or not step.argv or "/" not in step.argv[0]:
            continue  # a shell or an image has its own lookup; a bare name: missing_programs
        program = step.argv[0]
        why = why_not(pipeline.workdir_of(step) / program, program)
        if why is not None:
            lines.append(
                f"{shown}:{step.line}: step {step.name}: {program}: {why}; the step fails when "
                "it starts, unless an earlier step replaces it"
            )
    return lines


def missing_programs(pipeline: Pipeline, resumed_path: tuple[str, str] | None = None) -> list[str]:
    """A line for each program that steps run here would find on no folder of their PATH
    (a typo, an environment not activated): such a step fails `command not found` when it
    starts, which may be hours into the run. Only a bare name is looked up, as the step
    would look it up; a path (`./sim`) may be what an earlier step builds, a shell command
    or a container has its own lookup, and a Slurm step runs on another node.

    For a resume, `resumed_path` (run, PATH) names where the run it goes on from found
    the program: a fresh ssh session without the `module load` of the shell that ran it."""
    missing: dict[tuple[str, str, str], list[Step]] = {}
    for step in pipeline.steps:
        if step.shell or step.container or step.executor != "local" or not step.argv:
            continue
        program = step.argv[0]
        if "/" in program or program in ("python", "python3"):  # python: m27's own
            continue
        path = step.env.get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(program, path=path) is None:
            where = "its env's PATH" if "PATH" in step.env else "PATH"
            workdir = pipeline.workdir_of(step)
            # `prep.sh` meant as `./prep.sh`: as in a shell, only PATH is looked in
            has = (workdir / program).is_file()
            here = f" (the workdir has it: write ./{program})" if has else ""
            if not has and resumed_path is not None and "PATH" not in step.env:
                run_id, run_path = resumed_path
                if (found := shutil.which(program, path=run_path)) is not None:
                    here = (
                        f" (run {run_id} found it at {found}: put {os.path.dirname(found)} "
                        "on PATH, as that run's shell had it, before resuming)"
                    )
            missing.setdefault((program, where, here), []).append(step)
    shown = shown_path(pipeline)
    lines = []
    for (program, where, here), steps in missing.items():
        names = listed((s.name for s in steps), MISSING_SHOWN)
        fails = "the step fails" if len(steps) == 1 else "they fail"
        starts = "it starts" if len(steps) == 1 else "they start"
        lines.append(
            f"{shown}:{steps[0].line}: {'step' if len(steps) == 1 else 'steps'} {names}: "
            f"{program!r} is not on {where} here; {fails} `command not found: {program}` "
            f"when {starts}, unless an earlier step installs it{here}"
        )
    return lines


#: A shell command that starts with a bare `python`/`python3` (its first word).
_SHELL_PYTHON = re.compile(r"\s*(python3?)(?=\s|$)")


def shell_pythons(pipeline: Pipeline) -> list[str]:
    """A line for the `shell: true` steps whose command starts with a bare `python` that
    the shell finds elsewhere than m27's interpreter: without a shell that word is m27's
    own Python (m27.executors.local.resolve_argv), so adding `shell: true` for a `>` or a
    `|` changed which Python ran, and the step failed `No module named numpy` (m27 run from
    its virtual environment's bin/ without activating it, a pyenv shim first on PATH)."""
    found: dict[tuple[str, str | None], list[Step]] = {}
    for step in pipeline.steps:
        if not step.shell or step.container or step.executor != "local" or len(step.argv) < 3:
            continue
        if (match := _SHELL_PYTHON.match(step.argv[2])) is None:
            continue
        from m27.executors.local import resolve_argv  # (only for such a step: ~0.2 s)

        word = match.group(1)
        # the Python the command would get without a shell: m27's, or a folder's that the
        # step's env: PATH puts first (a conda env chosen on purpose: the shell agrees)
        unshelled = resolve_argv((word,), step.env.get("PATH"))[0]
        path = step.env.get("PATH", os.environ.get("PATH", os.defpath))
        where = shutil.which(word, path=path)
        if where is None or os.path.dirname(where) != os.path.dirname(unshelled):
            found.setdefault((word, where), []).append(step)
    shown = shown_path(pipeline)
    lines = []
    for (word, where), steps in found.items():
        names = listed((s.name for s in steps), MISSING_SHOWN)
        which = "step" if len(steps) == 1 else "steps"
        runs = f"runs {where}" if where else "finds no such program on PATH"
        lines.append(
            f"{shown}:{steps[0].line}: {which} {names}: with shell: true, `{word}` {runs}, "
            f"not the Python m27 runs in ({sys.executable}) that a command without a shell "
            f"gets; write {sys.executable} if the step needs what m27's environment has"
        )
    return lines


def missing_slurm(pipeline: Pipeline) -> list[str]:
    """One line when steps run through Slurm and this node has no `sbatch` on PATH (a
    login node without Slurm's client tools, a module not loaded): each such step fails
    `sbatch not found` when it starts, maybe after hours of the steps before it."""
    steps = [s for s in pipeline.steps if s.executor == "slurm"]
    if not steps or shutil.which("sbatch") is not None:
        return []
    names = listed((s.name for s in steps), MISSING_SHOWN)
    which = "step" if len(steps) == 1 else "steps"
    return [
        f"{shown_path(pipeline)}:{steps[0].line}: {which} {names}: executor: slurm, but "
        "`sbatch` is not on PATH here; submitting fails `sbatch not found: is Slurm installed "
        "here?` (load Slurm's module, or run m27 on a node with Slurm's client tools)"
    ]


def undeclared_inputs(pipeline: Pipeline) -> list[str]:
    """A line for each step whose command names a file another step declares as its
    `output:`, though it does not wait for that step: both may start at once, and the
    reader fails `No such file` or, worse, reads the file a run before left
    (`gmx mdrun -s topol.tpr` without `depends_on: [grompp]`)."""
    writers: dict[str, str] = {}
    for step in pipeline.steps:
        base = str(pipeline.workdir_of(step))
        for out in step.outputs:
            if not is_pattern(out):
                writers[_path_in(base, out)] = step.name
    if not writers:
        return []
    parents = {s.name: s.depends_on for s in pipeline.steps}
    names = {os.path.basename(path) for path in writers}  # a cheap look first
    lines = []
    for step in pipeline.steps:
        named: dict[str, str] = {}  # writer -> the word that names its output
        base = str(pipeline.workdir_of(step))
        for word in _words(step.argv):
            if word.rpartition("/")[2] not in names or word in step.outputs:
                continue
            writer = writers.get(_path_in(base, word))
            if writer is not None and writer != step.name and writer not in named:
                named[writer] = word
        for writer, word in named.items():
            if not _waits_on(parents, step.name, writer):
                lines.append(
                    f"{shown_path(pipeline)}:{step.line}: step {step.name}: its command names "
                    f"{word}, which step {writer} writes (output:), but it does not wait for "
                    f"{writer}: both may start at once; add depends_on: [{writer}]"
                )
    return lines


def _path_in(base: str, word: str) -> str:
    return os.path.normpath(
        os.path.join(base, os.path.expanduser(word) if word[:1] == "~" else word)
    )


_BLANK = re.compile(r"\s")


def _words(argv: tuple[str, ...]) -> list[str]:
    """What a command's arguments may name as files: each argument, the value of an
    `--opt=value` one, and the words of a shell script (`sh -c "cat a.txt > b"`)."""
    words: list[str] = []
    for arg in argv:
        if _BLANK.search(arg):
            lexer = shlex.shlex(arg, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                words += list(lexer)
            except ValueError:  # an unbalanced quote: the shell says so when it runs
                continue
        else:
            words += [arg, *arg.split("=")[1:]]
    return [w for w in words if w]


def _waits_on(parents: dict[str, tuple[str, ...]], step: str, other: str) -> bool:
    """Whether `step` depends on `other`, directly or through other steps."""
    if other in parents[step]:
        return True
    seen: set[str] = set()
    todo = list(parents[step])
    while todo:
        name = todo.pop()
        if name == other:
            return True
        if name not in seen:
            seen.add(name)
            todo += parents[name]
    return False


#: `cuda:1`, as PyTorch, JAX and CuPy name a device (`--device cuda:1`, `--device=cuda:1`)
_CUDA_INDEX = re.compile(r"\bcuda:(\d+)\b")
#: GROMACS's options whose digits are GPU ids (`-gpu_id 01` is GPUs 0 and 1)
_GPU_ID_OPTIONS = ("-gpu_id", "-gputasks")


def gpu_indexes(pipeline: Pipeline) -> list[str]:
    """A line for each step whose command names a GPU by an index it will not see. m27
    sets CUDA_VISIBLE_DEVICES to the step's leased GPUs, which the step sees as 0, 1, ...
    (a cpu step sees none), so `--device cuda:1` in a one-GPU step, or mdrun's
    `-gpu_id 1`, fails when it starts (`invalid device ordinal`): the way a job run by
    hand on the second GPU was written. A CUDA_VISIBLE_DEVICES in the step's `env:` is
    replaced the same way."""
    shown = shown_path(pipeline)
    lines = []
    for step in pipeline.steps:
        found = [
            f"{what}: {_sees(step, index)}"
            for what, index in _named_gpus(step.argv)
            if index >= step.gpus
        ]
        if "CUDA_VISIBLE_DEVICES" in step.env:
            found.append(
                "env CUDA_VISIBLE_DEVICES is replaced by the GPUs m27 leases the step "
                + ("(choose how many with gpus: N)" if step.gpus else "(a cpu step: none)")
            )
        lines += [f"{shown}:{step.line}: step {step.name}: {text}" for text in found]
    return lines


def _named_gpus(argv: tuple[str, ...]) -> list[tuple[str, int]]:
    """(as written, the highest GPU index it names) for each GPU the command names."""
    named = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] in _GPU_ID_OPTIONS:
            digits = arg.replace(",", "")
            if digits.isdigit():
                named.append((f"{argv[i - 1]} {arg}", max(int(d) for d in digits)))
        named += [(m.group(0), int(m.group(1))) for m in _CUDA_INDEX.finditer(arg)]
    return named


def _sees(step: Step, index: int) -> str:
    if step.gpus == 0:
        return (
            f"a cpu step sees no GPU (m27 sets CUDA_VISIBLE_DEVICES empty), so GPU {index} "
            "is not there when it starts; make it type: gpu"
        )
    first = {1: "GPU 0", 2: "GPUs 0 and 1"}.get(step.gpus, f"GPUs 0 to {step.gpus - 1}")
    return (
        f"the step sees its {step.gpus} leased GPU{'s' if step.gpus > 1 else ''} as {first} "
        f"(m27 sets CUDA_VISIBLE_DEVICES), so GPU {index} is not there when it starts; "
        f"write {'0' if step.gpus == 1 else 'one of those'}, or ask for more with gpus: N"
    )


def shown_path(pipeline: Pipeline) -> str:
    """The pipeline file as problems name it: relative to here, unless that climbs out."""
    shown = os.path.relpath(pipeline.path)
    return str(pipeline.path) if shown.startswith("..") else shown


#: steps named in one note of :func:`missing_programs` (then "and N more")
MISSING_SHOWN = 3
#: notes a terminal is shown (`m27 validate --json` has them all)
NOTES_SHOWN = 10


def shown_notes(notes: list[str]) -> list[str]:
    """The first :data:`NOTES_SHOWN` notes, and how many more there are."""
    if len(notes) <= NOTES_SHOWN:
        return notes
    more = len(notes) - NOTES_SHOWN
    return [*notes[:NOTES_SHOWN], f"... and {more} more (`m27 validate --json` lists all)"]
