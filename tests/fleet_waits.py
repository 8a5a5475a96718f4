"""Waiting on a live controller until the fleet or an allocation gets somewhere,
and enrolling the nodes to wait on.

Shared by the end-to-end tests; each wait fails with what it last saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from controller.cli.pages import every_page_async
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

Stub = fleet_pb2_grpc.FleetServiceStub


async def enroll_unreachable(
    stub: Stub, *names: str, metadata: tuple[tuple[str, str], ...] = ()
) -> None:
    """Enrol ``names`` with BMCs on a loopback port where nothing listens
    (their agents are what the tests are about)."""
    for name in names:
        await stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=name,
                bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{name}",
                username="u",
                password="p",
            ),
            metadata=metadata or None,
        )


async def wait_all_ready(stub: Stub, within: float = 60.0) -> list[fleet_pb2.Node]:
    """Every enrolled node ready and schedulable."""
    deadline = time.monotonic() + within
    while True:
        nodes = await every_page_async(stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes")
        if nodes and all(n.state == types_pb2.NODE_STATE_READY and n.schedulable for n in nodes):
            return nodes
        if time.monotonic() > deadline:
            raise AssertionError(
                "not ready: "
                + ", ".join(
                    f"{n.name}={types_pb2.NodeState.Name(n.state)}:{n.state_reason}"
                    for n in nodes
                    if n.state != types_pb2.NODE_STATE_READY or not n.schedulable
                )
            )
        await asyncio.sleep(0.2)


async def wait_node(
    stub: Stub, name: str, check: Callable[[fleet_pb2.Node], bool], within: float = 60.0
) -> fleet_pb2.Node:
    deadline = time.monotonic() + within
    while True:
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=name))
        if check(node):
            return node
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{name}: {types_pb2.NodeState.Name(node.state)} ({node.state_reason})"
            )
        await asyncio.sleep(0.2)


async def wait_node_state(
    stub: Stub, name: str, state: int, within: float = 60.0
) -> fleet_pb2.Node:
    return await wait_node(stub, name, lambda n: n.state == state, within)


async def wait_allocation(
    stub: Stub, ident: str, state: int, within: float = 30.0
) -> fleet_pb2.Allocation:
    deadline = time.monotonic() + within
    while True:
        alloc = await stub.GetAllocation(fleet_pb2.GetAllocationRequest(id=ident))
        if alloc.state == state:
            return alloc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{ident}: {fleet_pb2.AllocationState.Name(alloc.state)} ({alloc.reason})"
            )
        await asyncio.sleep(0.2)


async def enroll_sim_fleet(stub: Stub, fleet: Any) -> None:
    """Enrol every node of a ``controller.sim.fleet.SimFleet`` with its BMC."""
    from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME

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
