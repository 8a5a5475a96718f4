"""ListNodes pages through the core and the API's conversion, no gRPC.

``--nodes`` 8-GPU nodes are enrolled and brought to ready through the core's
own steps on a real ``SqlStore`` (SQLite in a temporary directory; the
``tests/core`` fakes play the BMCs and the agents, as in
``allocation_core.py``), and every ``--share``-th node gets an 8-GPU health
report (a tenth by default, as in ``fleet_scale.py``'s compressed runs:
2,500 agents among 25,000 nodes). Then the whole fleet is read in pages of ``--page-size``, as the
servicer answers ``ListNodes``: ``Fleet.list_nodes_page``, then the
response message, serialized as gRPC would send it. Two ways in the same
run:

- field by field (the code before ``NodeWire``): ``convert.node_pb`` for
  each node, the reports' wire form kept by version (``HealthWire``);
- ``convert.NodeWire`` (as the servicer does now): each node's message kept
  in wire form while the node stays the same.

Each is timed over the whole fleet twice: right after every reporting node
got a new report (each of those reports converted again), and with nothing
changed since the last listing. Printed: milliseconds of CPU a page (this
process is the event loop a page holds up), and the ratio.

    python bench/node_pages.py [--nodes 5000] [--share 10] [--page-size 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "proto"), str(ROOT / "tests" / "core"), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from core_fakes import FakeBmc  # noqa: E402
from core_fleet import ready_nodes  # noqa: E402

from controller.api import convert  # noqa: E402
from controller.core.fleet import Fleet  # noqa: E402
from controller.core.health import GpuHealth, HealthReport  # noqa: E402
from controller.core.model import NodeInfo  # noqa: E402
from controller.core.paging import NodeFilter  # noqa: E402
from controller.store.engine import default_sqlite_url, open_engine  # noqa: E402
from controller.store.sql_store import SqlStore  # noqa: E402
from kiln.v1 import fleet_pb2  # noqa: E402

Build = Callable[[list[NodeInfo], str], fleet_pb2.ListNodesResponse]


def report(at: float, node: int) -> HealthReport:
    """An 8-GPU H200 report with the readings a healthy node sends."""
    return HealthReport(
        sampled_at=at,
        gpus=tuple(
            GpuHealth(
                index=g,
                uuid=f"GPU-{node:05d}-{g}",
                temp_c=41.0 + g,
                mem_temp_c=48.0,
                slowdown_c=87.0,
                shutdown_c=92.0,
                gpu_max_c=85.0,
                power_w=612.5,
                power_limit_w=700.0,
                sm_clock_mhz=1980,
                mem_clock_mhz=3201,
                remap_correctable=0,
                remap_uncorrectable=0,
                remap_pending=False,
                remap_failure=False,
                fabric_state=3,
                fabric_healthy=True,
                clique="0",
            )
            for g in range(8)
        ),
        bmc_temps_c=(31.0, 33.5),
    )


def field_by_field() -> Build:
    wire = convert.HealthWire()

    def build(nodes: list[NodeInfo], token: str) -> fleet_pb2.ListNodesResponse:
        return fleet_pb2.ListNodesResponse(
            nodes=[convert.node_pb(n, wire) for n in nodes], next_page_token=token
        )

    return build


def kept_wire() -> Build:
    return convert.NodeWire().page_pb


async def settled(fleet: Fleet) -> None:
    """Let what the reports set going (the gate's listeners, a scheduling
    pass, a write-behind flush) finish outside the timed listing."""
    await asyncio.sleep(0.2)
    await fleet.live.flush()
    await fleet.lifecycle.settle()


async def listing(fleet: Fleet, build: Build, page_size: int) -> tuple[float, int, int]:
    """CPU seconds to read the whole fleet in pages; pages; bytes."""
    token, pages, size = "", 0, 0
    started = time.process_time()
    while True:
        page = await fleet.list_nodes_page(NodeFilter(), page_size=page_size, page_token=token)
        size += len(build(list(page.items), page.next_token).SerializeToString())
        pages += 1
        token = page.next_token
        if not token:
            return time.process_time() - started, pages, size


async def one_round(args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-node-pages-") as tmp:
        store = SqlStore(open_engine(default_sqlite_url(Path(tmp))))
        fleet = Fleet(store, FakeBmc())
        try:
            async with contextlib.AsyncExitStack() as stack:
                names = await ready_nodes(fleet, stack, args.nodes)
                await fleet.start()
                await fleet.lifecycle.settle()
                reporting = names[:: args.share]
                for way, make in (("field by field", field_by_field), ("NodeWire", kept_wire)):
                    build = make()
                    await listing(fleet, build, args.page_size)  # what each keeps, built once
                    for case in ("new reports", "unchanged"):
                        if case == "new reports":
                            now = time.time()
                            for i, name in enumerate(reporting):
                                await fleet.agent_health(name, report(now, i))
                            await settled(fleet)
                        cpu, pages, size = await listing(fleet, build, args.page_size)
                        figures[f"{way}, {case}"] = cpu / pages * 1000
                        figures["page KiB"] = size / pages / 1024
                await fleet.stop()
        finally:
            store.close()
    return figures


async def amain(args: argparse.Namespace) -> None:
    print(
        f"ListNodes pages through the core and the conversion (no gRPC): {args.nodes} nodes "
        f"of 8 GPUs, a report on every {args.share}th, pages of {args.page_size}, "
        f"{args.rounds} rounds",
        flush=True,
    )
    rounds = []
    for _ in range(args.rounds):
        figures = await one_round(args)
        print(
            "  "
            + "; ".join(f"{k} {v:.1f} ms a page" for k, v in figures.items() if k != "page KiB")
            + f" ({figures['page KiB']:.0f} KiB a page)",
            flush=True,
        )
        rounds.append(figures)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    parts = []
    for case in ("new reports", "unchanged"):
        before, now = median(f"field by field, {case}"), median(f"NodeWire, {case}")
        parts.append(f"{case}: {now:.1f} ms against {before:.1f} ms ({before / now:.1f}x)")
    print(
        f"node_pages: CPU a page of {args.page_size} (medians), NodeWire against field by "
        "field: " + "; ".join(parts)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--share", type=int, default=10, help="a report on every Nth node")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
