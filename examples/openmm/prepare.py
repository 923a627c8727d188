"""Build a box of TIP3P water with OpenMM and minimize it: the first step of the example.

    python prepare.py --out out [--box 2.0]

Writes ``out/system.xml`` (the force field applied: PME electrostatics, rigid water) and
``out/start.pdb`` (the minimized positions, with the box in its CRYST1 record), which
``simulate.py`` reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import openmm
from openmm import app, unit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    parser.add_argument("--box", type=float, default=2.0, help="cube side, nm (>= 1.9)")
    args = parser.parse_args(argv)
    if args.box < 1.9:
        parser.error("--box must be at least 1.9 nm: twice the 0.9 nm cutoff, and a margin")
    args.out.mkdir(parents=True, exist_ok=True)

    forcefield = app.ForceField("amber14-all.xml", "amber14/tip3p.xml")
    modeller = app.Modeller(app.Topology(), [])
    side = args.box
    modeller.addSolvent(forcefield, boxSize=openmm.Vec3(side, side, side) * unit.nanometer)
    system = forcefield.createSystem(
        modeller.topology, nonbondedMethod=app.PME, nonbondedCutoff=0.9 * unit.nanometer
    )
    integrator = openmm.VerletIntegrator(0.001 * unit.picosecond)
    context = openmm.Context(system, integrator, openmm.Platform.getPlatformByName("CPU"))
    context.setPositions(modeller.positions)
    openmm.LocalEnergyMinimizer.minimize(context, maxIterations=500)
    state = context.getState(getPositions=True, getEnergy=True)

    (args.out / "system.xml").write_text(openmm.XmlSerializer.serialize(system))
    with (args.out / "start.pdb").open("w") as f:
        app.PDBFile.writeFile(modeller.topology, state.getPositions(), f)
    waters = modeller.topology.getNumResidues()
    energy = state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
    print(
        f"{waters} waters ({system.getNumParticles()} atoms) in a {args.box:g} nm box, "
        f"minimized to {energy:.1f} kJ/mol -> {args.out}/start.pdb"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
