"""``BringUpRack`` on the simulated fleet: a GB200 NVL72 rack with its NVLink
switch trays and power shelves on the sushy-tools emulator, its trays' agents
on the NVML fake. One call takes the rack from nothing to ready, powered in
order, with a per-tray report; a tray on other firmware is updated to the
baseline before it is ready; a tray in another fabric clique keeps the whole
rack from work and is named."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from sim_env import enroll_request, sim_env

from controller.core.profiles import ProfileCatalog, parse_profile
from controller.sim.fleet import SimFleet, SimNodeSpec, nvl72_rack
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

STREAM_S = 150.0
PINNED = """
version: v1
name: rack-baseline
firmware:
  - {component: BIOS, version: "1.1.0", image: "http://127.0.0.1:9/bios-1.1.0.bin"}
gpu: {persistence_mode: true}
"""


@asynccontextmanager
async def rack_env(
    tmp_path: Path, specs: list[SimNodeSpec], *, bmc_backend: str = "fake", **config: Any
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet]]:
    profiles = ProfileCatalog()
    profiles.add(parse_profile(yaml.safe_load(PINNED), "test"))
    async with sim_env(
        tmp_path,
        specs,
        bmc_backend=bmc_backend,
        sample_interval=0.3,
        profiles=profiles,
        bmc_power_timeout=30.0,
        **config,
    ) as env:
        yield env.stub, env.fleet


def members(fleet: SimFleet) -> list[fleet_pb2.EnrollNodeRequest]:
    return [enroll_request(fleet, s, leaf=s.leaf) for s in fleet.specs]


async def bring_up(
    stub: fleet_pb2_grpc.FleetServiceStub, **request: Any
) -> tuple[list[fleet_pb2.BringUpProgress], fleet_pb2.BringUpReport]:
    lines = [
        line
        async for line in stub.BringUpRack(
            fleet_pb2.BringUpRackRequest(**request), timeout=STREAM_S
        )
    ]
    assert lines and lines[-1].phase == "done", [(x.node, x.phase, x.message) for x in lines]
    return lines, lines[-1].report


def trays(report: fleet_pb2.BringUpReport) -> list[fleet_pb2.TrayReport]:
    return [t for t in report.trays if t.kind == types_pb2.NODE_KIND_COMPUTE]


@pytest.mark.timeout(240)
async def test_a_whole_nvl72_rack_comes_up_in_one_call(tmp_path: Path) -> None:
    async with rack_env(tmp_path, nvl72_rack(1)) as (stub, fleet):
        lines, report = await bring_up(stub, rack="r01", members=members(fleet))

        assert report.rack_ready, report.reason
        assert len(report.trays) == 18 + 9 + 8
        assert all(t.ok for t in report.trays), [(t.node, t.reason) for t in report.trays]
        assert {t.state for t in report.trays} == {types_pb2.NODE_STATE_READY}
        assert {t.power for t in report.trays} == {types_pb2.POWER_STATE_ON}
        tray_lines = trays(report)
        assert len(tray_lines) == 18
        assert len({t.clique for t in tray_lines}) == 1 and report.fabric_clique
        assert all(t.ready_s > 0 for t in tray_lines)
        assert report.slowest_tray_s == max(t.ready_s for t in tray_lines)

        # Powered in order: every shelf, then every switch tray, then the trays.
        powered = [x.node for x in lines if x.phase == "powered_on"]
        assert [n[:3] for n in powered] == ["psu"] * 8 + ["nvs"] * 9
        last_member = max(i for i, x in enumerate(lines) if x.phase == "powered_on")
        first_tray = min(
            i for i, x in enumerate(lines) if x.node.startswith("gb200") and x.phase != "enrolled"
        )
        assert last_member < first_tray
        # Every BMC says On (the emulator itself: the simulation's own view
        # follows it a watcher pass behind, which a slow machine can show).
        power = await asyncio.to_thread(fleet.read_power)
        assert power == dict.fromkeys(fleet.nodes, "On"), power

        # The rack is handed out whole; its switch trays and shelves never are.
        racks = (await stub.ListRacks(fleet_pb2.ListRacksRequest())).racks
        (r01,) = [r for r in racks if r.name == "r01"]
        assert (r01.nodes, r01.members, r01.gpus, r01.hold) == (18, 17, 72, "")
        alloc = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                key="rack-job", spec=fleet_pb2.AllocationSpec(racks=1)
            )
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY, alloc.reason
        assert sorted(alloc.nodes) == sorted(t.node for t in tray_lines)
        switch = await stub.GetNode(fleet_pb2.GetNodeRequest(name="nvsw-r01-s01"))
        assert switch.kind == types_pb2.NODE_KIND_SWITCH_TRAY and not switch.schedulable
        assert switch.gpu_count == 0 and not switch.agent_connected
        print(
            f"\nNVL72 bring-up: rack ready in {report.elapsed_s:.1f} s; slowest tray "
            f"{report.slowest_tray_s:.1f} s; ratio "
            f"{report.elapsed_s / max(report.slowest_tray_s, 1e-9):.2f}"
        )


@pytest.mark.timeout(240)
async def test_a_rack_provisioned_from_the_catalogue(tmp_path: Path, image_server: str) -> None:
    specs = nvl72_rack(1, trays=3, switch_trays=1, power_shelves=1)
    async with rack_env(tmp_path, specs, image_server=image_server) as (stub, fleet):
        lines, report = await bring_up(stub, rack="r01", members=members(fleet), image="kiln-test")
        assert report.rack_ready, report.reason
        provisioned = {x.node for x in lines if x.phase == "provisioning"}
        assert provisioned == {t.node for t in trays(report)}
        for t in trays(report):
            last = (await fleet.emulator.system(t.node))["Oem"]["KilnSim"]["LastBoot"]
            assert last["Device"] == "Cd" and last["Image"].endswith("kiln-test.iso")
            moves = [
                (d["from_state"], d["to_state"])
                async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node=t.node))
                if e.kind == "node.transition" and (d := json.loads(e.data_json))
            ]
            assert ("provisioning", "inspecting") in moves
        for m in (x for x in report.trays if x.kind != types_pb2.NODE_KIND_COMPUTE):
            assert (await fleet.emulator.system(m.node))["Oem"]["KilnSim"]["BootCount"] == 1


@pytest.mark.timeout(240)
async def test_a_tray_on_other_firmware_is_updated_before_the_rack_is_ready(
    tmp_path: Path,
) -> None:
    specs = nvl72_rack(
        1, trays=4, switch_trays=1, power_shelves=1, bios={1: "1.1.0", 2: "1.1.0", 4: "1.1.0"}
    )
    async with rack_env(tmp_path, specs, bmc_backend="libvirt-test") as (stub, fleet):
        _, report = await bring_up(
            stub, rack="r01", members=members(fleet), profile="rack-baseline"
        )
        assert report.rack_ready, report.reason
        versions = {t.node: t.firmware.get("BIOS") for t in trays(report)}
        assert set(versions.values()) == {"1.1.0"}, versions
        odd = "gb200-r01-t03"
        events = [e async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node=odd))]
        to_ready = [
            json.loads(e.data_json)
            for e in events
            if e.kind == "node.transition" and json.loads(e.data_json)["to_state"] == "ready"
        ]
        assert to_ready and "firmware BIOS 1.0.0 → 1.1.0" in to_ready[0]["changed"]
        for name in ("gb200-r01-t01", "gb200-r01-t02"):
            others = [
                json.loads(e.data_json)
                async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node=name))
                if e.kind == "node.transition"
            ]
            assert not any("firmware" in " ".join(t.get("changed", [])) for t in others)


@pytest.mark.timeout(240)
async def test_a_tray_in_another_fabric_clique_keeps_the_rack_from_work(tmp_path: Path) -> None:
    specs = nvl72_rack(1, trays=4, switch_trays=1, power_shelves=1, odd_clique=(3,))
    async with rack_env(tmp_path, specs) as (stub, fleet):
        lines, report = await bring_up(stub, rack="r01", members=members(fleet))
        odd = "gb200-r01-t03"
        assert not report.rack_ready
        assert odd in report.reason and "fabric clique" in report.reason
        bad = {t.node: t.reason for t in report.trays if not t.ok}
        assert list(bad) == [odd], bad
        assert "differs from the rack's" in bad[odd]
        assert any(x.phase == "failed" and x.node == odd for x in lines)
        assert lines[-1].ready == 3 and lines[-1].total == 4

        for t in trays(report):  # ready, yet held: the rack goes out whole or not at all
            node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=t.node))
            assert node.state == types_pb2.NODE_STATE_READY
            assert not node.schedulable and odd in node.rack_hold
        (r01,) = [r for r in (await stub.ListRacks(fleet_pb2.ListRacksRequest())).racks]
        assert r01.ready == 0 and odd in r01.hold
        alloc = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="j", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_PENDING

        # Once the miscabled tray is retired, the rack comes up with the rest.
        await stub.RemoveNode(fleet_pb2.RemoveNodeRequest(name=odd, force=True))
        _, again = await bring_up(stub, rack="r01")
        assert again.rack_ready, again.reason
        assert len(trays(again)) == 3


@pytest.mark.timeout(120)
async def test_bad_requests_are_refused_before_anything_happens(tmp_path: Path) -> None:
    specs = nvl72_rack(1, trays=2, switch_trays=1, power_shelves=1)
    async with rack_env(tmp_path, specs) as (stub, fleet):
        everyone = members(fleet)

        async def refused(code: grpc.StatusCode, **request: Any) -> str:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await bring_up(stub, **request)
            assert e.value.code() == code, e.value.details()
            return str(e.value.details())

        assert "no compute trays" in await refused(grpc.StatusCode.INVALID_ARGUMENT, rack="r01")
        assert "nope" in await refused(
            grpc.StatusCode.NOT_FOUND, rack="r01", members=everyone, profile="nope"
        )
        elsewhere = fleet_pb2.EnrollNodeRequest()
        elsewhere.CopyFrom(everyone[0])
        elsewhere.rack = "r09"
        assert "r09" in await refused(
            grpc.StatusCode.INVALID_ARGUMENT, rack="r01", members=[elsewhere]
        )
        shelf = next(m for m in everyone if m.kind == types_pb2.NODE_KIND_POWER_SHELF)
        with_profile = fleet_pb2.EnrollNodeRequest()
        with_profile.CopyFrom(shelf)
        with_profile.profile = "rack-baseline"
        assert "takes no profile" in await refused(
            grpc.StatusCode.INVALID_ARGUMENT, rack="r01", members=[with_profile]
        )
        listed = await stub.ListNodes(fleet_pb2.ListNodesRequest())
        assert not listed.nodes, "nothing was enrolled"

        # A tray held by a job: refused with the allocation's id.
        _, report = await bring_up(stub, rack="r01", members=everyone)
        assert report.rack_ready, report.reason
        alloc = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="k", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY
        assert alloc.id in await refused(grpc.StatusCode.FAILED_PRECONDITION, rack="r01")


@pytest.mark.timeout(240)
async def test_an_interrupted_bring_up_keeps_the_rack_held_across_a_restart(
    tmp_path: Path,
) -> None:
    specs = nvl72_rack(1, trays=2, switch_trays=1, power_shelves=1)
    async with rack_env(tmp_path, specs) as (stub, fleet):
        stream = stub.BringUpRack(
            fleet_pb2.BringUpRackRequest(rack="r01", members=members(fleet)), timeout=STREAM_S
        )
        async for line in stream:
            if line.node.startswith("gb200") and line.phase == "enrolled":
                break
        stream.cancel()
        tray = "gb200-r01-t01"

        async def held() -> str:
            for _ in range(100):
                node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=tray))
                if "interrupted" in node.rack_hold:
                    return node.rack_hold
                await asyncio.sleep(0.1)
            return node.rack_hold

        assert "its bring-up was interrupted" in await held()
        assert not (await stub.GetNode(fleet_pb2.GetNodeRequest(name=tray))).schedulable

    # A new controller on the same database: still held, until a bring-up ends well.
    async with rack_env(tmp_path, specs) as (stub, fleet):
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=tray))
        assert "interrupted" in node.rack_hold
        for spec in fleet.specs:  # the new emulator serves the systems on a new port
            await stub.RemoveNode(fleet_pb2.RemoveNodeRequest(name=spec.name, force=True))
        _, report = await bring_up(stub, rack="r01", members=members(fleet))
        assert report.rack_ready, report.reason
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=tray))
        assert node.rack_hold == "" and node.schedulable


@pytest.mark.timeout(240)
async def test_a_second_bring_up_brings_back_a_drained_shelf_and_an_idle_switch(
    tmp_path: Path,
) -> None:
    specs = nvl72_rack(1, trays=2, switch_trays=1, power_shelves=1)
    async with rack_env(tmp_path, specs) as (stub, fleet):
        _, first = await bring_up(stub, rack="r01", members=members(fleet))
        assert first.rack_ready, first.reason
        shelf, switch = "psu-r01-p01", "nvsw-r01-s01"
        await stub.DrainNode(fleet_pb2.DrainNodeRequest(name=shelf, reason="swap a PSU"))
        await stub.PowerNode(
            fleet_pb2.PowerNodeRequest(name=switch, action=types_pb2.POWER_ACTION_OFF)
        )
        for _ in range(100):
            drained = await stub.GetNode(fleet_pb2.GetNodeRequest(name=shelf))
            if drained.state == types_pb2.NODE_STATE_MAINTENANCE:
                break
            await asyncio.sleep(0.1)
        assert drained.state == types_pb2.NODE_STATE_MAINTENANCE
        assert fleet.read_power()[switch] == "Off"

        lines, again = await bring_up(stub, rack="r01")  # adopt what is enrolled
        assert again.rack_ready, again.reason
        assert {x.node for x in lines if x.phase == "powered_on"} == {shelf, switch}
        power = fleet.read_power()
        assert power[shelf] == "On" and power[switch] == "On"
        for name in (shelf, switch):
            node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=name))
            assert node.state == types_pb2.NODE_STATE_READY and not node.schedulable
