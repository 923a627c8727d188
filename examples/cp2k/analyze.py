"""Energy conservation and temperature of the CP2K water run, from its water-1.ener.

Columns of a CP2K .ener file: step, time [fs], kinetic [a.u.], temperature [K],
potential [a.u.], conserved quantity [a.u.], CPU time per step [s]. In NVE the conserved
quantity should stay flat: its drift says whether the dynamics (and every resume) held.
Each step appears once, resumes included (m27 cuts what the killed attempt wrote after the
restored restart file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    rows = [
        [float(x) for x in line.split()]
        for line in Path(path).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    steps = [int(r[0]) for r in rows]
    if steps != list(range(steps[0], steps[0] + len(steps))):
        sys.exit(f"{path}: steps are not consecutive once each: {steps[:5]} ... {steps[-5:]}")
    conserved = [r[5] for r in rows]
    temps = [r[3] for r in rows]
    drift = (conserved[-1] - conserved[0]) / abs(conserved[0])
    summary = {
        "steps": steps[-1],
        "mean_temperature_K": round(sum(temps) / len(temps), 1),
        "relative_drift": drift,
    }
    print(
        f"{steps[-1]} steps, mean temperature {summary['mean_temperature_K']} K, "
        f"conserved-quantity drift {drift:.2e} (relative)"
    )
    Path("summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "water-1.ener")
