"""Benchmark: how late the event loop runs during a pass of BMC reads, begun
all at once or spread over the pass (``controller/core/spread.py``).

``--bmcs`` answering Redfish BMCs (default 400: about what a 5 s leak
watcher pass asks of a 25,000-node fleet of air-cooled boxes in its first
rediscovery wave), served by the benchmark's stand-in responder in a
process of its own (``bench/fleet_load.py``: the service root and
``Systems/<id>``, every connection closed after its answer, as sushy asks).
Each pass reads every BMC's power once through the power sync's production
path (``PoolGateway.poll_power`` over a ``BmcPool`` with the controller's
defaults: 256 Redfish threads, the adaptive thread share), 256 at once:

1. **burst**: every read begun as soon as a slot is free (``spread`` 0, as
   before);
2. **spread** (production): the first 32 at once, the rest evenly over 80 %
   of ``--span`` (the leak watcher's share; power sync spreads over half).

A pass begins every ``--span`` seconds (5, the leak interval) in both
modes, so the timer's ticks cover the same time.

A warm-up pass sets up every BMC's session first. The process's collector
is set as ``kiln-controller`` sets it (``controller/heap.py``). A 10 ms timer
on the same loop stands in for everything else the loop serves (agent
reports, API calls): its lateness is printed (p50, p99, max), with CPU per
read and the pass's wall time, and the ratio of the p99s. About a minute
on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

from bmc_loop_share import cpu_seconds, pct  # noqa: E402
from fleet_load import responder_on_free_port  # noqa: E402

from controller import heap  # noqa: E402
from controller.bmc.gateway import PoolGateway  # noqa: E402
from controller.bmc.pool import BmcPool  # noqa: E402
from controller.core.leaks import DEFAULT_LEAK_SPREAD as SPREAD  # noqa: E402
from controller.core.model import BmcTarget  # noqa: E402


async def passes(
    gateway: PoolGateway, targets: list[BmcTarget], count: int, span: float, spread: float
) -> tuple[list[float], float, float, int]:
    """``count`` passes, one every ``span`` seconds, their reads spread over
    ``spread`` of it: the loop's lateness, wall s per pass, CPU s per read
    (the timer's included, the same in both modes), reads failed."""
    lateness: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            lateness.append(max(0.0, loop.time() - before - 0.01))

    ticker = asyncio.create_task(tick())
    failed = 0
    busy = 0.0
    cpu0 = cpu_seconds()
    for _ in range(count):
        began = time.monotonic()
        polled = await gateway.poll_power(targets, 256, spread=span * spread)
        failed += sum(1 for state, _ in polled.values() if state is None)
        busy += time.monotonic() - began
        # One pass per ``span`` either way, as a periodic pass runs: the
        # ticks are then over the same time in both modes.
        await asyncio.sleep(max(0.0, began + span - time.monotonic()))
    cpu = cpu_seconds() - cpu0
    done.set()
    await ticker
    return lateness, busy / count, cpu / (count * len(targets)), failed


def describe(name: str, lateness: list[float], wall: float, cpu: float, failed: int) -> str:
    return (
        f"  {name}: a pass {wall:.2f} s, {cpu * 1e3:.2f} ms CPU a read, {failed} reads failed; "
        f"loop late p50 {pct(lateness, 0.5) * 1e3:.1f} ms, p99 {pct(lateness, 0.99) * 1e3:.1f} "
        f"ms, max {max(lateness, default=0) * 1e3:.0f} ms ({len(lateness)} ticks)"
    )


async def run(port: int, bmcs: int, count: int, span: float) -> int:
    targets = [
        BmcTarget(
            node=f"node-{i:05d}",
            url=f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/node-{i:05d}",
            username="kiln",
            password="not-a-secret",
        )
        for i in range(bmcs)
    ]
    gateway = PoolGateway(BmcPool())
    try:
        await gateway.poll_power(targets, 256)  # warm-up: every BMC's session set up
        burst = await passes(gateway, targets, count, span, 0.0)
        print(describe("burst (all at once)", *burst))
        spread = await passes(gateway, targets, count, span, SPREAD)
        print(describe(f"spread (32 at once, the rest over {span * SPREAD:g} s)", *spread))
    finally:
        await gateway.close()
    b99, s99 = pct(burst[0], 0.99), pct(spread[0], 0.99)
    print(
        f"SUMMARY: {bmcs} BMC reads a pass, loop lateness p99 {s99 * 1e3:.1f} ms spread vs "
        f"{b99 * 1e3:.1f} ms at once ({b99 / max(s99, 1e-6):.1f}x less late); max "
        f"{max(spread[0]) * 1e3:.0f} vs {max(burst[0]) * 1e3:.0f} ms; CPU per read "
        f"{spread[2] * 1e3:.2f} vs {burst[2] * 1e3:.2f} ms"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bmcs", type=int, default=400)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument(
        "--span", type=float, default=5.0, help="seconds between passes (the leak interval's 5)"
    )
    args = parser.parse_args()
    heap.settle()  # the collector set as kiln-controller sets it once serving
    print(
        f"bmc_pass_spread: {args.bmcs} answering Redfish BMCs (the fleet_load stand-in), "
        f"{args.passes} passes each way through PoolGateway.poll_power, 256 at once"
    )
    with responder_on_free_port() as port:
        return asyncio.run(run(port, args.bmcs, args.passes, args.span))


if __name__ == "__main__":
    sys.exit(main())
