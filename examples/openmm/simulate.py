"""Langevin dynamics of the water box on OpenMM's fastest platform, surviving a kill.

    python simulate.py --dir out --steps 5000 [--platform auto] [--report-every 100]

The second step of the OpenMM example. It reads ``system.xml`` and ``start.pdb`` from
``--dir`` and advances the system in chunks of ``--report-every`` steps of 2 fs, adding a
row to ``energy.csv`` after each. Under m27 the state (positions, velocities and box, in
OpenMM's units: nm, nm/ps) is saved through ``m27.Checkpointer`` every ``checkpoint:``
interval of the step; started again after a kill (``m27 run --resume``), the script goes
on from the newest valid checkpoint and cuts ``energy.csv`` back to its step, so the log
reads as one run. Asked to stop (``m27 cancel``, a ``timeout:``, a preempting job: TERM;
Slurm's USR1 before a time limit), it saves at once and exits 75, so a resume goes on from
where it stopped. Positions and velocities come back exactly; the thermostat's random
numbers do not, so the continued trajectory is the uninterrupted one statistically, not
bit for bit (``context.createCheckpoint()``, saved as bytes, would restore those too, but
only on the same platform and OpenMM version: not after a move to another machine).
At the end it writes ``final.pdb``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import openmm
from openmm import app, unit

HEADER = "step,time_ps,potential_kj_mol,kinetic_kj_mol,temperature_k\n"
TIMESTEP_PS = 0.002
GAS_CONSTANT = 0.00831446261815324  # kJ/(mol K)
#: Platforms tried by --platform auto, fastest first. OpenCL is left out: without a GPU it
#: may run on a CPU OpenCL driver, slower than OpenMM's own CPU platform.
AUTO_PLATFORMS = ("CUDA", "HIP", "CPU")


def simulation_on(
    pdb: app.PDBFile, system: openmm.System, args: argparse.Namespace
) -> tuple[app.Simulation, str]:
    """A Simulation on the first platform that can run it (CUDA_VISIBLE_DEVICES, which
    m27 sets to the step's GPUs, decides which device CUDA uses)."""
    names = AUTO_PLATFORMS if args.platform == "auto" else (args.platform,)
    reasons = []
    for name in names:
        integrator = openmm.LangevinMiddleIntegrator(
            args.temperature * unit.kelvin, 1 / unit.picosecond, TIMESTEP_PS * unit.picoseconds
        )
        integrator.setRandomNumberSeed(args.seed)
        try:
            platform = openmm.Platform.getPlatformByName(name)
            return app.Simulation(pdb.topology, system, integrator, platform), name
        except openmm.OpenMMException as exc:  # not installed here, or no usable device
            reasons.append(f"{name}: {str(exc).splitlines()[0]}")
    raise SystemExit("simulate: no OpenMM platform can run this: " + "; ".join(reasons))


def open_checkpointer() -> tuple[Any, threading.Event]:
    """An ``m27.Checkpointer`` when run by m27 (which sets M27_CHECKPOINT_DIR for each step
    of each run), and the event ``m27.watch_stop()`` sets when m27 asks the step to stop;
    by hand no checkpointer (a run by hand never resumes, unasked, from an older run's
    checkpoints) and an event never set (a signal ends the script as usual)."""
    if not os.environ.get("M27_CHECKPOINT_DIR"):
        print("simulate: not run by m27 (no M27_CHECKPOINT_DIR): running without checkpoints")
        return None, threading.Event()
    import m27

    return m27.Checkpointer(), m27.watch_stop()


def snapshot(context: openmm.Context) -> dict[str, np.ndarray]:
    """What a checkpoint holds: positions, velocities and box, as plain float64 arrays."""
    state = context.getState(getPositions=True, getVelocities=True)
    return {
        "positions": state.getPositions(asNumpy=True).value_in_unit(unit.nanometer),
        "velocities": state.getVelocities(asNumpy=True).value_in_unit(
            unit.nanometer / unit.picosecond
        ),
        "box": state.getPeriodicBoxVectors(asNumpy=True).value_in_unit(unit.nanometer),
    }


def load(context: openmm.Context, state: dict[str, Any]) -> None:
    a, b, c = np.asarray(state["box"])
    context.setPeriodicBoxVectors(*(openmm.Vec3(*v) * unit.nanometer for v in (a, b, c)))
    context.setPositions(np.asarray(state["positions"]) * unit.nanometer)
    context.setVelocities(np.asarray(state["velocities"]) * unit.nanometer / unit.picosecond)


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the header and the complete rows up to ``last_step`` (atomically)."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    kept = [HEADER]
    for line in lines[1:]:
        if not line.endswith("\n") or int(line.split(",", 1)[0]) > last_step:
            break
        kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    system = openmm.XmlSerializer.deserialize((args.dir / "system.xml").read_text())
    pdb = app.PDBFile(str(args.dir / "start.pdb"))
    simulation, platform = simulation_on(pdb, system, args)
    context = simulation.context
    dof = 3 * system.getNumParticles() - system.getNumConstraints() - 3
    log_path = args.dir / "energy.csv"
    checkpointer, stop = open_checkpointer()
    restored = checkpointer.restore() if checkpointer is not None else None
    if restored is None:
        start = 0
        context.setPositions(pdb.positions)
        context.setVelocitiesToTemperature(args.temperature * unit.kelvin, args.seed)
        log_path.write_text(HEADER)
        how = "starting at step 0"
    else:
        state, start = restored
        if np.shape(state["positions"]) != (system.getNumParticles(), 3) or start > args.steps:
            print(
                f"simulate: the checkpoint (step {start}, {len(state['positions'])} atoms) does "
                f"not fit this run ({args.steps} steps, {system.getNumParticles()} atoms)",
                file=sys.stderr,
            )
            return 1
        load(context, state)
        truncate_log(log_path, start)
        how = f"resumed from the checkpoint at step {start}"
    simulation.currentStep = start
    print(f"{how} on OpenMM {openmm.__version__} {platform}, {system.getNumParticles()} atoms")

    progress_every = max(args.report_every, args.steps // 10)
    began, step = time.monotonic(), start
    with log_path.open("a", buffering=1) as log:  # a row a line: `tail -f` shows each
        while step < args.steps:
            simulation.step(min(args.report_every, args.steps - step))
            step = simulation.currentStep
            energies = context.getState(getEnergy=True)
            potential = energies.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
            kinetic = energies.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
            temperature = 2 * kinetic / (dof * GAS_CONSTANT)
            log.write(
                f"{step},{step * TIMESTEP_PS:.4f},{potential:.3f},{kinetic:.3f},{temperature:.3f}\n"
            )
            if step % progress_every == 0 or step == args.steps:
                rate = (step - start) / max(time.monotonic() - began, 1e-9)
                print(
                    f"step {step}/{args.steps} T={temperature:.1f} K "
                    f"E_pot={potential:.1f} kJ/mol ({rate:.0f} steps/s)",
                    flush=True,
                )
            if checkpointer is not None and step < args.steps:
                if checkpointer.due() or stop.is_set():
                    log.flush()  # durable up to this step before a checkpoint says it is
                    os.fsync(log.fileno())
                    checkpointer.save(snapshot(context), step=step)
                if stop.is_set():
                    checkpointer.close()  # the save is durable before the process ends
                    print(f"stopped at step {step} (asked to): saved", flush=True)
                    return 75  # saved, run me again (Slurm's requeue code; any will do)
    if checkpointer is not None:
        checkpointer.close()
    final = context.getState(getPositions=True, enforcePeriodicBox=True).getPositions()
    with (args.dir / "final.pdb").open("w") as f:
        app.PDBFile.writeFile(simulation.topology, final, f)
    print(f"done: {args.steps} steps ({args.steps * TIMESTEP_PS:g} ps) -> {args.dir}/final.pdb")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="prepare.py's output folder")
    parser.add_argument("--steps", type=int, default=5000, help="2 fs steps in all")
    parser.add_argument("--report-every", type=int, default=100, help="steps per energy row")
    parser.add_argument("--temperature", type=float, default=300.0, help="kelvin")
    parser.add_argument("--seed", type=int, default=1, help="velocities and thermostat")
    parser.add_argument("--platform", default="auto", help="auto (CUDA, HIP, CPU), or a name")
    args = parser.parse_args(argv)
    if args.steps <= 0 or args.report_every <= 0:
        parser.error("--steps and --report-every must be positive")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
