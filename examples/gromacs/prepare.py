"""Build the example's system: an SPC/E water box from the shipped spc216.gro, then grompp.

    python prepare.py --nsteps 20000 --out out [--box 2.5] [--seed 27] [--temperature 300]

Writes out/md.mdp (nsteps and the seed of the starting velocities filled in),
out/topol.top, out/water.gro, a short energy minimization (out/em.*) and
out/simulation.tpr, which `gmx mdrun -deffnm simulation` in out/ runs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPOLOGY = """\
#include "oplsaa.ff/forcefield.itp"
#include "oplsaa.ff/spce.itp"

[ system ]
SPC/E water

[ molecules ]
"""


def gmx(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["gmx", "-quiet", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"gmx {args[0]} failed with exit code {done.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsteps", type=int, required=True, help="MD steps (2 fs each)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the run's files")
    parser.add_argument("--box", default="2.5", help="cubic box edge in nm (2.5: 1,530 atoms)")
    parser.add_argument(
        "--seed", type=int, default=27, help="seed of the starting velocities (gen-seed)"
    )
    parser.add_argument(
        "--temperature", default="300", help="kelvin (ref-t, gen-temp); replica exchange "
        "across temperatures prepares one folder per temperature"
    )  # fmt: skip
    args = parser.parse_args(argv)
    if shutil.which("gmx") is None:
        raise SystemExit("gmx not found: install GROMACS first (apt-get install gromacs)")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    mdp = (HERE / "files" / "md.mdp").read_text().replace("{{NSTEPS}}", str(args.nsteps))
    mdp = mdp.replace("{{SEED}}", str(args.seed)).replace("{{TEMP}}", args.temperature)
    (out / "md.mdp").write_text(mdp)
    (out / "topol.top").write_text(TOPOLOGY)
    shutil.copy(HERE / "files" / "spc216.gro", out / "spc216.gro")
    box = [args.box] * 3
    gmx("solvate", "-cs", "spc216.gro", "-box", *box, "-o", "water.gro", "-p", "topol.top",
        cwd=out)  # fmt: skip
    # A fresh box has overlapping waters: minimize first, or MD starts at ~1,000 K.
    shutil.copy(HERE / "files" / "em.mdp", out / "em.mdp")
    gmx("grompp", "-f", "em.mdp", "-c", "water.gro", "-p", "topol.top", "-o", "em.tpr",
        "-maxwarn", "2", cwd=out)  # fmt: skip
    gmx("mdrun", "-deffnm", "em", "-ntmpi", "1", "-ntomp", "1", cwd=out)
    gmx("grompp", "-f", "md.mdp", "-c", "em.gro", "-p", "topol.top", "-o", "simulation.tpr",
        "-maxwarn", "2", cwd=out)  # fmt: skip
    for leftover in [*out.glob("#*#"), *out.glob("step*.pdb")]:  # backups, EM snapshots
        leftover.unlink()
    print(f"system ready: {out / 'simulation.tpr'} ({args.nsteps} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
