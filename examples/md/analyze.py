"""Check and picture an MD run: energy drift and the radial distribution function g(r).

The last step of the MD example pipeline. It reads ``energy.csv`` and ``trajectory.xyz``
from the run folder that ``md.py`` wrote and adds ``analysis.png`` (energies against
time, and g(r)) and ``summary.json``. A drift far above 1e-4 per 1000 steps means the
time step is too long; a g(r) with a first peak near 1.1 sigma and no atoms closer than
0.8 sigma says the system is a Lennard-Jones liquid.

Usage: python analyze.py --run out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

Frame = tuple[int, float, np.ndarray]  # step, box side, positions


def read_energy(path: Path) -> dict[str, np.ndarray]:
    """The columns of ``energy.csv`` by name."""
    with path.open() as f:
        names = f.readline().strip().split(",")
        table = np.loadtxt(f, delimiter=",", ndmin=2)
    return {name: table[:, k] for k, name in enumerate(names)}


def read_frames(path: Path) -> list[Frame]:
    """Every frame of an extended-XYZ file written by ``md.py``."""
    lines = path.read_text().splitlines()
    frames: list[Frame] = []
    at = 0
    while at < len(lines) and lines[at].strip():
        count = int(lines[at])
        comment = lines[at + 1]
        fields = dict(f.split("=", 1) for f in comment.split() if "=" in f)
        box = float(comment.split('Lattice="', 1)[1].split()[0])
        rows = [line.split()[1:4] for line in lines[at + 2 : at + 2 + count]]
        frames.append((int(fields["step"]), box, np.array(rows, dtype=np.float64)))
        at += count + 2
    return frames


def energy_drift(steps: np.ndarray, total: np.ndarray) -> tuple[float, float]:
    """Relative drift per 1000 steps (least-squares slope) and largest relative deviation."""
    scale = abs(float(np.mean(total)))
    slope = float(np.polyfit(steps, total, 1)[0]) if len(steps) > 1 else 0.0
    deviation = float(np.max(np.abs(total - total[0]))) / scale
    return slope * 1000.0 / scale, deviation


def radial_distribution(frames: list[Frame], bins: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """g(r) averaged over ``frames``, out to half the box, with minimum-image distances."""
    box = frames[0][1]
    n_atoms = len(frames[0][2])
    i, j = np.triu_indices(n_atoms, 1)
    edges = np.linspace(0.0, box / 2, bins + 1)
    counts = np.zeros(bins)
    for _, frame_box, positions in frames:
        d = positions[i] - positions[j]
        d -= frame_box * np.rint(d / frame_box)
        counts += np.histogram(np.sqrt((d * d).sum(axis=1)), bins=edges)[0]
    density = n_atoms / box**3
    shell = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    # Each pair is counted once, so twice the count over N is the neighbours per atom.
    g = 2.0 * counts / (len(frames) * n_atoms * density * shell)
    return 0.5 * (edges[1:] + edges[:-1]), g


def plot(path: Path, energy: dict[str, np.ndarray], r: np.ndarray, g: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for name, colour in (("total", "black"), ("kinetic", "tab:red"), ("potential", "tab:blue")):
        left.plot(energy["time"], energy[name], label=name, color=colour, linewidth=1.2)
    left.set_xlabel("time (reduced units)")
    left.set_ylabel("energy (epsilon)")
    left.set_title("Energy: the total stays flat while kinetic and potential trade")
    left.legend(loc="center right")
    right.plot(r, g, color="tab:green", linewidth=1.5)
    right.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    right.set_xlabel("r (sigma)")
    right.set_ylabel("g(r)")
    right.set_title("Radial distribution function")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyze(run: Path, rdf_frames: int = 10) -> dict[str, Any]:
    """Write ``analysis.png`` and ``summary.json`` into ``run``; return the summary."""
    energy = read_energy(run / "energy.csv")
    frames = read_frames(run / "trajectory.xyz")
    if not frames or len(energy["step"]) == 0:
        raise ValueError(f"{run}: no frames or no energy rows to analyse")
    # The first half of the run melts the lattice; g(r) describes the liquid after it.
    used = frames[max(len(frames) // 2, len(frames) - rdf_frames) :]
    r, g = radial_distribution(used)
    drift, deviation = energy_drift(energy["step"], energy["total"])
    later = energy["temperature"][len(energy["temperature"]) // 2 :]
    peak = int(np.argmax(g))
    n_atoms, box = len(frames[0][2]), frames[0][1]
    summary = {
        "atoms": n_atoms,
        "last_step": int(energy["step"][-1]),
        "box": box,
        "density": n_atoms / box**3,
        "energy_drift_per_1000_steps": drift,
        "energy_max_deviation": deviation,
        "mean_temperature": float(np.mean(later)),
        "rdf_frames": len(used),
        "rdf_peak_r": float(r[peak]),
        "rdf_peak_g": float(g[peak]),
    }
    plot(run / "analysis.png", energy, r, g)
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="folder md.py wrote into")
    parser.add_argument("--rdf-frames", type=int, default=10, help="last frames for g(r)")
    args = parser.parse_args(argv)
    try:
        s = analyze(args.run, args.rdf_frames)
    except (OSError, ValueError, KeyError) as exc:
        print(f"analyze: {exc}", file=sys.stderr)
        return 1
    print(
        f"{s['atoms']} atoms, {s['last_step']} steps, mean temperature "
        f"{s['mean_temperature']:.3f} over the second half\n"
        f"energy drift {s['energy_drift_per_1000_steps']:.2e} per 1000 steps (relative), "
        f"largest deviation {s['energy_max_deviation']:.2e}\n"
        f"g(r): first peak {s['rdf_peak_g']:.2f} at r = {s['rdf_peak_r']:.2f} sigma "
        f"({s['rdf_frames']} frames)\n"
        f"wrote {args.run / 'analysis.png'} and {args.run / 'summary.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
