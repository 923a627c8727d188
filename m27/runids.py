"""Run ids: short, sortable by time, typeable (`20261129-143012-7f3a`), and unique prefixes."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterable

from m27._exceptions import RunError
from m27.units import listed, quoted

__all__ = ["RunIdError", "from_flow_run", "new_run_id", "resolve"]


class RunIdError(RunError):
    """A run id or prefix names no run, or several: the user's input, so ``m27`` exits 2.

    Context: ``run_id`` (what was typed) and ``matches`` (the run ids it could mean).
    """

    #: the command-line exit status for this error (2: bad input), read by m27.cli.main
    exit_code = 2


#: How many of the runs an ambiguous prefix matches its error lists.
SHOWN_MATCHES = 20


def new_run_id(now: float | None = None) -> str:
    """A new id: local time of submission plus 16 random bits."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


def from_flow_run(flow_run_id: str) -> str:
    """The run id of a flow run started by Prefect (a deployment), stable for that flow run.

    Prefect's flow-run ids are UUIDv7: their first 12 hex digits are a millisecond
    timestamp, shared by runs a schedule creates together, so the id takes the random
    tail instead."""
    return f"pf-{uuid.UUID(flow_run_id).hex[-12:]}"


def resolve(prefix: str, known: Iterable[str]) -> str:
    """The one known run id equal to or starting with `prefix`; `last` means the newest.

    `known` is in submission order (as the log has them)."""
    ids = list(known)
    if prefix == "last":
        if not ids:
            raise RunIdError("no runs recorded yet", run_id=prefix, matches=[])
        return ids[-1]
    if prefix in ids:
        return prefix
    matches = [i for i in ids if i.startswith(prefix)] if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        message = f"no run matches {quoted(prefix)} (see `m27 runs`)"
        raise RunIdError(message, run_id=prefix, matches=[])
    # every match, so the user can pick one (a long list is cut, saying how many are left)
    shown = listed(matches, SHOWN_MATCHES)
    raise RunIdError(
        f"{quoted(prefix)} matches {len(matches)} runs: {shown}; type more of the id",
        run_id=prefix,
        matches=matches,
    )
