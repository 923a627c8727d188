"""Temperature, pressure and energy over time from GROMACS's energy file, as a PNG.

    python analyze.py --dir out

Runs `gmx energy` (the term names go on its stdin) to write out/energy.xvg, then plots
out/energy.png and prints the averages.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

TERMS = ("Temperature", "Pressure", "Total-Energy")


def read_xvg(path: Path) -> tuple[list[str], np.ndarray]:
    """Legends and the numeric table of an .xvg file (comments and @ lines skipped)."""
    legends: list[str] = []
    rows: list[list[float]] = []
    for line in path.read_text().splitlines():
        if line.startswith("@ s") and " legend " in line:
            legends.append(line.split('"')[1])
        elif line and line[0] not in "#@":
            rows.append([float(x) for x in line.split()])
    return legends, np.array(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the run's folder")
    parser.add_argument("--edr", default="simulation.edr")
    args = parser.parse_args(argv)
    run: Path = args.dir
    done = subprocess.run(
        ["gmx", "-quiet", "energy", "-f", args.edr, "-o", "energy.xvg"],
        input="\n".join(TERMS) + "\n\n",
        cwd=run,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        return done.returncode
    legends, table = read_xvg(run / "energy.xvg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(legends), 1, figsize=(7, 2.2 * len(legends)), sharex=True)
    for ax, name, column in zip(np.atleast_1d(axes), legends, table[:, 1:].T, strict=True):
        ax.plot(table[:, 0], column, lw=0.8)
        ax.set_ylabel(name)
        print(f"{name}: mean {column.mean():.2f}, std {column.std():.2f}")
    np.atleast_1d(axes)[-1].set_xlabel("time (ps)")
    fig.suptitle(f"SPC/E water, {len(table)} energy frames")
    fig.tight_layout()
    fig.savefig(run / "energy.png", dpi=100)
    print(f"wrote {run / 'energy.png'} ({len(table)} frames, t = {table[-1, 0]:g} ps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
