"""A driver reload forgets clock locks and power limits: the agent notices,
re-applies its profile, and the controller records the drift."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
from fleet_waits import wait_node_state

from agent.prepare import check_drift
from controller.core.profiles import ProfileCatalog
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2
from kiln_common.gpu_profile import GpuProfile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


async def test_driver_reload_drift_is_repaired_and_reported(tmp_path: Path) -> None:
    catalog = ProfileCatalog.load(PROFILES)
    profile = GpuProfile.from_yaml(catalog.gpu_yaml("h200-locked-clocks"))
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.2,
            profiles=catalog,
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=0, hgx_nodes=1), watch_interval=0.3)
    await fleet.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name="h200-n01",
                    bmc_url=fleet.bmc_url("h200-n01"),
                    username=SIM_USERNAME,
                    password=SIM_PASSWORD,
                    rack="r1",
                    profile="h200-locked-clocks",
                )
            )
            await wait_node_state(stub, "h200-n01", types_pb2.NODE_STATE_READY)
            nvml = fleet.nodes["h200-n01"].nvml
            assert check_drift(nvml, profile) == []
            nvml.driver_reload()  # the agent's NVML session is gone with it
            deadline = time.monotonic() + 20
            drift: list[dict[str, object]] = []
            while not drift:
                assert time.monotonic() < deadline, "no node.gpu_drift event"
                await asyncio.sleep(0.2)
                events = stub.WatchEvents(fleet_pb2.WatchEventsRequest(node="h200-n01"))
                drift = [
                    json.loads(e.data_json) async for e in events if e.kind == "node.gpu_drift"
                ]
            assert drift[0]["profile"] == "h200-locked-clocks"
            assert any("clock" in d or "power" in d for d in drift[0]["drift"])  # type: ignore[attr-defined]
            nvml.nvmlInit()
            try:
                assert check_drift(nvml, profile) == [], "the agent re-applied the profile"
            finally:
                nvml.nvmlShutdown()
            node = await stub.GetNode(fleet_pb2.GetNodeRequest(name="h200-n01"))
            assert node.state == types_pb2.NODE_STATE_READY
    finally:
        await fleet.stop()
        await server.stop()
