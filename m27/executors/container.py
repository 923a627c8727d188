"""Running a step inside an Apptainer (or Singularity) image: ``container: image.sif``.

Only the command line changes: ``wrap_argv`` turns the step's argv into
``apptainer exec [--nv] [--bind SRC[:DST[:OPTS]]]... IMAGE ARGV...``, which the local
runner and the Slurm executor start like any other command. The environment (``M27_*``,
``CUDA_VISIBLE_DEVICES``) passes through, because Apptainer keeps the host environment by
default; ``--nv`` binds the host's NVIDIA driver into the container for GPU steps.

Apptainer is preferred; ``singularity`` (its predecessor, still the name on many
clusters) is used when it is the only one installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence

from m27._exceptions import RunnerError

#: Runtimes in order of preference.
RUNTIMES = ("apptainer", "singularity")

Which = Callable[[str], str | None]


def find_runtime(runtime: str | None = None, which: Which = shutil.which) -> str:
    """The container runtime to call: `runtime` if given (a name or a path), else the first
    of apptainer, singularity on PATH. Raises RunnerError naming both when neither is."""
    if runtime:
        found = which(runtime)
        if found is None:
            raise RunnerError(f"container runtime {runtime!r} is not installed (not on PATH)")
        return runtime
    for name in RUNTIMES:
        if which(name) is not None:
            return name
    raise RunnerError(
        "this step runs in a container, but neither apptainer nor singularity is installed "
        "(install Apptainer: https://apptainer.org/docs/admin/main/installation.html)"
    )


def bind_spec(bind: str) -> str:
    """Check one ``binds:`` entry: ``SRC``, ``SRC:DST`` or ``SRC:DST:ro|rw``."""
    parts = bind.split(":")
    if not bind.strip() or len(parts) > 3 or not all(parts[:2]):
        raise RunnerError(f"bind {bind!r} is not SRC, SRC:DST or SRC:DST:ro")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        raise RunnerError(f"bind {bind!r}: the third part must be ro or rw, not {parts[2]!r}")
    return bind


def wrap_argv(
    argv: Sequence[str],
    image: str,
    binds: Sequence[str] = (),
    runtime: str | None = None,
    gpus: bool | int = False,
    which: Which = shutil.which,
) -> tuple[str, ...]:
    """`argv` run inside `image` with `binds`; ``--nv`` when the step uses GPUs."""
    if not argv:
        raise RunnerError("a container step needs a command")
    if not image or not image.strip():
        raise RunnerError("container: needs an image (a .sif file or docker://, oras://, ...)")
    out = [find_runtime(runtime, which), "exec"]
    if gpus:
        out.append("--nv")
    for bind in binds:
        out += ["--bind", bind_spec(bind)]
    return (*out, image, *argv)


__all__ = ["RUNTIMES", "bind_spec", "find_runtime", "wrap_argv"]
