"""Preparing a node to a profile whose firmware and BIOS differ: the update
goes through the emulator's UpdateService, the new version is verified, the
BIOS attribute is set and applied by a power cycle — all before the node is
ready. A baseline the BMC cannot reach quarantines the node with the reason."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from bmc_peers import redfishtool_system
from fleet_waits import wait_node_state
from sim_env import sim_env

from controller.core.profiles import ProfileCatalog, parse_profile
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

PROFILES = [
    """
version: v1
name: pinned
firmware:
  - {component: BIOS, version: "1.1.0", image: "http://127.0.0.1:9/bios-1.1.0.bin"}
bios: {ProcTurboMode: Disabled}
gpu: {persistence_mode: true}
health_gate: {max_gpu_temp_c: 80}
""",
    """
version: v1
name: impossible
firmware:
  - {component: BIOS, version: "9.9.9", image: "http://127.0.0.1:9/bios-9.9.9.bin"}
""",
]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet]]:
    profiles = ProfileCatalog()
    for text in PROFILES:
        profiles.add(parse_profile(yaml.safe_load(text), "test"))
    specs = default_fleet(nvl72_racks=0, hgx_nodes=2)
    async with sim_env(
        tmp_path,
        specs,
        bmc_backend="libvirt-test",
        sample_interval=0.3,
        profiles=profiles,
        bmc_power_timeout=30.0,
    ) as e:
        yield e.stub, e.fleet


async def test_firmware_and_bios_reach_the_baseline_before_the_node_is_ready(
    env: tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet],
) -> None:
    stub, fleet = env
    before = await redfishtool_system(fleet.emulator, "h200-n01", SIM_USERNAME, SIM_PASSWORD)
    assert before["BiosVersion"] == "1.0.0"
    await stub.EnrollNode(
        fleet_pb2.EnrollNodeRequest(
            name="h200-n01",
            bmc_url=fleet.bmc_url("h200-n01"),
            username=SIM_USERNAME,
            password=SIM_PASSWORD,
            rack="r1",
            profile="pinned",
        )
    )
    node = await wait_node_state(stub, "h200-n01", types_pb2.NODE_STATE_READY)
    assert node.state_reason == "prepared to pinned"
    after = await redfishtool_system(fleet.emulator, "h200-n01", SIM_USERNAME, SIM_PASSWORD)
    assert after["BiosVersion"] == "1.1.0", "updated through UpdateService and verified"
    transitions = [
        json.loads(e.data_json)
        async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node="h200-n01"))
        if e.kind == "node.transition"
    ]
    ready = next(t for t in transitions if t["to_state"] == "ready")
    assert "firmware BIOS 1.0.0 → 1.1.0" in ready["changed"]
    assert any(c.startswith("BIOS staged: ProcTurboMode") for c in ready["changed"])
    assert "power-cycled to apply firmware/BIOS" in ready["changed"]
    # The GPU settings went to the agent of the boot the power cycle began:
    # sent to the old boot's agent, the reboot would have forgotten them.
    nvml = fleet.nodes["h200-n01"].nvml
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        assert (
            [nvml.nvmlDeviceGetPersistenceMode(h) for h in handles] == [1] * len(handles) == [1] * 8
        )
    finally:
        nvml.nvmlShutdown()


async def test_unreachable_baseline_quarantines_with_the_reason(
    env: tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet],
) -> None:
    stub, fleet = env
    await stub.EnrollNode(
        fleet_pb2.EnrollNodeRequest(
            name="h200-n02",
            bmc_url=fleet.bmc_url("h200-n02"),
            username=SIM_USERNAME,
            password=SIM_PASSWORD,
            rack="r1",
            profile="impossible",
        )
    )
    node = await wait_node_state(stub, "h200-n02", types_pb2.NODE_STATE_QUARANTINED)
    assert "cannot reach profile impossible" in node.state_reason
    assert "9.9.9" in node.state_reason
    assert not node.schedulable
