"""The garbage collector's pause over the fleet's latest health reports.

The controller keeps each node's latest report in memory (``LiveHealth``)
until the node's next one, so at a real fleet's pace (25,000 agents every
10 s) every young collection finds up to the whole fleet's reports young.
Held as typed values (per 8-GPU report a ``HealthReport``, its tuple of
GPUs and eight ``GpuHealth`` objects, with the ``HealthSample`` around
them), each report is 13 objects the cyclic collector tracks and walks,
with the process stopped while it does. ``LiveHealth`` now holds each
report packed (``core/health.py`` ``pack_report``: bytes, which the
collector never tracks) and unpacks a typed copy where one is read.

``fleet_scale.py`` compresses time (N/10 agents at 1 s), so its controller
holds a tenth of those reports, and its pauses show a tenth of this.

This builds the reports as the controller does (each decoded from the fake
NVML's 8x H200 message and converted by ``convert.health_from_pb``), with
what existed before frozen as the controller freezes its heap at start, and
times a young collection with ``--nodes`` reports young (the worst case:
every report replaced since the last collection) and the middle collection
they are then moved to, three ways in the same run:

- typed: each report held as the typed values (how ``LiveHealth`` held
  them before), in a dict by node, as ``HealthSample``s;
- ``LiveHealth``: ``LiveHealth.note`` as the controller calls it (packed);
- the floor: the same reports held as their wire bytes.

It also times reading a held report back (``LiveHealth.health``: the
unpacking every ``GetNode`` and ``ListNodes`` node now pays) and holding
one (``LiveHealth.note``), against decoding and converting a report.

    python bench/report_gc.py [--nodes 2500,25000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "proto"), str(Path(__file__).resolve().parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fleet_load import node_messages  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from controller.api.convert import health_from_pb  # noqa: E402
from controller.core.health import HealthSample  # noqa: E402
from controller.core.live import LiveHealth  # noqa: E402
from controller.store.sql_store import SqlStore  # noqa: E402
from kiln.v1 import agent_pb2  # noqa: E402


def _timed(collect: Callable[[], Any]) -> float:
    began = time.perf_counter()
    collect()
    return time.perf_counter() - began


def _collections(figures: dict[str, float], key: str) -> None:
    figures[f"{key}_young"] = _timed(lambda: gc.collect(0))
    figures[f"{key}_middle"] = _timed(lambda: gc.collect(1))


def one_round(nodes: int, raw: bytes, store: SqlStore) -> dict[str, float]:
    """Pauses (seconds) and tracked objects per report, three ways."""
    figures: dict[str, float] = {}
    names = [f"node-{i:05d}" for i in range(nodes)]
    gc.collect()
    gc.freeze()  # what existed before: out of sight, as the controller's settle()
    try:
        before = len(gc.get_objects(0))
        typed: dict[str, HealthSample] = {}
        for name in names:
            message = agent_pb2.AgentMessage.FromString(raw)
            typed[name] = HealthSample(name, health_from_pb(message.health), 0.0)
            del message
        figures["typed_tracked"] = (len(gc.get_objects(0)) - before) / nodes
        _collections(figures, "typed")
        del typed
        gc.collect()

        live = LiveHealth(store)
        first = health_from_pb(agent_pb2.AgentMessage.FromString(raw).health)
        for name in names:  # a report before: each node's entries and history exist
            live.note(name, first, 0.0)
        gc.collect()
        before = len(gc.get_objects(0))
        began = time.perf_counter()
        for name in names:
            message = agent_pb2.AgentMessage.FromString(raw)
            live.note(name, health_from_pb(message.health), 0.0)
            del message
        figures["note_us"] = (time.perf_counter() - began) / nodes * 1e6
        figures["live_tracked"] = (len(gc.get_objects(0)) - before) / nodes
        _collections(figures, "live")
        began = time.perf_counter()
        for name in names:
            live.health(name)
        figures["read_us"] = (time.perf_counter() - began) / nodes * 1e6
        del live
        gc.collect()

        held: dict[str, bytes] = {}
        for name in names:
            message = agent_pb2.AgentMessage.FromString(raw)
            held[name] = message.health.SerializeToString()
        _collections(figures, "floor")
        began = time.perf_counter()
        for _ in names:
            health_from_pb(agent_pb2.AgentMessage.FromString(raw).health)
        figures["convert_us"] = (time.perf_counter() - began) / nodes * 1e6
        del held
    finally:
        gc.unfreeze()
        gc.collect()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2500,25000", help="reports held, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    _, report = node_messages("node-00000", 1)
    raw = report.SerializeToString()
    store = SqlStore(create_engine("sqlite://"))
    gc.disable()  # collections only where timed
    print(
        f"report_gc: the latest 8x H200 report ({len(raw)} B on the wire) of each of N nodes, "
        f"held typed, as LiveHealth holds it (packed) and as wire bytes (the floor); "
        f"{args.rounds} rounds, medians; Python {sys.version.split()[0]}"
    )
    summary = []
    for nodes in sizes:
        rounds = [one_round(nodes, raw, store) for _ in range(args.rounds)]

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        pauses = {
            way: (med(f"{way}_young") * 1e3, med(f"{way}_middle") * 1e3)
            for way in ("typed", "live", "floor")
        }
        print(
            f"  N={nodes}: typed {med('typed_tracked'):.1f} tracked objects a report, a young "
            f"collection with them all young {pauses['typed'][0]:.1f} ms, then the middle one "
            f"{pauses['typed'][1]:.1f} ms"
        )
        print(
            f"    LiveHealth (packed): {med('live_tracked'):.1f} tracked objects a report, young "
            f"{pauses['live'][0]:.2f} ms, middle {pauses['live'][1]:.2f} ms; floor (wire bytes) "
            f"young {pauses['floor'][0]:.2f} ms, middle {pauses['floor'][1]:.2f} ms"
        )
        print(
            f"    per report: decoded and converted {med('convert_us'):.1f} us; decoded, "
            f"converted and held (LiveHealth.note) {med('note_us'):.1f} us; read back "
            f"(LiveHealth.health) {med('read_us'):.1f} us"
        )
        worst_typed = max(pauses["typed"])
        worst_live = max(pauses["live"])
        summary.append(
            f"N={nodes} {worst_live:.2f} ms held packed against {worst_typed:.1f} ms typed "
            f"({worst_typed / max(worst_live, 1e-3):.0f}x; floor {max(pauses['floor']):.2f} ms)"
        )
    print("SUMMARY: worst collector pause over the fleet's latest reports: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
