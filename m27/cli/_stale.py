"""Whether the m27 code a long-lived process imported has changed on disk since.

The warm runner imports m27 and the flow once and forks every run from that image. After
`pip install -U m27`, or an edit of a development checkout, it would go on running the old
code for every run until the node service restarts (up to `service_idle`, 30 min): a fix
that is installed but does not act. The runner therefore stamps the files of the m27
modules it imported and checks them (a `stat` each, ~0.3 ms for ~200 files) before it
takes a run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: A module file -> (mtime_ns, size) when it was imported.
Stamps = dict[str, tuple[int, int]]


def code_stamps(packages: tuple[str, ...] = ("m27", "flows")) -> Stamps:
    """The stamps of every imported module of `packages` that comes from a file."""
    roots = []
    for name in packages:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file:
            roots.append(str(Path(file).parent) + os.sep)
    if not roots:
        return {}
    prefixes = tuple(roots)
    stamps: Stamps = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(prefixes):
            try:
                st = os.stat(file)
            except OSError:
                continue
            stamps[file] = (st.st_mtime_ns, st.st_size)
    return stamps


def first_changed(stamps: Stamps) -> str | None:
    """A file of `stamps` that changed or went away since it was stamped, or None."""
    for file, (mtime_ns, size) in stamps.items():
        try:
            st = os.stat(file)
        except OSError:
            return file
        if (st.st_mtime_ns, st.st_size) != (mtime_ns, size):
            return file
    return None
