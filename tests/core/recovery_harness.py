"""A simulated HGX fleet for the recovery-action tests, on real peers.

``recovery_fleet(tmp_path)`` starts a ControllerServer (the shipped default
rule set unless given another; simulation on, so faults can be injected
through ``InjectFault``) and a SimFleet of HGX H200 nodes: the sushy-tools
Redfish emulator is every node's BMC, and each node's agent runs on the NVML
fake of an H200. Every node is enrolled and ready before the harness is
handed over. Node states come back over gRPC, events from the controller's
event log, GPU state from the fake through NVML.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pynvml

from controller.core.fleet import Fleet
from controller.core.model import EventInfo
from controller.policies import RuleSet
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, SimNode, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

S = types_pb2


def state(node: fleet_pb2.Node) -> str:
    return str(S.NodeState.Name(node.state)).removeprefix("NODE_STATE_").lower()


class RecoveryHarness:
    def __init__(
        self, server: ControllerServer, fleet: SimFleet, stub: fleet_pb2_grpc.FleetServiceStub
    ) -> None:
        self.server = server
        self.fleet = fleet
        self.stub = stub

    @property
    def core(self) -> Fleet:
        assert self.server.fleet is not None
        return self.server.fleet

    def sim(self, name: str) -> SimNode:
        return self.fleet.nodes[name]

    async def node(self, name: str) -> fleet_pb2.Node:
        return await self.stub.GetNode(fleet_pb2.GetNodeRequest(name=name))

    async def wait_node(
        self, name: str, match: Callable[[fleet_pb2.Node], bool], within: float = 30.0
    ) -> fleet_pb2.Node:
        deadline = time.monotonic() + within
        while True:
            node = await self.node(name)
            if match(node):
                return node
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} stuck: state={state(node)} reason={node.state_reason!r} "
                    f"agent={node.agent_connected}"
                )
            await asyncio.sleep(0.1)

    async def wait_ready(self, name: str, within: float = 30.0) -> fleet_pb2.Node:
        return await self.wait_node(name, lambda n: state(n) == "ready" and n.schedulable, within)

    async def inject(self, node: str, **fault: Any) -> None:
        """A fault in the node's fake NVML, through the API (``InjectFault``)."""
        reply = await self.stub.InjectFault(
            fleet_pb2.InjectFaultRequest(node=node, fault_json=json.dumps(fault))
        )
        assert reply.ok, reply.message

    def recovery_field(self, node: str, gpu: int) -> int:
        """The GPU's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, read from the fake."""
        nvml = self.sim(node).nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
        (value,) = nvml.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        )
        return int(value.value.uiVal)

    async def events(self, node: str, kind: str = "") -> list[EventInfo]:
        found = await self.core.events.since(0, node=node, limit=10_000)
        return [e for e in found if not kind or e.kind == kind]

    async def wait_event(
        self, node: str, match: Callable[[EventInfo], bool], within: float = 30.0
    ) -> EventInfo:
        deadline = time.monotonic() + within
        while True:
            for event in await self.events(node):
                if match(event):
                    return event
            if time.monotonic() > deadline:
                last = [(e.kind, e.data.get("action"), e.reason) for e in await self.events(node)]
                raise AssertionError(f"no such event on {node}; last: {last[-12:]}")
            await asyncio.sleep(0.1)

    async def outcomes(self, node: str, action: str) -> list[str]:
        """The outcomes of the node's ``policy.action`` events of ``action``."""
        return [
            str(e.data.get("outcome"))
            for e in await self.events(node, "policy.action")
            if e.data.get("action") == action
        ]

    async def transitions(self, node: str) -> list[str]:
        """The states the node moved to, in order."""
        return [str(e.data["to_state"]) for e in await self.events(node, "node.transition")]

    async def allocate(self, key: str) -> fleet_pb2.Allocation:
        alloc = await self.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                key=key, spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")
            )
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY, alloc.reason
        return alloc

    async def release(self, ident: str) -> None:
        await self.stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=ident))


@contextlib.asynccontextmanager
async def recovery_fleet(
    tmp_path: Path, *, rules: RuleSet | None = None, nodes: int = 2, power_delay: bool = False
) -> AsyncIterator[RecoveryHarness]:
    """Controller and ``nodes`` ready HGX H200 nodes (``h200-n01`` ...).
    ``power_delay``: the emulator's power changes land 1-11 s late, as real
    BMCs' do, so a power cycle shows as off, then on."""
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.3,
            rules=rules,
            simulation=True,
        )
    )
    address = await server.start()
    fleet = SimFleet(
        default_fleet(nvl72_racks=0, hgx_nodes=nodes),
        watch_interval=0.2,
        power_delay=power_delay,
    )
    try:
        await fleet.start(address)
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
            harness = RecoveryHarness(server, fleet, stub)
            for spec in fleet.specs:
                await harness.wait_ready(spec.name, within=60.0)
            yield harness
    finally:
        await fleet.stop()
        await server.stop()
