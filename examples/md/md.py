"""Velocity-Verlet molecular dynamics of a Lennard-Jones fluid that survives being killed.

The second step of the MD example pipeline. One code path runs on NumPy, or on CuPy when
it is installed and a GPU is present: the array module ``xp`` is chosen once and every
array operation goes through it.

Every ``--log-every`` steps a row goes to ``energy.csv``; every ``--frame-every`` steps a
frame goes to ``trajectory.xyz`` (extended XYZ, readable by OVITO and VMD). The state is
saved through ``m27.Checkpointer``: killed at any moment and started again, the run
continues from the newest valid checkpoint, and the logs are cut back to that step so
they read as one continuous run. Asked to stop (``m27 cancel``, a timeout, preemption:
TERM; Slurm's USR1), it saves at once and exits 75, and continues from there. On NumPy
a resumed run reproduces an uninterrupted one bit for bit, because the neighbour list's
reference positions are saved too; on CuPy the force sums use atomic adds, whose order
varies, so it matches to rounding instead.

Usage: python md.py --system out/system.npz --steps 2000 --out out
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

try:
    import m27
except ImportError:  # the script also runs without m27 installed, just without checkpoints
    m27 = None  # type: ignore[assignment]

ENERGY_HEADER = "step,time,kinetic,potential,total,temperature\n"


def array_module(choice: str) -> Any:
    """CuPy when asked or when it is importable and sees a GPU; NumPy otherwise."""
    if choice == "numpy":
        return np
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception as exc:  # no CuPy, no driver or no device: all mean "use NumPy"
        if choice == "cupy":
            raise SystemExit(f"md: --backend cupy asked for, but CuPy cannot run: {exc}") from exc
    if choice == "cupy":
        raise SystemExit("md: --backend cupy asked for, but no GPU is visible")
    return np


def to_host(xp: Any, array: Any) -> np.ndarray:
    return np.asarray(array) if xp is np else xp.asnumpy(array)


class LennardJones:
    """Forces and energy of a truncated, shifted LJ potential with a Verlet neighbour list.

    The list holds every pair within ``cutoff + skin`` of the positions it was built
    from (``reference``); it stays valid until some atom has moved more than half the
    skin, which at liquid densities is every 10 to 20 steps. Building it looks at all
    N^2/2 pairs, which keeps the code short and is fine up to a few thousand atoms.
    """

    def __init__(
        self,
        xp: Any,
        n_atoms: int,
        box: float,
        epsilon: float = 1.0,
        sigma: float = 1.0,
        cutoff: float = 2.5,
        skin: float = 0.3,
    ) -> None:
        if cutoff * sigma > box / 2:
            raise ValueError(f"cutoff {cutoff * sigma} is more than half the box ({box})")
        self.xp = xp
        self.n_atoms = n_atoms
        self.box = box
        self.epsilon = epsilon
        self.sigma2 = sigma * sigma
        self.cutoff2 = (cutoff * sigma) ** 2
        self.list_radius2 = ((cutoff + skin) * sigma) ** 2
        self.half_skin2 = (skin * sigma / 2) ** 2
        inv6 = cutoff**-6.0
        self.shift = 4.0 * epsilon * (inv6 * inv6 - inv6)
        self.all_i, self.all_j = xp.triu_indices(n_atoms, 1)
        self.i = self.all_i
        self.j = self.all_j
        self.reference: Any = None
        self.builds = 0

    def minimum_image(self, d: Any) -> Any:
        return d - self.box * self.xp.rint(d / self.box)

    def build(self, positions: Any) -> None:
        d = self.minimum_image(positions[self.all_i] - positions[self.all_j])
        keep = self.xp.nonzero((d * d).sum(axis=1) < self.list_radius2)[0]
        self.i, self.j = self.all_i[keep], self.all_j[keep]
        self.reference = positions.copy()
        self.builds += 1

    def update(self, positions: Any) -> None:
        """Rebuild the list when some atom has moved more than half the skin."""
        d = self.minimum_image(positions - self.reference)
        if float(self.xp.max((d * d).sum(axis=1))) > self.half_skin2:
            self.build(positions)

    def forces(self, positions: Any) -> tuple[Any, Any]:
        """Forces on every atom and the potential energy (a 0-d array, still on device)."""
        xp = self.xp
        d = self.minimum_image(positions[self.i] - positions[self.j])
        r2 = (d * d).sum(axis=1)
        inside = r2 < self.cutoff2
        s2 = xp.where(inside, self.sigma2 / r2, 0.0)
        s6 = s2 * s2 * s2
        energy = xp.sum(xp.where(inside, 4.0 * self.epsilon * (s6 * s6 - s6) - self.shift, 0.0))
        # |F| / r for each pair; zero outside the cutoff because s2 is zero there.
        f_over_r = (24.0 * self.epsilon / self.sigma2) * (2.0 * s6 * s6 - s6) * s2
        pair = f_over_r[:, None] * d
        n = self.n_atoms
        forces = xp.stack(
            [
                xp.bincount(self.i, pair[:, k], minlength=n)
                - xp.bincount(self.j, pair[:, k], minlength=n)
                for k in range(3)
            ],
            axis=1,
        )
        return forces, energy


def kinetic_energy(xp: Any, velocities: Any) -> float:
    return 0.5 * float(xp.sum(velocities * velocities))


def verlet_step(lj: LennardJones, x: Any, v: Any, forces: Any, dt: float) -> tuple[Any, Any]:
    """Advance positions and velocities in place by one step; return the new forces."""
    v += 0.5 * dt * forces
    x += dt * v
    x %= lj.box
    lj.update(x)
    forces, potential = lj.forces(x)
    v += 0.5 * dt * forces
    return forces, potential


def truncate_energy_log(path: Path, last_step: int) -> None:
    """Keep the header and the complete rows up to ``last_step``; drop the rest."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    kept = [ENERGY_HEADER]
    for line in lines[1:]:
        if not line.endswith("\n") or int(line.split(",", 1)[0]) > last_step:
            break
        kept.append(line)
    replace_text(path, "".join(kept))


def frame_step(comment: str) -> int:
    for field in comment.split():
        if field.startswith("step="):
            return int(field[5:])
    raise ValueError(f"no step= in frame comment {comment!r}")


def truncate_trajectory(path: Path, last_step: int) -> None:
    """Keep the complete frames up to ``last_step``; a torn last frame is dropped."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    end = 0
    while end < len(lines):
        try:
            count = int(lines[end])
        except ValueError:
            break
        frame = lines[end : end + count + 2]
        if len(frame) < count + 2 or not frame[-1].endswith("\n"):
            break
        if frame_step(frame[1]) > last_step:
            break
        end += count + 2
    replace_text(path, "".join(lines[:end]))


def replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_frame(out: TextIO, positions: np.ndarray, box: float, step: int, dt: float) -> None:
    out.write(f"{len(positions)}\n")
    out.write(
        f'Lattice="{box} 0 0 0 {box} 0 0 0 {box}" Properties=species:S:1:pos:R:3 '
        f'pbc="T T T" step={step} time={step * dt:.6g}\n'
    )
    np.savetxt(out, positions, fmt="Ar %.8f %.8f %.8f")
    out.flush()


def open_checkpointer(directory: Path | None) -> Any:
    """An ``m27.Checkpointer`` writing to ``directory``; None without m27 or a directory.

    A run by hand checkpoints only when asked (``--checkpoint-dir``), so that it never
    resumes, unasked, from an older run's checkpoints. Under m27 the runner sets
    M27_CHECKPOINT_DIR (the default of ``--checkpoint-dir``) for each step of each run.
    """
    if directory is None:
        print("md: no --checkpoint-dir or M27_CHECKPOINT_DIR: running without checkpoints")
        return None
    try:
        from m27.checkpoint import Checkpointer
    except ImportError:
        print("md: m27 is not installed: running without checkpoints", flush=True)
        return None
    return Checkpointer(directory)


def stop_signal(checkpointer: Any) -> threading.Event:
    """Set when m27 or Slurm asks the step to stop (``m27.watch_stop()``), so that it saves
    first; with no checkpointer, an event never set (a signal ends the script as usual)."""
    if checkpointer is None or m27 is None:
        return threading.Event()
    event: threading.Event = m27.watch_stop()
    return event


def io_wait() -> contextlib.AbstractContextManager[Any]:
    """Tell the m27 agent that the GPU is idle while we write (a no-op without m27)."""
    marker: Callable[[], contextlib.AbstractContextManager[Any]] = getattr(
        m27, "io_wait", contextlib.nullcontext
    )
    return marker()


class Logs:
    """``energy.csv`` and ``trajectory.xyz``: started fresh, or cut back to a resumed step."""

    def __init__(self, out: Path, box: float, dt: float, dof: int, resume_step: int | None):
        self.box, self.dt, self.dof = box, dt, dof
        energy_path, trajectory_path = out / "energy.csv", out / "trajectory.xyz"
        if resume_step is None:
            energy_path.write_text(ENERGY_HEADER)
            trajectory_path.write_text("")
        else:
            truncate_energy_log(energy_path, resume_step)
            truncate_trajectory(trajectory_path, resume_step)
        self.energy = energy_path.open("a")
        self.trajectory = trajectory_path.open("a")

    def energy_row(self, step: int, kinetic: float, potential: float) -> float:
        """Append one row; return the temperature."""
        temperature = 2.0 * kinetic / self.dof
        self.energy.write(
            f"{step},{step * self.dt:.6g},{kinetic:.12g},{potential:.12g},"
            f"{kinetic + potential:.12g},{temperature:.8g}\n"
        )
        self.energy.flush()
        return temperature

    def frame(self, step: int, positions: np.ndarray) -> None:
        with io_wait():
            write_frame(self.trajectory, positions, self.box, step, self.dt)

    def sync(self) -> None:
        """Make the logs durable before a checkpoint that says they reach this step."""
        for f in (self.energy, self.trajectory):
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        self.energy.close()
        self.trajectory.close()


def run(args: argparse.Namespace) -> int:
    xp = array_module(args.backend)
    system = np.load(args.system)
    box = float(system["box"])
    x = xp.array(system["positions"], dtype=xp.float64)
    v = xp.array(system["velocities"], dtype=xp.float64)
    n_atoms = len(x)
    lj = LennardJones(
        xp, n_atoms, box, float(system["epsilon"]), float(system["sigma"]), args.cutoff
    )
    dt, steps = args.dt, args.steps
    args.out.mkdir(parents=True, exist_ok=True)

    with contextlib.ExitStack() as stack:
        checkpointer = open_checkpointer(args.checkpoint_dir)
        if checkpointer is not None:
            stack.callback(checkpointer.close)
        restored = checkpointer.restore() if checkpointer is not None else None
        if restored is None:
            start = 0
            lj.build(x)
            print(f"starting at step 0 on {xp.__name__}, {n_atoms} atoms", flush=True)
        else:
            state, start = restored
            if tuple(state["positions"].shape) != (n_atoms, 3) or start > steps:
                print(
                    f"md: the checkpoint (step {start}, {len(state['positions'])} atoms) "
                    f"does not fit this run ({steps} steps, {n_atoms} atoms)",
                    file=sys.stderr,
                )
                return 1
            x = xp.array(state["positions"], dtype=xp.float64)
            v = xp.array(state["velocities"], dtype=xp.float64)
            lj.build(xp.array(state["list_reference"], dtype=xp.float64))
            print(f"resumed from checkpoint at step {start}", flush=True)
        logs = Logs(args.out, box, dt, 3 * n_atoms - 3, None if restored is None else start)
        stack.callback(logs.close)
        forces, potential = lj.forces(x)
        progress_every = max(1, steps // 10)
        due = checkpoint_schedule(args.checkpoint_every_steps, checkpointer)
        stop = stop_signal(checkpointer)

        # A fresh run logs step 0; a resumed one logged its step before the checkpoint.
        first = 0 if restored is None else start + 1
        for step in range(first, steps + 1):
            if step > start:
                forces, potential = verlet_step(lj, x, v, forces, dt)
            last = step == steps
            if step % args.log_every == 0 or last:
                kinetic, pe = kinetic_energy(xp, v), float(potential)
                temperature = logs.energy_row(step, kinetic, pe)
                if step % progress_every == 0 or last:
                    total = kinetic + pe
                    print(f"step {step}/{steps} E={total:.4f} T={temperature:.4f}", flush=True)
            if step % args.frame_every == 0 or last:
                logs.frame(step, to_host(xp, x))
            if checkpointer is not None and (due(step) or stop.is_set()):
                # The logs must be durable up to this step before a checkpoint says so.
                logs.sync()
                state = {"positions": x, "velocities": v, "list_reference": lj.reference}
                checkpointer.save(state, step=step)
            if stop.is_set() and not last:
                print(f"stopped at step {step} (asked to): saved", flush=True)
                return 75  # saved, run me again; closing the checkpointer makes it durable

    final = args.out / "final.npz"
    np.savez(final, positions=to_host(xp, x), velocities=to_host(xp, v), step=steps, box=box)
    print(f"done: {steps} steps, {lj.builds} neighbour-list builds -> {args.out}")
    return 0


def checkpoint_schedule(every_steps: int, checkpointer: Any) -> Callable[[int], bool]:
    """When to save: every N steps if asked (deterministic, for tests), else every
    ``checkpointer.interval`` seconds (the step's ``checkpoint:``, from the runner)."""
    if every_steps:
        return lambda step: step % every_steps == 0
    interval = checkpointer.interval if checkpointer is not None else 0.0
    last = time.monotonic()

    def due(step: int) -> bool:
        nonlocal last
        if time.monotonic() - last < interval:
            return False
        last = time.monotonic()
        return True

    return due


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", type=Path, required=True, help="system.npz from prepare.py")
    parser.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--dt", type=float, default=0.005, help="time step (reduced units)")
    parser.add_argument("--cutoff", type=float, default=2.5, help="in units of sigma")
    parser.add_argument("--log-every", type=int, default=10, help="steps per energy row")
    parser.add_argument("--frame-every", type=int, default=100, help="steps per frame")
    parser.add_argument(
        "--checkpoint-every-steps",
        type=int,
        default=0,
        help="checkpoint every N steps instead of every M27_CHECKPOINT_INTERVAL",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=os.environ.get("M27_CHECKPOINT_DIR") or None,
        help="where m27.Checkpointer keeps checkpoints (default: $M27_CHECKPOINT_DIR)",
    )
    parser.add_argument("--backend", choices=["auto", "numpy", "cupy"], default="auto")
    args = parser.parse_args(argv)
    for name in ("steps", "log_every", "frame_every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
