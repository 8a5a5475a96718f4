"""A controller in this process and a simulated fleet dialling it: the set-up
the end-to-end tests share (the sushy-tools emulator for the BMCs, the NVML
fake for the agents), and enrolment of the simulated nodes through the API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, SimNodeSpec
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

KINDS = {
    "switch_tray": types_pb2.NODE_KIND_SWITCH_TRAY,
    "power_shelf": types_pb2.NODE_KIND_POWER_SHELF,
}


@dataclass
class SimEnv:
    stub: fleet_pb2_grpc.FleetServiceStub
    fleet: SimFleet
    server: ControllerServer
    address: str


@asynccontextmanager
async def sim_env(
    tmp_path: Path,
    specs: Sequence[SimNodeSpec],
    *,
    watch_interval: float = 0.3,
    bmc_backend: str = "fake",
    **config: Any,
) -> AsyncIterator[SimEnv]:
    """A controller on ``tmp_path`` (reconcile every 0.2 s, samples every
    0.5 s unless ``config`` says otherwise) and the fleet of ``specs``."""
    config = {"reconcile_interval": 0.2, "sample_interval": 0.5, **config}
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path, **config))
    address = await server.start()
    fleet = SimFleet(specs, watch_interval=watch_interval, bmc_backend=bmc_backend)
    try:
        await fleet.start(address)
        async with grpc.aio.insecure_channel(address) as channel:
            yield SimEnv(fleet_pb2_grpc.FleetServiceStub(channel), fleet, server, address)
    finally:
        await fleet.stop()
        await server.stop()


def enroll_request(
    fleet: SimFleet, spec: SimNodeSpec, **fields: Any
) -> fleet_pb2.EnrollNodeRequest:
    """Enrolment of one simulated node (its rack; a member's kind); ``fields``
    add to it or override it (leaf, profile, …)."""
    values: dict[str, Any] = {
        "name": spec.name,
        "bmc_url": fleet.bmc_url(spec.name),
        "username": SIM_USERNAME,
        "password": SIM_PASSWORD,
        "rack": spec.rack,
        "kind": KINDS.get(spec.kind, types_pb2.NODE_KIND_COMPUTE),
        **fields,
    }
    return fleet_pb2.EnrollNodeRequest(**values)


async def enroll_all(stub: fleet_pb2_grpc.FleetServiceStub, fleet: SimFleet, **fields: Any) -> None:
    for spec in fleet.specs:
        await stub.EnrollNode(enroll_request(fleet, spec, **fields))
