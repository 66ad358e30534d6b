"""Charts of the trail, drawn here as SVG: no chart library, no CDN, so the page works offline.

    GET /toolkeeper/audit/charts?range=24h      calls over time by status, denials by rule, top tools,
                                                and how long each approval waited

The aggregates are SQL over the index of calls (audit/calls.py); each data
point is one SVG element (a `circle` of a line or scatter, a `rect` of a bar),
labelled with its value in a `title`, so a chart can be read and counted.
"""

from __future__ import annotations

import asyncio
import time
from html import escape

from aiohttp import web

from toolkeeper.audit import SQLAudit
from toolkeeper.wire.admin.console.layout import link, page, show, when

# a range's length in seconds, and how many points a line has
RANGES = {"1h": (3600, 60), "24h": (86400, 24), "7d": (604800, 28), "30d": (2592000, 30)}
COLOURS = {"ok": "#1a7f37", "failed": "#cf222e", "timeout": "#bc4c00", "denied": "#9a6700", "invalid": "#8250df",
           "forwarded": "#0969da", "deferred": "#54aeff", "running": "#57606a"}
WIDTH, HEIGHT, PAD = 460, 220, 36


def _frame(title: str, inner: str, chart: str) -> str:
    return (f"<figure><figcaption>{escape(title)}</figcaption><svg class='chart {chart}' role=img "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' width={WIDTH} height={HEIGHT}>"
            f"<line x1={PAD} y1={HEIGHT - PAD} x2={WIDTH - 8} y2={HEIGHT - PAD} stroke='#c9d1d9'/>{inner}"
            "</svg></figure>")


def line_chart(series: dict[str, list[int]], start: float, step: float) -> str:
    """One line per status across the buckets; a circle per bucket."""
    buckets = max((len(v) for v in series.values()), default=0)
    top = max((max(v) for v in series.values() if v), default=0) or 1
    x = lambda i: PAD + (WIDTH - PAD - 12) * (i / max(buckets - 1, 1))  # noqa: E731
    y = lambda n: HEIGHT - PAD - (HEIGHT - 2 * PAD) * n / top  # noqa: E731
    parts = [f"<text x=4 y={PAD}>{top}</text><text x={PAD} y={HEIGHT - 14}>{escape(when(start))}</text>"]
    for status, counts in sorted(series.items()):
        colour = COLOURS.get(status, "#57606a")
        points = " ".join(f"{x(i):.1f},{y(n):.1f}" for i, n in enumerate(counts))
        parts.append(f"<polyline fill=none stroke='{colour}' stroke-width=1.5 points='{points}'/>")
        parts += [f"<circle class=point data-status='{show(status)}' cx={x(i):.1f} cy={y(n):.1f} r=2.5 "
                  f"fill='{colour}'><title>{show(status)}: {n} from {escape(when(start + i * step))}</title></circle>"
                  for i, n in enumerate(counts)]
    legend = " ".join(f"<tspan fill='{COLOURS.get(s, '#57606a')}'>● {show(s)}</tspan>" for s in sorted(series))
    parts.append(f"<text x={PAD + 160} y={HEIGHT - 14}>{legend}</text>")
    return _frame("Calls over time, by status", "".join(parts), "calls")


def bar_chart(title: str, rows: list[tuple[str, int]], chart: str) -> str:
    """Horizontal bars, one per label, longest first."""
    if not rows:
        return _frame(title, f"<text x={PAD} y={HEIGHT / 2}>nothing in this range</text>", chart)
    top = max(count for _, count in rows) or 1
    band = (HEIGHT - PAD) / len(rows)
    parts = [f"<rect class=bar x=150 y={4 + i * band:.1f} width={(WIDTH - 200) * count / top:.1f} "
             f"height={band * 0.7:.1f} fill='#0969da'><title>{show(label)}: {count}</title></rect>"
             f"<text x=4 y={4 + i * band + band * 0.5:.1f}>{show(label[:24])}</text>"
             f"<text x={154 + (WIDTH - 200) * count / top:.1f} y={4 + i * band + band * 0.5:.1f}>{count}</text>"
             for i, (label, count) in enumerate(rows)]
    return _frame(title, "".join(parts), chart)


def scatter(points: list[tuple[float, float]], since: float, until: float) -> str:
    """Each answered approval: when it was asked (x) and how long it waited (y)."""
    if not points:
        return _frame("Approval wait, ask to answer", f"<text x={PAD} y={HEIGHT / 2}>no approvals in this "
                      "range</text>", "waits")
    top = max(ms for _, ms in points) or 1
    x = lambda t: PAD + (WIDTH - PAD - 12) * (t - since) / max(until - since, 1)  # noqa: E731
    y = lambda ms: HEIGHT - PAD - (HEIGHT - 2 * PAD) * ms / top  # noqa: E731
    parts = [f"<text x=4 y={PAD}>{top / 1000:.1f} s</text>"]
    parts += [f"<circle class=point cx={x(t):.1f} cy={y(ms):.1f} r=3 fill='#8250df'><title>{ms / 1000:.1f} s, "
              f"asked {escape(when(t))}</title></circle>" for t, ms in points]
    return _frame("Approval wait, ask to answer", "".join(parts), "waits")


class ChartsPage:
    def __init__(self, audit: SQLAudit):
        self.audit = audit

    def __call__(self, app: web.Application) -> None:
        app.router.add_get("/audit/charts", self.charts)

    async def charts(self, request: web.Request) -> web.Response:
        chosen = request.query.get("range") if request.query.get("range") in RANGES else "24h"
        seconds, buckets = RANGES[chosen]
        until = time.time()
        since = until - seconds
        data = await asyncio.to_thread(self.audit.charts, since, until, buckets)
        series: dict[str, list[int]] = {}
        for bucket, status, count in data["calls"]:
            if 0 <= bucket < buckets:
                series.setdefault(status, [0] * buckets)[bucket] += count
        picks = " ".join(f"<a href='{link('/audit/charts', {'range': name})}'>"
                         f"{'<b>' + name + '</b>' if name == chosen else name}</a>" for name in RANGES)
        body = (f"<p>Range: {picks} · {escape(when(since))} to {escape(when(until))}</p><div class=charts>"
                f"{line_chart(series, since, seconds / buckets)}"
                f"{bar_chart('Denials, by rule', [(str(r), n) for r, n in data['denials']], 'denials')}"
                f"{bar_chart('Top tools', [(str(t), n) for t, n in data['tools']], 'tools')}"
                f"{scatter([(t, ms) for t, ms in data['waits']], since, until)}</div>")
        return page(request, "Charts", body)
