"""The garbage collector's pause over the fleet's latest health reports.

The controller keeps each node's latest report in memory (``LiveHealth``),
as typed values: per 8-GPU report a ``HealthSample``, a ``HealthReport``,
its tuple of GPUs and eight ``GpuHealth`` objects, all of which the cyclic
garbage collector tracks. A report lives until its node's next one, so at
a real fleet's pace (25,000 agents every 10 s) every young collection finds
up to the whole fleet's reports alive and walks them, and CPython's
collector stops the process while it does. ``fleet_scale.py`` compresses
time (N/10 agents at 1 s), so its controller holds a tenth of those
reports, and its pauses are a tenth of this.

This builds the reports as the controller does (each decoded from the
fake NVML's 8x H200 message and converted by ``convert.health_from_pb``,
then ``LiveHealth.note``), with what existed before frozen as the
controller freezes its heap at start, and times:

- a young collection with ``--nodes`` reports young (the worst case: every
  report replaced since the last collection), and the middle collection
  they are then moved to;
- the floor, in the same run: the same reports held as their wire bytes,
  which the collector does not track.

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
from controller.core.live import LiveHealth  # noqa: E402
from controller.store.sql_store import SqlStore  # noqa: E402
from kiln.v1 import agent_pb2  # noqa: E402


def _timed(collect: Callable[[], Any]) -> float:
    began = time.perf_counter()
    collect()
    return time.perf_counter() - began


def one_round(nodes: int, raw: bytes, store: SqlStore) -> dict[str, float]:
    """Pauses (seconds) and tracked objects per report, typed and as bytes."""
    figures: dict[str, float] = {}
    gc.collect()
    gc.freeze()  # what existed before: out of sight, as the controller's settle()
    try:
        live = LiveHealth(store)
        before = len(gc.get_objects(0))
        for i in range(nodes):
            message = agent_pb2.AgentMessage.FromString(raw)
            live.note(f"node-{i:05d}", health_from_pb(message.health), 0.0)
            del message
        figures["tracked_per_report"] = (len(gc.get_objects(0)) - before) / nodes
        figures["young"] = _timed(lambda: gc.collect(0))
        figures["middle"] = _timed(lambda: gc.collect(1))
        del live
        gc.collect()
        held: dict[str, bytes] = {}
        for i in range(nodes):
            message = agent_pb2.AgentMessage.FromString(raw)
            held[f"node-{i:05d}"] = message.health.SerializeToString()
        figures["floor_young"] = _timed(lambda: gc.collect(0))
        figures["floor_middle"] = _timed(lambda: gc.collect(1))
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
        f"held as LiveHealth holds it; {args.rounds} rounds, medians; Python "
        f"{sys.version.split()[0]}"
    )
    summary = []
    for nodes in sizes:
        rounds = [one_round(nodes, raw, store) for _ in range(args.rounds)]

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        young, middle = med("young") * 1e3, med("middle") * 1e3
        floor = max(med("floor_young"), med("floor_middle")) * 1e3
        print(
            f"  N={nodes}: {med('tracked_per_report'):.1f} tracked objects a report; a young "
            f"collection with them all young {young:.1f} ms, then the middle one {middle:.1f} ms; "
            f"floor (the same reports as bytes) {floor:.2f} ms"
        )
        summary.append(f"N={nodes} young {young:.1f} ms, middle {middle:.1f} ms")
    print("SUMMARY: collector pause over the fleet's latest reports: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
