"""Coolant leaks on the simulated fleet: a real controller, a GB200 rack of
trays on sushy-tools' emulator (with Kiln's leak detectors) and fake-NVML
agents, driven through gRPC and the ``kiln`` CLI.

Done when: a Critical leak on one tray powers it off through the emulator
within 10 s and blocks power-on until cleared; two leaking trays drain the
rack; a sensor fault powers nothing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from fleet_waits import enroll_sim_fleet, wait_all_ready, wait_node, wait_node_state

from controller.cli.main import main as kiln
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

POWERED_OFF = types_pb2.NODE_STATE_POWERED_OFF
READY = types_pb2.NODE_STATE_READY


def data(event: fleet_pb2.Event) -> dict[str, Any]:
    return dict(json.loads(event.data_json))


@dataclass
class Sim:
    address: str
    fleet: SimFleet
    stub: fleet_pb2_grpc.FleetServiceStub

    async def events(self, kind: str, **where: str) -> list[fleet_pb2.Event]:
        request = fleet_pb2.WatchEventsRequest(follow=False, **where)
        return [e async for e in self.stub.WatchEvents(request) if e.kind == kind]

    async def wait_event(self, kind: str, within: float = 30.0, **where: str) -> fleet_pb2.Event:
        deadline = time.monotonic() + within
        while True:
            found = await self.events(kind, **where)
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"no {kind} event within {within}s"
            await asyncio.sleep(0.2)

    async def power_off_seen(self, name: str, within: float) -> float:
        """When the emulator first shows ``name`` off (polled every 50 ms)."""
        deadline = time.monotonic() + within
        while await self.fleet.emulator.system_power(name) != "Off":
            assert time.monotonic() < deadline, f"{name} still on after {within}s"
            await asyncio.sleep(0.05)
        return time.time()


@contextlib.asynccontextmanager
async def sim_fleet(tmp_path: Path, *, leak_interval: float) -> AsyncIterator[Sim]:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            leak_interval=leak_interval,
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=1, hgx_nodes=0, trays=3), watch_interval=0.3)
    await fleet.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await enroll_sim_fleet(stub, fleet)
            await wait_all_ready(stub, 90)
            yield Sim(address, fleet, stub)
    finally:
        await fleet.stop()
        await server.stop()


async def cli(capsys: pytest.CaptureFixture[str], sim: Sim, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(kiln, ["--controller", sim.address, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.timeout(240)
async def test_a_critical_leak_powers_the_tray_off_within_10s_and_blocks_it_until_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The controller's default leak interval (5 s): the 10 s bound holds as shipped.
    async with sim_fleet(tmp_path, leak_interval=5.0) as sim:
        stub = sim.stub
        alloc = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="job", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY
        (tray,) = alloc.nodes

        leaked_at = time.time()
        await sim.fleet.emulator.set_leak_detector(tray, "ColdPlate", DetectorState="Critical")
        off_at = await sim.power_off_seen(tray, within=10.0)
        leak = await sim.wait_event("node.leak", node=tray)
        read_at = data(leak)["read_at"]
        with capsys.disabled():
            print(
                f"\nleak set → emulator off: {off_at - leaked_at:.2f}s; "
                f"Critical reading → emulator off: {off_at - read_at:.2f}s"
            )
        assert off_at - leaked_at < 10.0
        assert 0 <= off_at - read_at < 10.0
        assert data(leak)["state"] == "critical" and data(leak)["detector_state"] == "Critical"
        assert data(leak)["detector"] == sim.fleet.emulator.leak_detector_path(tray, "ColdPlate")

        node = await wait_node_state(stub, tray, POWERED_OFF, 30)
        assert node.power_block.startswith("coolant leak: detector Cold plate leak detector")
        # The job was told, and lost the tray as a failed node.
        notice = await sim.wait_event("allocation.notice", allocation=alloc.id)
        assert "coolant leak" in notice.reason and tray in notice.reason
        await sim.wait_event("allocation.node_replaced", allocation=alloc.id)
        now = await stub.GetAllocation(fleet_pb2.GetAllocationRequest(id=alloc.id))
        assert tray not in now.nodes and len(now.nodes) == 1, "a free tray took its place"

        # Power-on is refused, by PowerNode and per node by PowerNodes.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.PowerNode(
                fleet_pb2.PowerNodeRequest(name=tray, action=types_pb2.POWER_ACTION_ON)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"kiln nodes clear-leak {tray}" in (refused.value.details() or "")
        results = [
            p
            async for p in stub.PowerNodes(
                fleet_pb2.PowerNodesRequest(names=[tray], action=types_pb2.POWER_ACTION_CYCLE)
            )
        ]
        assert len(results) == 1 and "coolant leak" in str(results[0])
        assert await sim.fleet.emulator.system_power(tray) == "Off"

        # What the operator sees, and clearing: refused while it still leaks.
        code, out, _ = await cli(capsys, sim, "nodes", "show", tray)
        assert code == 0 and "power block:" in out and f"kiln nodes clear-leak {tray}" in out
        code, out, _ = await cli(capsys, sim, "nodes", "list")
        assert code == 0 and "POWER BLOCKED: coolant leak" in out
        code, _, err = await cli(capsys, sim, "nodes", "clear-leak", tray, "--reason", "T-1")
        assert code == 1 and "still reports Critical" in err
        await sim.fleet.emulator.set_leak_detector(tray, "ColdPlate", DetectorState="OK")
        code, out, _ = await cli(capsys, sim, "nodes", "clear-leak", tray, "--reason", "T-1")
        assert code == 0 and f"node {tray} leak cleared" in out, out
        cleared = await sim.wait_event("node.leak_cleared", node=tray)
        assert cleared.reason == "T-1" and data(cleared)["cleared"] == node.power_block

        # Cleared: undrained, the tray powers on and comes back to service.
        await stub.UndrainNode(fleet_pb2.UndrainNodeRequest(name=tray))
        back = await wait_node(stub, tray, lambda n: n.state == READY and n.schedulable, 90)
        assert back.power_block == ""
        assert await sim.fleet.emulator.system_power(tray) == "On"


@pytest.mark.timeout(240)
async def test_a_sensor_fault_powers_nothing_off_and_two_leaking_trays_drain_the_rack(
    tmp_path: Path,
) -> None:
    async with sim_fleet(tmp_path, leak_interval=1.0) as sim:
        stub, emulator = sim.stub, sim.fleet.emulator
        trays = sorted(s.name for s in sim.fleet.specs)
        faulty, first, second = trays

        # A detector that reports a fault of its own (offline, and Critical health).
        await emulator.set_leak_detector(
            faulty,
            "ColdPlate",
            DetectorState="Critical",
            Status={"State": "UnavailableOffline", "Health": "Critical"},
        )
        fault = await sim.wait_event("node.leak", node=faulty)
        assert data(fault)["state"] == "fault" and data(fault)["repair"] is True
        await asyncio.sleep(3.0)  # three more passes
        assert await emulator.system_power(faulty) == "On"
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=faulty))
        assert node.state == READY and node.schedulable and node.power_block == ""
        since = [e for e in await sim.events("node.power", node=faulty) if e.seq > fault.seq]
        assert since == [], "no power action at all"

        # Two trays of the rack leak: both off, the rest of the rack drained.
        await emulator.set_leak_detector(first, "ColdPlate", DetectorState="Critical")
        await emulator.set_leak_detector(second, "Manifold", DetectorState="Critical")
        isolation = await sim.wait_event("rack.isolation_requested", within=20)
        assert data(isolation)["rack"] == "r01"
        assert sorted(data(isolation)["leaking"]) == [first, second]
        assert data(isolation)["drained"] == [faulty]
        for name in (first, second):
            await sim.power_off_seen(name, within=10)
            await wait_node_state(stub, name, POWERED_OFF, 30)
        drained = await wait_node(
            stub,
            faulty,
            lambda n: n.state in (types_pb2.NODE_STATE_DRAINING, types_pb2.NODE_STATE_MAINTENANCE),
            30,
        )
        assert "rack r01 isolated" in drained.state_reason
        assert drained.power_block == "" and await emulator.system_power(faulty) == "On"
        assert len(await sim.events("rack.isolation_requested")) == 1
