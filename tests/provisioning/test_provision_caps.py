"""The per-rack provisioning cap on the simulated fleet: with one slot per
rack, two racks of two trays provision one tray per rack at a time, both
racks at once, and every tray still comes back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import grpc
import pytest

from controller.core.provisioning import ProvisionLimits
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, nvl72_rack
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

STREAM_S = 120.0


@pytest.mark.timeout(180)
async def test_one_slot_per_rack_runs_one_tray_per_rack_at_a_time(
    tmp_path: Path, image_server: str
) -> None:
    specs = [
        *nvl72_rack(1, trays=2, switch_trays=0, power_shelves=0),
        *nvl72_rack(2, trays=2, switch_trays=0, power_shelves=0),
    ]
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            image_server=image_server,
            provision_limits=ProvisionLimits(fleet=8, per_rack=1),
        )
    )
    address = await server.start()
    fleet = SimFleet(specs, watch_interval=0.2)
    await fleet.start(address)
    rack_of = {s.name: s.rack for s in specs}
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for s in specs:
                await stub.EnrollNode(
                    fleet_pb2.EnrollNodeRequest(
                        name=s.name,
                        bmc_url=fleet.bmc_url(s.name),
                        username=SIM_USERNAME,
                        password=SIM_PASSWORD,
                        rack=s.rack,
                    )
                )
            booting: set[str] = set()
            most_per_rack: Counter[str] = Counter()
            most_at_once = 0
            ended = {}
            stream = stub.ProvisionNodes(
                fleet_pb2.ProvisionNodesRequest(names=sorted(rack_of), image="kiln-test"),
                timeout=STREAM_S,
            )
            async for line in stream:
                if line.phase == "media_inserted":
                    booting.add(line.node)
                elif line.phase in ("inspecting", "failed"):
                    booting.discard(line.node)
                    ended[line.node] = (line.phase, line.error)
                per_rack = Counter(rack_of[n] for n in booting)
                for rack, n in per_rack.items():
                    most_per_rack[rack] = max(most_per_rack[rack], n)
                most_at_once = max(most_at_once, len(booting))
            assert ended == {n: ("inspecting", "") for n in rack_of}, ended
            assert dict(most_per_rack) == {"r01": 1, "r02": 1}
            assert most_at_once == 2, "the cap is per rack: both racks ran at once"
    finally:
        await fleet.stop()
        await server.stop()
