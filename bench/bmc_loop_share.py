"""Benchmark: how late the event loop runs while BMC threads burn the interpreter.

``--bmcs`` dead Redfish BMCs (default 3,000), each at its own loopback
address (127.1.x.y) on a port nothing listens on, so every connection is
refused at once: the case where BMC calls cost CPU rather than waiting (a
BMC network down, seen from a controller restarted onto it). Each gets one
leak detector read through Kiln's production BMC path
(``controller.bmc.gateway.PoolGateway`` over a ``BmcPool`` with the
controller's defaults: 256 Redfish threads, 3 attempts, per-BMC breakers),
``--concurrency`` at once (256, the leak watcher's default).

The process's collector is set as ``kiln-controller`` sets it once serving
(``controller/heap.py``): with CPython's defaults, full collections over
the threads' frames and tracebacks stop the loop for 150-450 ms each,
several times a second, and hide what is measured here.

Meanwhile a 10 ms timer on the same event loop measures how late the loop
runs: it stands in for everything else the loop serves (API calls, agent
reports), which waits that long for its turn.

Two runs in one process, the same BMCs at new addresses each time:

1. **adaptive** (production): the pool lets only as many threads run as keep
   its results reaching the loop on time (``controller/bmc/loop_share.py``);
2. **fixed**: the limit pinned at the pool's 256 threads, as before.

Printed for each: wall time, CPU per read, the loop's lateness p50/p99/max
(all of it, and after the first 2 s, once the limit has been found) and the
pool's limit at the end; then the ratio of the p99s and a summary
line. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controller import heap
from controller.bmc.gateway import PoolGateway
from controller.bmc.pool import BmcPool
from controller.core.errors import KilnError
from controller.core.model import BmcTarget


@dataclass
class Outcome:
    wall: float
    cpu: float
    lateness: list[float]
    settled: list[float]  # lateness after the first 2 s (the limit found)
    limit: int
    errors: dict[str, int]


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def address(run: int, i: int) -> str:
    return f"127.{run + 1}.{i // 250}.{i % 250 + 1}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_run(run: int, bmcs: int, concurrency: int, adaptive: bool) -> Outcome:
    port = refused_port()
    pool = BmcPool()
    gateway = PoolGateway(pool)
    gate = asyncio.Semaphore(concurrency)
    errors: dict[str, int] = {}
    lateness: list[float] = []
    settled: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            late = max(0.0, loop.time() - before - 0.01)
            lateness.append(late)
            if before - start > 2.0:
                settled.append(late)

    async def read(i: int) -> None:
        target = BmcTarget(
            node=f"node-{i:05d}",
            url=f"redfish+http://{address(run, i)}:{port}/redfish/v1/Systems/1",
            username="kiln",
            password="not-a-secret",
        )
        async with gate:
            if not adaptive:
                for worker in pool._pools.values():  # pin the limit: the old behaviour
                    worker.share.floor = worker.share.ceiling
                    worker.share.limit = worker.share.ceiling
            try:
                await gateway.leak_detectors(target)
            except KilnError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    ticker = asyncio.create_task(tick())
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    await asyncio.gather(*(read(i) for i in range(bmcs)))
    wall, cpu = time.monotonic() - wall0, cpu_seconds() - cpu0
    done.set()
    await ticker
    limit = min((w.share.limit for w in pool._pools.values()), default=0)
    await gateway.close()
    return Outcome(wall, cpu, lateness, settled, limit, errors)


def describe(name: str, bmcs: int, o: Outcome) -> str:
    return (
        f"  {name}: {bmcs} reads in {o.wall:.1f}s, {o.cpu / bmcs * 1e3:.2f} ms CPU each; "
        f"loop late p50 {pct(o.lateness, 0.5) * 1e3:.1f} ms, p99 "
        f"{pct(o.lateness, 0.99) * 1e3:.1f} ms, max {max(o.lateness, default=0) * 1e3:.0f} ms "
        f"({len(o.lateness)} ticks); after the first 2 s p50 {pct(o.settled, 0.5) * 1e3:.1f} ms, "
        f"p99 {pct(o.settled, 0.99) * 1e3:.1f} ms; threads allowed at the end {o.limit}; "
        f"errors {o.errors}"
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bmcs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    heap.settle()  # the collector set as kiln-controller sets it once serving
    print(
        f"bmc_loop_share: {args.bmcs} dead Redfish BMCs (distinct loopback addresses, "
        f"connections refused), one leak read each, {args.concurrency} at once, through "
        "PoolGateway with the controller's defaults"
    )
    adaptive = await one_run(0, args.bmcs, args.concurrency, adaptive=True)
    print(describe("adaptive (production)", args.bmcs, adaptive))
    fixed = await one_run(1, args.bmcs, args.concurrency, adaptive=False)
    print(describe("fixed at 256 threads", args.bmcs, fixed))
    a99, f99 = pct(adaptive.lateness, 0.99), pct(fixed.lateness, 0.99)
    print(
        f"SUMMARY: loop lateness p99 {a99 * 1e3:.1f} ms adaptive vs {f99 * 1e3:.1f} ms fixed "
        f"({f99 / max(a99, 1e-6):.1f}x less late); p50 {pct(adaptive.lateness, 0.5) * 1e3:.1f} "
        f"vs {pct(fixed.lateness, 0.5) * 1e3:.1f} ms; wall {adaptive.wall:.1f} vs "
        f"{fixed.wall:.1f} s; CPU per read {adaptive.cpu / args.bmcs * 1e3:.2f} vs "
        f"{fixed.cpu / args.bmcs * 1e3:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
