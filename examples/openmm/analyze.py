"""Temperature and potential energy of the OpenMM run over time, as a PNG and a summary.

    python analyze.py --dir out

Reads ``energy.csv`` (written by ``simulate.py``), writes ``energy.png`` and
``summary.json`` (means and spreads over the second half, once the thermostat has brought
the minimized, cold box to temperature) and prints them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def spread(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(values.mean()), "std": float(values.std())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the run's folder")
    args = parser.parse_args(argv)
    table = np.loadtxt(args.dir / "energy.csv", delimiter=",", skiprows=1, ndmin=2)
    time_ps, potential, temperature = table[:, 1], table[:, 2], table[:, 4]
    steps = table[:, 0].astype(int)
    if np.any(np.diff(steps) <= 0):
        raise SystemExit(f"analyze: {args.dir}/energy.csv: steps do not increase")
    half = slice(len(table) // 2, None)
    t, u = spread(temperature[half]), spread(potential[half])
    summary = {
        "rows": len(table),
        "last_step": int(steps[-1]),
        "time_ps": float(time_ps[-1]),
        "temperature_k": t,
        "potential_kj_mol": u,
    }
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 4.5), sharex=True)
    top.plot(time_ps, temperature, lw=0.8)
    top.set_ylabel("temperature (K)")
    bottom.plot(time_ps, potential, lw=0.8)
    bottom.set_ylabel("potential (kJ/mol)")
    bottom.set_xlabel("time (ps)")
    fig.suptitle(f"TIP3P water, OpenMM, {len(table)} rows to step {steps[-1]}")
    fig.tight_layout()
    fig.savefig(args.dir / "energy.png", dpi=100)
    print(
        f"second half: T {t['mean']:.1f} +- {t['std']:.1f} K, "
        f"E_pot {u['mean']:.1f} +- {u['std']:.1f} kJ/mol; wrote {args.dir}/energy.png"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
