"""Show simulation results: a text table, JSON, and an HTML page with a GPU timeline per
policy (inline SVG, no plotting library needed)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from m27 import tables
from m27.sim.engine import SimResult
from m27.sim.metrics import Metrics
from m27.units import format_duration

_COLORS = {"immediate": "#2b6cb0", "guest": "#38a169", "background": "#d69e2e"}


def _h(seconds: float) -> str:
    """Hours for a lab's week (`74.3h`); below an hour the unit that shows the value (a
    replayed event log of short steps read `0.0h/0.0h`)."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return format_duration(seconds)


def table(metrics: Sequence[Metrics]) -> str:
    """One row per policy; JCT columns per priority class present in any run."""
    classes = sorted({k for m in metrics for k in m.jct})
    head = ["policy", "busy %", "idle-q %", "makespan", "done/total"]
    head += [f"JCT {k} mean/p95" for k in classes]
    rows = []
    for m in metrics:
        row = [
            m.policy,
            f"{m.busy_pct:.1f}",
            f"{m.idle_queued_pct:.1f}",
            _h(m.makespan_s),
            f"{m.jobs_done}/{m.jobs_total}",
        ]
        for k in classes:
            j = m.jct.get(k)
            row.append(f"{_h(j['mean_s'])}/{_h(j['p95_s'])}" if j else "-")
        rows.append(row)
    return tables.render(head, rows)


def _svg(result: SimResult, horizon: float, width: int = 900, lane: int = 18) -> str:
    height = lane * result.gpus + 20
    scale = width / horizon if horizon > 0 else 0.0
    parts = [f'<svg width="{width + 60}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for g, segs in enumerate(result.busy):
        y = g * lane
        parts.append(f'<text x="0" y="{y + lane - 5}" font-size="11">GPU {g}</text>')
        parts.append(
            f'<rect x="50" y="{y + 2}" width="{width}" height="{lane - 4}" fill="#edf2f7"/>'
        )
        for s, e, tier in segs:
            w = max(0.5, (e - s) * scale)
            parts.append(
                f'<rect x="{50 + s * scale:.1f}" y="{y + 2}" width="{w:.1f}" '
                f'height="{lane - 4}" fill="{_COLORS.get(tier, "#718096")}"/>'
            )
    for s, e in result.queued:
        w = max(0.5, (e - s) * scale)
        parts.append(
            f'<rect x="{50 + s * scale:.1f}" y="{height - 16}" width="{w:.1f}"'
            f' height="4" fill="#e53e3e"/>'
        )
    parts.append(
        f'<text x="50" y="{height - 2}" font-size="10">0</text>'
        f'<text x="{width + 10}" y="{height - 2}" font-size="10" text-anchor="end">'
        f"{_h(horizon)}</text></svg>"
    )
    return "".join(parts)


def html_report(results: Sequence[tuple[SimResult, Metrics]], title: str) -> str:
    horizon = max((max(r.end, m.window_s) for r, m in results), default=0.0)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        "<pre>" + html.escape(table([m for _, m in results])) + "</pre>",
        "<p>Timeline: computing as primary <b style='color:#2b6cb0'>blue</b>, as guest "
        "<b style='color:#38a169'>green</b>, background <b style='color:#d69e2e'>amber</b>; "
        "red bar: GPU work waiting.</p>",
    ]
    for r, m in results:
        body.append(
            f"<h2>{html.escape(r.policy)}: busy {m.busy_pct:.1f}%, "
            f"{m.jobs_done}/{m.jobs_total} jobs in {_h(m.window_s)}</h2>"
        )
        body.append(_svg(r, horizon))
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body style='font-family:sans-serif'>"
        + "\n".join(body)
        + "</body></html>\n"
    )
