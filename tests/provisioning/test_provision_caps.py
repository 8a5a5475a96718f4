"""The per-rack provisioning cap on the simulated fleet: with one slot per
rack, two racks of two trays provision one tray per rack at a time, both
racks at once, and every tray still comes back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sim_env import enroll_all, sim_env

from controller.core.provisioning import ProvisionLimits
from controller.sim.fleet import nvl72_rack
from kiln.v1 import fleet_pb2

STREAM_S = 120.0


@pytest.mark.timeout(180)
async def test_one_slot_per_rack_runs_one_tray_per_rack_at_a_time(
    tmp_path: Path, image_server: str
) -> None:
    specs = [
        *nvl72_rack(1, trays=2, switch_trays=0, power_shelves=0),
        *nvl72_rack(2, trays=2, switch_trays=0, power_shelves=0),
    ]
    limits = ProvisionLimits(fleet=8, per_rack=1)
    rack_of = {s.name: s.rack for s in specs}
    async with sim_env(
        tmp_path, specs, watch_interval=0.2, image_server=image_server, provision_limits=limits
    ) as env:
        stub = env.stub
        await enroll_all(stub, env.fleet)
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
