"""Build a Lennard-Jones system (FCC lattice in a periodic cube) from a small input file.

The first step of the MD example pipeline. It runs on a CPU in well under a second and
writes ``system.npz``, which ``md.py`` reads. The same input and seed always give the
same bytes, so a rerun of the pipeline starts from the same system.

Usage: python prepare.py --input argon.in --out out/system.npz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

# name -> (type, default); every key the input file may set.
PARAMETERS: dict[str, tuple[type, Any]] = {
    "cells": (int, 5),
    "density": (float, 0.8442),
    "temperature": (float, 1.5),
    "seed": (int, 27),
    "epsilon": (float, 1.0),
    "sigma": (float, 1.0),
}

# The four atoms of a face-centred cubic unit cell, in cell units.
FCC_BASIS = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])


class InputError(ValueError):
    """The input file has an unknown key or a value that does not parse."""


def read_input(path: Path) -> dict[str, Any]:
    """Parse ``key = value`` lines; an unknown key or bad value names its line."""
    params = {name: default for name, (_, default) in PARAMETERS.items()}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep or key not in PARAMETERS:
            known = ", ".join(PARAMETERS)
            raise InputError(f"{path}:{number}: expected one of {known} as 'key = value'")
        kind = PARAMETERS[key][0]
        try:
            params[key] = kind(value)
        except ValueError:
            raise InputError(f"{path}:{number}: {key} must be {kind.__name__}") from None
    for key in ("cells", "density", "temperature", "epsilon", "sigma"):
        if params[key] <= 0:
            raise InputError(f"{path}: {key} must be positive, got {params[key]}")
    return params


def build_system(params: dict[str, Any]) -> dict[str, np.ndarray]:
    """FCC positions, Maxwell-Boltzmann velocities with zero net momentum, and the box.

    Velocities are rescaled so the instantaneous temperature is exactly the requested
    one (mass 1, k_B 1, 3N - 3 degrees of freedom once momentum is removed).
    """
    cells = params["cells"]
    n_atoms = 4 * cells**3
    lattice = (4.0 / params["density"]) ** (1.0 / 3.0)
    box = cells * lattice
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), axis=-1).reshape(-1, 3)
    positions = ((grid[:, None, :] + FCC_BASIS[None, :, :]) * lattice).reshape(-1, 3)

    rng = np.random.default_rng(params["seed"])
    velocities = rng.normal(0.0, np.sqrt(params["temperature"]), size=(n_atoms, 3))
    velocities -= velocities.mean(axis=0)
    current = np.sum(velocities**2) / (3 * n_atoms - 3)
    velocities *= np.sqrt(params["temperature"] / current)
    return {
        "positions": positions,
        "velocities": velocities,
        "box": np.float64(box),
        "epsilon": np.float64(params["epsilon"]),
        "sigma": np.float64(params["sigma"]),
        "seed": np.int64(params["seed"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="input file (key = value)")
    parser.add_argument("--out", type=Path, required=True, help="where to write system.npz")
    args = parser.parse_args(argv)
    try:
        params = read_input(args.input)
    except (InputError, OSError) as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 2
    system = build_system(params)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, **system)  # type: ignore[arg-type]
    n_atoms = len(system["positions"])
    print(
        f"prepared {n_atoms} atoms in a periodic box of side {float(system['box']):.3f} sigma "
        f"(density {params['density']}, T {params['temperature']}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
