"""Benchmark: the CPU a BMC power read costs on the event loop, against a
bare-socket floor and aiohttp measured in the same run.

Power sync reads every BMC's power over and over, and the leak watcher its
detectors: each read opens a connection, sends one GET and reads one
answer (a BMC is read again a pass later, past any keep-alive). This
prints the CPU a read costs, ``--reads`` reads (default 4,000 over as many
BMCs), 64 at a time, against the benchmark's stand-in responder in a
process of its own (``bench/fleet_load.py``: ``Systems/<id>`` answered
with a 200-byte System document, every connection closed after its
answer; it stands in for BMCs, and is far quicker than one):

1. **floor**: a bare ``asyncio.Protocol`` that connects, writes the request
   and keeps the bytes until the peer closes: no parsing, no checks;
2. **aiohttp**: the same GET through an ``aiohttp.ClientSession`` set as
   Kiln's pool set it before ``http_get`` (no connection kept, no cookies,
   nothing from the environment), its body read whole;
3. **http_get**: the same GET through ``controller/bmc/http_get.py`` (the
   request written on a bare connection, the answer read by httptools);
4. **Kiln's power read** (production): ``PoolGateway.poll_power`` over a
   ``BmcPool`` with the controller's defaults, 64 at once: the guard
   (retries, breakers, health), the driver (``http_get`` through
   ``RedfishHttp``, the JSON and its checks) and the answer as power sync
   takes it.

CPU is the process's (user + system; the responder's is not counted),
each way measured ``--rounds`` times in turn (default 3) and the median
printed, with its ratio to the floor; all of it first on asyncio's own
event loop (the controller's, which reads its BMCs itself without
``--bmc-readers``), then on uvloop (a BMC reader's). The process's
collector is set as ``kiln-controller`` sets it. About a minute on 2
cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

from bmc_loop_share import cpu_seconds  # noqa: E402
from fleet_load import responder_on_free_port  # noqa: E402

from controller import heap  # noqa: E402
from controller.bmc import http_get  # noqa: E402
from controller.bmc.gateway import PoolGateway  # noqa: E402
from controller.bmc.pool import BmcPool  # noqa: E402
from controller.core.model import BmcTarget  # noqa: E402

AT_ONCE = 64
HEADERS = {
    "Authorization": "Basic a2lsbjpub3QtYS1zZWNyZXQ=",  # kiln:not-a-secret
    "Accept": "application/json",
    "OData-Version": "4.0",
}


def system_url(port: int, i: int) -> str:
    return f"http://127.0.0.1:{port}/redfish/v1/Systems/node-{i:05d}"


async def bounded(count: int, read: Callable[[int], Awaitable[int]]) -> int:
    """``read(i)`` for every i below ``count``, AT_ONCE at a time: how many
    answered 200."""
    slots = asyncio.Semaphore(AT_ONCE)

    async def one(i: int) -> int:
        async with slots:
            return await read(i)

    return sum(await asyncio.gather(*(one(i) for i in range(count))))


class _Bare(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[bytes]) -> None:
        self.request, self.done, self.chunks = request, done, list[bytes]()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(b"".join(self.chunks))


async def floor(port: int, count: int) -> int:
    loop = asyncio.get_running_loop()
    lines = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())

    async def read(i: int) -> int:
        request = (
            f"GET /redfish/v1/Systems/node-{i:05d} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"{lines}Connection: close\r\n\r\n"
        ).encode()
        done: asyncio.Future[bytes] = loop.create_future()
        await loop.create_connection(lambda: _Bare(request, done), "127.0.0.1", port)
        return int((await done).startswith(b"HTTP/1.1 200"))

    return await bounded(count, read)


async def through_aiohttp(port: int, count: int) -> int:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        timeouts = aiohttp.ClientTimeout(total=10.0, connect=5.0)

        async def read(i: int) -> int:
            async with session.get(system_url(port, i), headers=HEADERS, timeout=timeouts) as r:
                await r.read()
                return int(r.status == 200)

        return await bounded(count, read)


async def through_http_get(port: int, count: int) -> int:
    async def read(i: int) -> int:
        status, _body = await http_get.get(
            system_url(port, i), HEADERS, tls=None, timeout=10.0, connect_timeout=5.0, limit=1 << 20
        )
        return int(status == 200)

    return await bounded(count, read)


async def kiln_power_read(gateway: PoolGateway, targets: list[BmcTarget]) -> int:
    polled = await gateway.poll_power(targets, AT_ONCE, spread=0.0)
    return sum(1 for state, _health in polled.values() if state is not None)


FLOOR = "floor (bare socket, no parsing)"
AIOHTTP = "aiohttp ClientSession"
HTTP_GET = "http_get (httptools)"
KILN = "Kiln's power read (PoolGateway.poll_power)"


async def measure(port: int, count: int, rounds: int) -> dict[str, list[float]]:
    """Each way ``rounds`` times in turn on the running loop: CPU s a read."""
    targets = [
        BmcTarget(
            node=f"node-{i:05d}",
            url="redfish+" + system_url(port, i),
            username="kiln",
            password="not-a-secret",
        )
        for i in range(count)
    ]
    gateway = PoolGateway(BmcPool())
    ways: dict[str, Callable[[], Awaitable[int]]] = {
        FLOOR: lambda: floor(port, count),
        AIOHTTP: lambda: through_aiohttp(port, count),
        HTTP_GET: lambda: through_http_get(port, count),
        KILN: lambda: kiln_power_read(gateway, targets),
    }
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    try:
        await kiln_power_read(gateway, targets)  # warm-up: every BMC's handle made
        for _ in range(rounds):
            for name, way in ways.items():
                before = cpu_seconds()
                answered = await way()
                cpu[name].append((cpu_seconds() - before) / count)
                if answered != count:
                    print(f"  {name}: only {answered} of {count} reads answered")
    finally:
        await gateway.close()
    return cpu


def report(loop: str, cpu: dict[str, list[float]]) -> dict[str, float]:
    """Print one loop's medians and their ratios to its floor; return them (ms)."""
    ms = {name: statistics.median(v) * 1e3 for name, v in cpu.items()}
    print(f"  on {loop}:")
    for name, value in ms.items():
        spread = ", ".join(f"{v * 1e3:.3f}" for v in cpu[name])
        print(
            f"    {name}: {value:.3f} ms CPU a read ({value / ms[FLOOR]:.1f}x the floor; {spread})"
        )
    return ms


def run(port: int, count: int, rounds: int) -> int:
    plain = report("asyncio's loop", asyncio.run(measure(port, count, rounds)))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        uv = report("uvloop (a BMC reader's loop)", runner.run(measure(port, count, rounds)))
    print(
        f"SUMMARY: a BMC power read costs {uv[KILN]:.3f} ms of CPU in a BMC reader (uvloop; "
        f"{uv[KILN] / uv[FLOOR]:.1f}x its bare-socket floor of {uv[FLOOR]:.3f} ms) and "
        f"{plain[KILN]:.3f} ms in the controller's own process (asyncio; "
        f"{plain[KILN] / plain[FLOOR]:.1f}x its floor of {plain[FLOOR]:.3f} ms); the GET alone "
        f"{plain[HTTP_GET]:.3f} ms through http_get against {plain[AIOHTTP]:.3f} ms through "
        f"aiohttp ({plain[AIOHTTP] / plain[HTTP_GET]:.1f}x); {count} reads, {AT_ONCE} at once, "
        f"median of {rounds}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reads", type=int, default=4000, help="reads a way a round (one a BMC)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    heap.settle()
    print(
        f"bmc_read_cost: {args.reads} Redfish power reads a way against the fleet_load "
        f"stand-in responder, {AT_ONCE} at once, {args.rounds} rounds"
    )
    with responder_on_free_port() as port:
        return run(port, args.reads, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
