"""`make bench`: run every benchmarks/bench_*.py in turn, each in its own interpreter.

Each benchmark prints its own table of ratios against a baseline measured in the same run
(figures recorded in benchmarks/README.md). Pass names to run only some:
`python benchmarks/run_all.py checkpoint agent`; extra flags after `--` go to each script
(e.g. `-- --quick`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    scripts = sorted(HERE.glob("bench_*.py"))
    known = [s.stem.removeprefix("bench_") for s in scripts]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=f"benchmarks: {', '.join(known)}"
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="run only these benchmarks")
    names = parser.parse_args(argv).names
    if unknown := [n for n in names if n not in known]:
        # a name that matched nothing ran nothing and exited 0
        parser.error(f"no benchmark {', '.join(unknown)} (there are: {', '.join(known)})")
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(script), *extra], cwd=HERE.parent)
        print(f"--- {script.name}: exit {code} in {time.monotonic() - started:.0f}s", flush=True)
        if code:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
