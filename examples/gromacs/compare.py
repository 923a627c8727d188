"""Compare the replicas of replicas.yaml: each one's averages, and how far they spread.

    python compare.py out/replicas

Reads the energy.xvg that analyze.py wrote in each replica's folder (out/replicas/SEED/),
prints a table of each replica's mean temperature, pressure and total energy with the
mean and standard deviation over the replicas, and writes it to out/replicas/compare.txt.
Replicas that differ only in their starting velocities should agree within their noise:
a replica far from the others is worth a look.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from analyze import read_xvg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the folder of the replicas' folders")
    args = parser.parse_args(argv)
    found = sorted(args.folder.glob("*/energy.xvg"), key=lambda p: p.parent.name)
    if not found:
        print(f"no */energy.xvg under {args.folder}", file=sys.stderr)
        return 1
    legends: list[str] = []
    means = []
    for path in found:
        legends, table = read_xvg(path)
        means.append(table[:, 1:].mean(axis=0))
    rows = np.array(means)
    width = max(12, *(len(n) for n in legends))
    lines = ["replica".ljust(10) + "".join(n.rjust(width) for n in legends)]
    for path, row in zip(found, rows, strict=True):
        lines.append(path.parent.name.ljust(10) + "".join(f"{v:{width}.2f}" for v in row))
    lines.append("mean".ljust(10) + "".join(f"{v:{width}.2f}" for v in rows.mean(axis=0)))
    lines.append("std".ljust(10) + "".join(f"{v:{width}.2f}" for v in rows.std(axis=0)))
    text = "\n".join(lines) + "\n"
    (args.folder / "compare.txt").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
