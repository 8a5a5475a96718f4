"""The dashboard's HTML, rendered on the server from the core's values.

Pure functions: values in, escaped HTML out (``html.escape`` on every value
that came from outside). The page polls its fragments (``/fragments/…``)
and listens to the event stream, so a change shows without a reload; with
JavaScript off, each page is still whole and current when loaded.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from html import escape

from controller.core.live import hottest_c
from controller.core.model import AllocationInfo, EventInfo, NodeInfo
from controller.core.states import AllocationState

COOL_BELOW_C = 70.0  # a tray is "cool" below this hottest-GPU temperature
HOT_FROM_C = 85.0  # and "hot" from this one; "warm" between


def heat_of(node: NodeInfo) -> tuple[str, float | None]:
    """The tray's heat class (cool, warm, hot; unknown without a reading) and
    its hottest GPU's temperature."""
    hottest = hottest_c(node.health) if node.health is not None else None
    if hottest is None:
        return "unknown", None
    if hottest >= HOT_FROM_C:
        return "hot", hottest
    return ("warm" if hottest >= COOL_BELOW_C else "cool"), hottest


def shown_state(node: NodeInfo) -> str:
    """The state word the CLI shows, with "drained" when an operator drained it."""
    return f"{node.state.value} (drained)" if node.drained else node.state.value


def page(title: str, body: str, *, refresh: Sequence[str] = ()) -> str:
    """A whole page; ``refresh`` names the fragments the script keeps current."""
    targets = " ".join(escape(r) for r in refresh)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · Kiln</title>
<link rel="stylesheet" href="/static/dashboard.css">
</head><body data-refresh="{targets}">
<header><a class="brand" href="/">Kiln</a>
<nav><a href="/">Racks</a><a href="/allocations">Allocations</a><a href="/events">Events</a></nav>
</header>
<main>{body}</main>
<script src="/static/dashboard.js"></script>
</body></html>"""


def racks_fragment(nodes: Iterable[NodeInfo]) -> str:
    """Every rack as a grid of its trays, coloured by state and heat."""
    by_rack: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in nodes:
        by_rack[n.rack or n.name].append(n)
    if not by_rack:
        return '<p class="empty">No nodes enrolled yet (<code>kiln nodes enroll</code>).</p>'
    parts = []
    for rack, members in sorted(by_rack.items()):
        ready = sum(1 for n in members if n.schedulable)
        cells = "".join(_tray(n) for n in members)
        parts.append(
            f'<section class="rack" data-rack="{escape(rack)}"><h2>{escape(rack)} '
            f"<small>{len(members)} nodes, {ready} free</small></h2>"
            f'<div class="trays">{cells}</div></section>'
        )
    return "".join(parts)


def _tray(n: NodeInfo) -> str:
    heat, hottest = heat_of(n)
    temp = f"{hottest:.0f} °C" if hottest is not None else "no reading"
    alloc = f" · {escape(n.allocation)}" if n.allocation else ""
    label = f"{n.name}: {shown_state(n)}, hottest GPU {temp}"
    return (
        f'<a class="tray state-{escape(n.state.value)} heat-{heat}'
        f'{" drained" if n.drained else ""}" href="/nodes/{escape(n.name)}" '
        f'data-node="{escape(n.name)}" data-state="{escape(n.state.value)}" '
        f'data-heat="{heat}" title="{escape(label)}">'
        f'<span class="name">{escape(n.name)}</span>'
        f'<span class="state">{escape(shown_state(n))}</span>'
        f'<span class="temp">{escape(temp)}{alloc}</span></a>'
    )


def summary_fragment(nodes: Sequence[NodeInfo], allocations: Sequence[AllocationInfo]) -> str:
    states: dict[str, int] = defaultdict(int)
    for n in nodes:
        states[n.state.value] += 1
    counts = " ".join(
        f'<span class="count state-{escape(s)}">{escape(s)} {c}</span>'
        for s, c in sorted(states.items())
    )
    pending = sum(1 for a in allocations if a.state == AllocationState.PENDING)
    return (
        f'<p class="summary">{len(nodes)} nodes: {counts} · '
        f"{len(allocations)} open allocations, {pending} pending</p>"
    )


def allocations_fragment(allocations: Sequence[AllocationInfo], now: float | None = None) -> str:
    """Pending allocations with why they wait; admitted ones with their domains."""
    now = time.time() if now is None else now
    if not allocations:
        return '<p class="empty">No open allocations.</p>'
    rows = []
    for a in allocations:
        waited = _age(now - a.created_at)
        where = ", ".join(a.domains) or "-"
        nodes = ", ".join(a.nodes) or "-"
        rows.append(
            f'<tr data-allocation="{escape(a.id)}" data-state="{escape(a.state.value)}">'
            f"<td>{escape(a.id)}</td><td>{escape(a.state.value)}</td>"
            f"<td>{escape(a.spec.queue or 'default')}</td><td>{waited}</td>"
            f"<td>{escape(nodes)}</td><td>{escape(where)}</td><td>{escape(a.reason)}</td></tr>"
        )
    return (
        '<table class="allocations"><thead><tr><th>id</th><th>state</th><th>queue</th>'
        "<th>age</th><th>nodes</th><th>NVLink domains</th><th>reason</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def events_fragment(events: Sequence[EventInfo]) -> str:
    rows = "".join(_event_row(e) for e in reversed(events))
    return f'<table class="events"><tbody id="event-rows">{rows}</tbody></table>'


def _event_row(e: EventInfo) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(e.at))
    return (
        f'<tr data-seq="{e.seq}"><td>{at}</td><td>{escape(e.kind)}</td>'
        f"<td>{escape(e.node or e.allocation)}</td><td>{escape(e.reason)}</td></tr>"
    )


def node_page(
    n: NodeInfo, history: Sequence[tuple[float, float]], events: Sequence[EventInfo]
) -> str:
    heat, hottest = heat_of(n)
    gpus = {g.index: g for g in n.gpus}
    readings = {g.index: g for g in n.health.gpus} if n.health is not None else {}
    rows = []
    for index in sorted(set(gpus) | set(readings)):
        g, r = gpus.get(index), readings.get(index)
        temp = f"{r.temp_c:.0f}" if r is not None and r.temp_c is not None else "-"
        power = f"{r.power_w:.0f}" if r is not None and r.power_w is not None else "-"
        rows.append(
            f"<tr><td>{index}</td><td>{escape(g.model if g else '-')}</td>"
            f"<td>{temp}</td><td>{power}</td>"
            f"<td>{r.ecc_dbe_volatile if r else '-'}</td>"
            f"<td>{escape(','.join(str(x) for x in r.xids)) if r and r.xids else '-'}</td></tr>"
        )
    temp = f"{hottest:.0f} °C" if hottest is not None else "no reading"
    body = f"""<h1>{escape(n.name)}</h1>
<dl class="facts" data-node="{escape(n.name)}" data-state="{escape(n.state.value)}">
<dt>state</dt><dd class="state-{escape(n.state.value)}">{escape(shown_state(n))}</dd>
<dt>reason</dt><dd>{escape(n.state_reason or "-")}</dd>
<dt>rack</dt><dd>{escape(n.rack or "-")}</dd>
<dt>allocation</dt><dd>{escape(n.allocation or "-")}</dd>
<dt>power</dt><dd>{escape(n.power.value)} (BMC {escape(n.bmc_health)})</dd>
<dt>agent</dt><dd>{"connected" if n.agent_connected else "not connected"}</dd>
<dt>hottest GPU</dt><dd class="heat-{heat}">{escape(temp)}</dd>
</dl>
<h2>Hottest GPU, recent samples</h2>{sparkline(history)}
<h2>GPUs</h2>
<table class="gpus"><thead><tr><th>GPU</th><th>model</th><th>°C</th><th>W</th>
<th>ECC DBE</th><th>XIDs</th></tr></thead><tbody>{"".join(rows)}</tbody></table>
<h2>Checks</h2><p class="empty">No checks have run on this node.</p>
<h2>Events</h2>{events_fragment(events)}"""
    return page(n.name, body)


def sparkline(points: Sequence[tuple[float, float]], width: int = 320, height: int = 60) -> str:
    """An inline SVG line of the points' values (no script, no library)."""
    if len(points) < 2:
        return '<p class="empty">Not enough samples yet.</p>'
    values = [v for _, v in points]
    low, high = min(values) - 1.0, max(values) + 1.0
    step = width / (len(values) - 1)
    coords = " ".join(
        f"{i * step:.1f},{height - (v - low) / (high - low) * height:.1f}"
        for i, v in enumerate(values)
    )
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="hottest GPU {values[-1]:.0f} °C now, '
        f'{min(values):.0f}-{max(values):.0f} °C recently">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="2" points="{coords}"/></svg>'
    )


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
