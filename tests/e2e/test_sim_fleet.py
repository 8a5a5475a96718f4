"""The whole path on real peers: a controller, the sushy-tools emulator as the
BMCs, agents on the NVML fake; enrolment to gang allocation and back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fleet_waits import wait_all_ready, wait_allocation

from controller.cli.pages import every_page_async
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

READY = types_pb2.NODE_STATE_READY


class Harness:
    def __init__(
        self, server: ControllerServer, fleet: SimFleet, stub: fleet_pb2_grpc.FleetServiceStub
    ) -> None:
        self.server = server
        self.fleet = fleet
        self.stub = stub

    async def nodes(self) -> list[fleet_pb2.Node]:
        return await every_page_async(self.stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes")

    async def wait_all_ready(self, timeout: float = 60.0) -> list[fleet_pb2.Node]:
        return await wait_all_ready(self.stub, timeout)

    async def wait_alloc(
        self, ident: str, state: int, timeout: float = 20.0
    ) -> fleet_pb2.Allocation:
        return await wait_allocation(self.stub, ident, state, timeout)


@contextlib.asynccontextmanager
async def open_harness(tmp_path: Path, **config: Any) -> AsyncIterator[Harness]:
    """A controller (``config`` on top of the tests' intervals) and the
    simulated fleet, every node enrolled."""
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            **config,
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=1, hgx_nodes=3, trays=4), watch_interval=0.3)
    await fleet.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for spec in fleet.specs:
                await stub.EnrollNode(
                    fleet_pb2.EnrollNodeRequest(
                        name=spec.name,
                        bmc_url=fleet.bmc_url(spec.name),
                        username=SIM_USERNAME,
                        password=SIM_PASSWORD,
                        rack=spec.rack,
                        leaf=spec.leaf,
                        spine=spec.spine,
                    )
                )
            yield Harness(server, fleet, stub)
    finally:
        await fleet.stop()
        await server.stop()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with open_harness(tmp_path) as opened:
        yield opened


async def test_enrolled_nodes_are_powered_on_inspected_and_become_ready(
    harness: Harness,
) -> None:
    nodes = await harness.wait_all_ready()
    assert len(nodes) == 7
    power = await asyncio.to_thread(harness.fleet.read_power)
    assert set(power.values()) == {"On"}, "Kiln powered every node on through Redfish"
    gb200 = [n for n in nodes if n.name.startswith("gb200")]
    assert {n.gpu_model for n in gb200} == {"GB200"}
    assert all(n.gpu_count == 4 for n in gb200)
    assert len({n.nvlink_domain for n in gb200}) == 1 and gb200[0].nvlink_domain
    h200 = [n for n in nodes if n.name.startswith("h200")]
    assert all(n.gpu_count == 8 and n.gpu_model == "H200" for n in h200)
    assert all(n.nvlink_domain == "" for n in h200)
    assert all(SIM_PASSWORD not in str(n) for n in nodes)


async def test_gang_allocations_are_whole_idempotent_queued_and_released(
    harness: Harness,
) -> None:
    await harness.wait_all_ready()
    stub = harness.stub
    rack = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(key="rack", spec=fleet_pb2.AllocationSpec(racks=1))
    )
    assert rack.state == fleet_pb2.ALLOCATION_STATE_READY
    assert sorted(rack.nodes) == [f"gb200-r01-t{t:02d}" for t in range(1, 5)]
    assert len(rack.domains) == 1

    spec = fleet_pb2.AllocationSpec(nodes=2, gpu_model="H200")
    gang = await stub.CreateAllocation(fleet_pb2.CreateAllocationRequest(key="g", spec=spec))
    assert gang.state == fleet_pb2.ALLOCATION_STATE_READY and len(gang.nodes) == 2
    again = await stub.CreateAllocation(fleet_pb2.CreateAllocationRequest(key="g", spec=spec))
    assert again.id == gang.id and list(again.nodes) == list(gang.nodes)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="g", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS

    # Two more H200s cannot fit now (one is free): the request waits, with a reason.
    waiting = await stub.CreateAllocation(fleet_pb2.CreateAllocationRequest(key="w", spec=spec))
    assert waiting.state == fleet_pb2.ALLOCATION_STATE_PENDING
    assert waiting.reason and waiting.reason != "queued"
    assert not waiting.nodes, "never a partial gang"

    nodes = {n.name: n for n in await harness.nodes()}
    for name in [*rack.nodes, *gang.nodes]:
        assert nodes[name].state == types_pb2.NODE_STATE_ALLOCATED
        assert nodes[name].allocation in (rack.id, gang.id)

    released = await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=gang.id))
    assert released.state == fleet_pb2.ALLOCATION_STATE_RELEASED
    admitted = await harness.wait_alloc(waiting.id, fleet_pb2.ALLOCATION_STATE_READY)
    assert len(admitted.nodes) == 2
    for alloc in (rack, admitted):
        await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
    again_released = await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=rack.id))
    assert again_released.state == fleet_pb2.ALLOCATION_STATE_RELEASED
    await harness.wait_all_ready()

    events = stub.WatchEvents(fleet_pb2.WatchEventsRequest(allocation=rack.id, follow=False))
    kinds = [e.kind async for e in events]
    assert kinds[0] == "allocation.created" and "allocation.ready" in kinds
    assert kinds[-1] in ("allocation.released", "allocation.health_report", "node.transition")
    assert kinds.count("allocation.released") == 1  # a second release records nothing
    assert kinds.count("allocation.health_report") == 1


async def test_agents_report_health_that_the_controller_shows(harness: Harness) -> None:
    await harness.wait_all_ready()
    deadline = time.monotonic() + 10
    while True:
        node = await harness.stub.GetNode(fleet_pb2.GetNodeRequest(name="h200-n01"))
        if node.health.gpus:
            break
        assert time.monotonic() < deadline, "no health report arrived"
        await asyncio.sleep(0.2)
    assert len(node.health.gpus) == 8
    gpu = node.health.gpus[0]
    assert gpu.HasField("temp_c") and 10 < gpu.temp_c < 90
    assert gpu.HasField("shutdown_c") and gpu.shutdown_c > gpu.temp_c
    assert node.agent_connected


async def test_agent_going_away_makes_the_node_unschedulable(harness: Harness) -> None:
    await harness.wait_all_ready()
    result = await harness.stub.PowerNode(
        fleet_pb2.PowerNodeRequest(name="h200-n03", action=types_pb2.POWER_ACTION_FORCE_OFF)
    )
    assert result.power == types_pb2.POWER_STATE_OFF
    deadline = time.monotonic() + 10
    while True:
        node = await harness.stub.GetNode(fleet_pb2.GetNodeRequest(name="h200-n03"))
        if not node.agent_connected:
            break
        assert time.monotonic() < deadline, "agent still connected after power off"
        await asyncio.sleep(0.2)
    assert not node.schedulable
    pending = await harness.stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="three", spec=fleet_pb2.AllocationSpec(nodes=3, gpu_model="H200")
        )
    )
    assert pending.state == fleet_pb2.ALLOCATION_STATE_PENDING
    assert not pending.nodes
    await harness.stub.PowerNode(
        fleet_pb2.PowerNodeRequest(name="h200-n03", action=types_pb2.POWER_ACTION_ON)
    )
    admitted = await harness.wait_alloc(pending.id, fleet_pb2.ALLOCATION_STATE_READY)
    assert sorted(admitted.nodes) == ["h200-n01", "h200-n02", "h200-n03"]


async def test_drain_then_undrain_returns_a_node_to_service_even_after_power_off(
    harness: Harness,
) -> None:
    await harness.wait_all_ready()
    stub = harness.stub
    node = await stub.DrainNode(fleet_pb2.DrainNodeRequest(name="h200-n02", reason="fan swap"))
    assert node.state == types_pb2.NODE_STATE_DRAINING and not node.schedulable
    deadline = time.monotonic() + 10
    while node.state != types_pb2.NODE_STATE_MAINTENANCE:
        assert time.monotonic() < deadline, node.state_reason
        await asyncio.sleep(0.2)
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name="h200-n02"))
    assert node.state_reason == "fan swap"
    off = await stub.PowerNode(
        fleet_pb2.PowerNodeRequest(name="h200-n02", action=types_pb2.POWER_ACTION_OFF)
    )
    assert off.power == types_pb2.POWER_STATE_OFF
    await stub.UndrainNode(fleet_pb2.UndrainNodeRequest(name="h200-n02"))
    nodes = await harness.wait_all_ready()
    back = next(n for n in nodes if n.name == "h200-n02")
    assert back.power == types_pb2.POWER_STATE_ON and back.agent_connected


def force_off_behind_kilns_back(fleet: SimFleet, name: str) -> None:
    """Power a node off at its BMC directly, as someone at the rack might."""
    import base64
    import json
    import urllib.request

    uuid = next(s.system_uuid for s in fleet.specs if s.name == name)
    url = f"{fleet.emulator.base_url}/redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset"
    token = base64.b64encode(f"{SIM_USERNAME}:{SIM_PASSWORD}".encode()).decode()
    req = urllib.request.Request(
        url,
        data=json.dumps({"ResetType": "ForceOff"}).encode(),
        method="POST",
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # loopback only
        assert resp.status in (200, 202, 204)


async def pull_the_plug(harness: Harness, name: str) -> None:
    """Power the node off at its BMC behind Kiln's back, and wait for its
    agent to go with its power (on metal: its stream ends within the
    keepalive). Until then the agent vouches for the node, and power sync
    may leave its BMC for a later pass."""
    assert harness.server.fleet is not None
    hub = harness.server.fleet.agents
    gone = asyncio.Event()
    hub.watch(lambda node: gone.set() if node == name and not hub.is_connected(node) else None)
    await asyncio.to_thread(force_off_behind_kilns_back, harness.fleet, name)
    await asyncio.wait_for(gone.wait(), 30)


async def test_power_sync_notices_a_node_powered_off_outside_kiln(harness: Harness) -> None:
    nodes = await harness.wait_all_ready()
    assert all(n.bmc_health == "ok" for n in nodes)
    alloc = await harness.stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="job", spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")
        )
    )
    victim = alloc.nodes[0]
    assert harness.server.fleet is not None
    await pull_the_plug(harness, victim)
    drifted = await harness.server.fleet.power_sync.run_once()
    assert drifted == [victim]
    node = await harness.stub.GetNode(fleet_pb2.GetNodeRequest(name=victim))
    assert node.power == types_pb2.POWER_STATE_OFF
    events = harness.stub.WatchEvents(fleet_pb2.WatchEventsRequest(allocation=alloc.id))
    seen = [(e.kind, e.node) async for e in events]
    assert ("node.drift", victim) in seen and ("allocation.notice", victim) in seen
    assert await harness.server.fleet.power_sync.run_once() == [victim], "still drifted"
    again = harness.stub.WatchEvents(fleet_pb2.WatchEventsRequest(allocation=alloc.id))
    assert [e.kind async for e in again].count("node.drift") == 1, "told once, not every pass"


@pytest.mark.timeout(180)
async def test_with_bmc_readers_the_power_sync_and_leak_reads_go_to_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``--bmc-readers 1``: the fleet comes up as without (power-on and
    inspection by the controller's own pool), a node powered off behind
    Kiln's back is noticed by a power sync pass read in the reader, the
    leak watcher reads every node there too, and the controller closes its
    own handles once idle."""
    import controller.server

    monkeypatch.setattr(controller.server, "IDLE_BMC_SWEEP_S", 0.5)
    monkeypatch.setattr(controller.server, "IDLE_BMC_HANDLE_S", 2.0)
    caplog.set_level(logging.INFO, logger="controller.server")
    async with open_harness(tmp_path, bmc_readers=1) as harness:
        server = harness.server
        assert server.fleet is not None and server.bmc_readers is not None
        assert await server.bmc_readers.wait_ready(30.0)
        sync = server.fleet.power_sync
        assert (sync.spread, sync.rate) == (0.0, 0.0), "in the reader a pass begins at once"
        nodes = await harness.wait_all_ready()
        alloc = await harness.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                key="job", spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")
            )
        )
        victim = alloc.nodes[0]
        await pull_the_plug(harness, victim)
        sent = server.bmc_readers.calls
        assert await server.fleet.power_sync.run_once() == [victim]
        assert server.bmc_readers.calls == sent + 1, "the pass was read by the reader"
        node = await harness.stub.GetNode(fleet_pb2.GetNodeRequest(name=victim))
        assert node.power == types_pb2.POWER_STATE_OFF
        await server.fleet.leaks.run_once()
        await server.fleet.leaks.settle()
        assert server.bmc_readers.calls == sent + 1 + len(nodes), "one leak read a node"
        assert server.bmc_readers.figures() == {"readers": 1, "in_flight": 0, "restarts": 0}
        for _ in range(100):  # ready nodes: the controller's own handles fall idle
            if "BMC handles: closed" in caplog.text:
                break
            await asyncio.sleep(0.1)
        assert "BMC handles: closed" in caplog.text
        power = await harness.stub.PowerNode(
            fleet_pb2.PowerNodeRequest(name=victim, action=types_pb2.POWER_ACTION_ON)
        )
        assert power.power == types_pb2.POWER_STATE_ON, "a closed handle is made anew"


async def test_every_event_is_a_documented_kind_and_matches_the_schema(
    harness: Harness,
) -> None:
    import json

    import jsonschema

    from controller.events.model import EVENT_SCHEMA, Event, EventKind

    await harness.wait_all_ready()
    alloc = await harness.stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="k", spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")
        )
    )
    await harness.stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
    await harness.wait_all_ready()
    events = [e async for e in harness.stub.WatchEvents(fleet_pb2.WatchEventsRequest())]
    kinds = {e.kind for e in events}
    assert kinds <= {k.value for k in EventKind}, kinds - {k.value for k in EventKind}
    assert {
        "node.enrolled",
        "node.transition",
        "node.power",
        "node.agent",
        "allocation.created",
        "allocation.ready",
        "allocation.released",
    } <= kinds
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    for e in events:
        doc = Event(
            seq=e.seq,
            at=e.at,
            kind=e.kind,
            node=e.node or None,
            allocation=e.allocation or None,
            rule=e.rule or None,
            reason=e.reason,
            data=json.loads(e.data_json),
        ).to_json()
        jsonschema.validate(json.loads(doc), EVENT_SCHEMA)
