"""Benchmark: power-state sync of N Redfish BMCs with added latency.

What is measured: Kiln's production path -- ``PoolGateway.poll_power`` over a
``BmcPool``, the call the core's power sync (``controller/core/power_sync.py``)
makes each interval (sushy in a bounded thread pool, one guarded call per BMC,
bounded async concurrency) -- against

* ``--mode responder`` (default): a latency-only loopback Redfish responder, a
  separate process that answers the service root and ``Systems/<id>`` after
  sleeping ``--latency`` seconds. It stands in for N BMCs, each ``latency``
  away. sushy-tools' emulator costs ~10 ms of CPU per request, so at 10,000
  BMCs it, not the controller, would be the bottleneck.
* ``--mode emulator``: sushy-tools' emulator with N systems behind
  ``FaultProxy`` adding ``--latency`` (use a small N; the emulator serializes).

Pass 1 is cold (each BMC: TCP connect + service root + system = 2 round
trips); pass 2 is the steady state a periodic sync runs every interval
(1 round trip on a kept-alive connection). The target compares pass 2.

Baseline: Ironic's power-state sync, 8 worker threads each reading one BMC at
a time with the same driver, run on ``--baseline-n`` BMCs and extrapolated
linearly to N (it is sequential per worker, so it scales linearly).

Prints wall time, ratio to ideal (N x latency / concurrency), controller CPU
(``time.process_time``, responder excluded), and a one-line summary last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.bmc import (
    BmcCredentials,
    BmcPool,
    RetryPolicy,
    TlsOptions,
    parse_bmc_url,
)
from controller.bmc.gateway import PoolGateway
from controller.bmc.redfish import RedfishDriver
from controller.core.errors import KilnError
from controller.core.model import BmcTarget
from controller.sim.ports import free_port

CREDS = BmcCredentials("bench", "bench-password")


# --- the latency-only responder (runs in a child process) ---------------------
def _json_response(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + data


ROOT: dict[str, object] = {
    "@odata.id": "/redfish/v1/",
    "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
    "Id": "RootService",
    "Name": "Latency responder",
    "RedfishVersion": "1.5.0",
    "UUID": "00000000-0000-0000-0000-000000000000",
    "Systems": {"@odata.id": "/redfish/v1/Systems"},
}


def _system(ident: str) -> dict[str, object]:
    on = sum(map(ord, ident)) % 10 != 0  # a tenth of the fleet is off
    return {
        "@odata.id": f"/redfish/v1/Systems/{ident}",
        "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
        "Id": ident,
        "Name": ident,
        "PowerState": "On" if on else "Off",
        "Status": {"State": "Enabled", "Health": "OK"},
    }


async def _serve(port: int, latency: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().rstrip("/")
                await asyncio.sleep(latency)
                if path.startswith("/redfish/v1/Systems/"):
                    writer.write(_json_response(_system(path.rsplit("/", 1)[1])))
                else:
                    writer.write(_json_response(ROOT))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, IndexError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_responder(latency: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--latency", str(latency)],
        stdout=subprocess.DEVNULL,
    )
    import socket

    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("responder did not start")


# --- measurements --------------------------------------------------------------
async def kiln_sync(urls: list[str], concurrency: int, call_timeout: float) -> list[float]:
    pool = BmcPool(
        max_workers=concurrency,
        call_timeout=call_timeout,
        retry=RetryPolicy(attempts=2, base_delay=0.2),
    )
    gateway = PoolGateway(pool)
    targets = [BmcTarget(f"n{i}", u, CREDS.username, CREDS.password) for i, u in enumerate(urls)]
    walls: list[float] = []
    try:
        for label in ("cold", "warm"):
            cpu0, t0 = time.process_time(), time.monotonic()
            polled = await gateway.poll_power(targets, concurrency)
            wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
            walls.append(wall)
            failed = [node for node, (state, _health) in polled.items() if state is None]
            on = sum(1 for state, _health in polled.values() if state == "on")
            print(
                f"  kiln {label}: {len(urls)} BMCs in {wall:.1f}s, cpu {cpu:.1f}s, "
                f"{len(failed)} failed, {on} on"
            )
            if failed:
                # The handle is cached (no I/O); its health carries the last error.
                t = next(t for t in targets if t.node == failed[0])
                health = pool.get(t.node, parse_bmc_url(t.url), CREDS).health
                print(f"    e.g. {t.node}: {health.state}, {health.last_error}")
            walls.append(cpu)
    finally:
        await gateway.close()
    return walls  # cold wall, cold cpu, warm wall, warm cpu


def ironic_baseline(urls: list[str], call_timeout: float) -> tuple[float, float, int]:
    """8 workers, each polling its BMCs one after another (cold, then warm).

    Returns (cold wall, warm wall, failures)."""
    drivers = [
        RedfishDriver(parse_bmc_url(u), CREDS, TlsOptions(), request_timeout=call_timeout)
        for u in urls
    ]

    def read(driver: RedfishDriver) -> bool:
        try:
            driver.power_state()
            return True
        except KilnError:
            return False

    walls = []
    failures = 0
    with ThreadPoolExecutor(8) as executor:
        for _ in range(2):
            t0 = time.monotonic()
            failures += sum(1 for ok in executor.map(read, drivers) if not ok)
            walls.append(time.monotonic() - t0)
    for d in drivers:
        d.close()
    return walls[0], walls[1], failures


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--baseline-n", type=int, default=80)
    parser.add_argument("--mode", choices=["responder", "emulator"], default="responder")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_fd_limit()
    if args.serve:
        await _serve(args.serve, args.latency)
        return 0
    logging.basicConfig(level=logging.ERROR)
    n, latency, conc = args.n, args.latency, args.concurrency
    call_timeout = max(10.0, 5 * latency)
    print(
        f"power sync of {n} Redfish BMCs, {latency}s per call, concurrency {conc}, mode {args.mode}"
    )
    cleanup = []
    if args.mode == "responder":
        proc, port = start_responder(latency)
        cleanup.append(proc)
        urls = [
            f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/node-{i:05d}" for i in range(n)
        ]
        emu = proxy = None
    else:
        from controller.sim.fault_proxy import FaultProxy
        from controller.sim.redfish_emulator import RedfishEmulator, make_systems

        emu = RedfishEmulator(make_systems(n))
        await emu.start()
        proxy = FaultProxy(("127.0.0.1", emu.port), delay_s=latency)
        await proxy.start()
        urls = [
            # By UUID: a name answers with a redirect, i.e. two round trips.
            f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{s.uuid}"
            for s in emu.systems
        ]
    try:
        cold_wall, cold_cpu, warm_wall, warm_cpu = await kiln_sync(urls, conc, call_timeout)
        ideal = n * latency / conc
        bn = min(args.baseline_n, n)
        b_cold, b_warm, b_failed = await asyncio.to_thread(ironic_baseline, urls[:bn], call_timeout)
        scale = n / bn
        est_cold, est_warm = b_cold * scale, b_warm * scale
        print(f"  ideal (N x latency / concurrency): {ideal:.1f}s per round trip")
        print(
            f"  kiln warm ratio to ideal: {warm_wall / ideal:.2f}  (cold pass: 2 round trips, "
            f"ratio {cold_wall / (2 * ideal):.2f} to its 2x ideal)"
        )
        print(
            f"  controller CPU: {warm_cpu:.1f}s warm pass, {cold_cpu:.1f}s cold pass "
            f"({warm_cpu / n * 1e3:.2f} ms per BMC warm)"
        )
        print(
            f"  ironic-style 8 workers: {bn} BMCs cold {b_cold:.1f}s, warm {b_warm:.1f}s; "
            f"extrapolated to {n}: cold {est_cold:.0f}s, warm {est_warm:.0f}s "
            f"({b_failed} failed reads)"
        )
        if n >= 10000 and latency >= 1.0:
            target = "60s target " + ("MET" if warm_wall <= 60 else "MISSED")
        else:
            target = "60s target is for --n 10000 --latency 1"
        print(
            f"SUMMARY: {n} BMCs @ {latency}s: kiln warm {warm_wall:.1f}s (cold {cold_wall:.1f}s), "
            f"{warm_wall / ideal:.2f}x ideal, cpu {warm_cpu:.1f}s; ironic-style ~{est_warm:.0f}s "
            f"({est_warm / warm_wall:.0f}x slower); {target} [{args.mode}]"
        )
    finally:
        for p in cleanup:
            p.terminate()
            p.wait()
        if proxy is not None:
            await proxy.stop()
        if emu is not None:
            await emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
