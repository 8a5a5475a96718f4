"""Benchmark: an NVL72 rack brought up by one ``BringUpRack`` call, against a
single tray brought up the same way, in the same run.

A real ``kiln-controller`` process (its defaults: the built-in check suite's
intake gate runs on every new tray) and, in this process, the simulated fleet:
one sushy-tools emulator serving every BMC, the trays' agents on the NVML fake.
Two racks: ``r01`` has one compute tray, one switch tray and one power shelf
(the floor: the slowest a single tray can be); ``r02`` a whole NVL72 rack, 18
compute trays, 9 switch trays and 8 power shelves. Each is brought up from
nothing (enrolment included) and timed from the request to the report.

Printed: each rack's time, its slowest tray, the ratio rack ÷ single tray
(the goal: ≤ 2), and with ``--image`` the same through provisioning from the
catalogue (the image served on loopback), once with the controller's default
per-rack provisioning cap and once with ``--max-provisioning-per-rack 18``.

The agents run in this process, not on 18 machines, and every BMC is one
emulator process: on 2 cores they and the controller share the CPU, so the
whole rack is slower than on metal relative to one tray, not faster.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.server
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kiln_process import ROOT, Controller, interrupt_on_sigterm

from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, nvl72_rack

KINDS = {"gb200": 1, "switch_tray": 2, "power_shelf": 3}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_images() -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(ROOT / "images"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


async def bring_up(address: str, fleet: SimFleet, rack: str, image: str) -> tuple[float, Any]:
    import grpc

    from kiln.v1 import fleet_pb2, fleet_pb2_grpc

    members = [
        fleet_pb2.EnrollNodeRequest(
            name=s.name,
            bmc_url=fleet.bmc_url(s.name),
            username=SIM_USERNAME,
            password=SIM_PASSWORD,
            rack=s.rack,
            leaf=s.leaf,
            kind=KINDS[s.kind],
        )
        for s in fleet.specs
        if s.rack == rack
    ]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        started = time.monotonic()
        last = None
        request = fleet_pb2.BringUpRackRequest(
            rack=rack, members=members, image=image, timeout_s=900
        )
        async for line in stub.BringUpRack(request, timeout=1200):
            last = line
        took = time.monotonic() - started
    assert last is not None and last.HasField("report")
    return took, last.report


async def one_run(image: str, extra: list[str], label: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        images = None
        flags = ["--reconcile-interval", "0.2", "--sample-interval", "1", *extra]
        if image:
            images, url = serve_images()
            flags += ["--image-server", url]
        controller = Controller(Path(tmp) / "state", Path(tmp) / "controller.log", flags)
        (Path(tmp) / "state").mkdir()
        controller.start()
        fleet = SimFleet(
            [*nvl72_rack(1, trays=1, switch_trays=1, power_shelves=1), *nvl72_rack(2)],
            watch_interval=0.3,
        )
        try:
            controller.wait_serving()
            await fleet.start(controller.address)
            single, r1 = await bring_up(controller.address, fleet, "r01", image)
            whole, r2 = await bring_up(controller.address, fleet, "r02", image)
        finally:
            await fleet.stop()
            controller.stop()
            if images is not None:
                images.shutdown()
    for name, took, report in (("single tray (r01)", single, r1), ("NVL72 rack (r02)", whole, r2)):
        trays = sum(1 for t in report.trays if t.kind == 1)
        ok = "ready" if report.rack_ready else f"NOT READY: {report.reason}"
        print(
            f"  {label:<28} {name:<18} {trays:>2} trays  {took:6.1f} s  "
            f"slowest tray {report.slowest_tray_s:6.1f} s  {ok}"
        )
    ratio = whole / single
    verdict = "meets" if ratio <= 2 else "misses"
    print(f"  {label:<28} rack / single tray = {ratio:.2f} ({verdict} the goal of <= 2)")
    return single, whole


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="store_true", help="also through provisioning")
    parser.add_argument(
        "--controller-args",
        default="",
        metavar="ARGS",
        help="more kiln-controller options for every run, e.g. '--checks off'",
    )
    args = parser.parse_args()
    extra = args.controller_args.split()
    print("rack bring-up, kiln-controller process, simulated NVL72 rack (2 racks, one run each)")
    if extra:
        print(f"  kiln-controller {' '.join(extra)}")
    await one_run("", extra, "inspect")
    if args.image:
        await one_run("kiln-test", extra, "provision (per-rack cap 4)")
        await one_run(
            "kiln-test", [*extra, "--max-provisioning-per-rack", "18"], "provision (cap 18)"
        )


if __name__ == "__main__":
    interrupt_on_sigterm()
    asyncio.run(main())
