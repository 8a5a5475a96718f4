"""The whole controller on a real PostgreSQL server, not only the store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy import create_engine, text

from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2


@pytest.fixture
async def pg_controller(postgres_url: str) -> AsyncIterator[str]:
    engine = create_engine(postgres_url)
    with engine.begin() as conn:  # a fresh schema for this test
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0", db_url=postgres_url, reconcile_interval=0.2, sample_interval=0.5
        )
    )
    address = await server.start()
    try:
        yield address
    finally:
        await server.stop()


async def test_fleet_lifecycle_and_allocations_on_postgresql(pg_controller: str) -> None:
    fleet = SimFleet(default_fleet(nvl72_racks=1, hgx_nodes=1, trays=3), watch_interval=0.3)
    await fleet.start(pg_controller)
    try:
        async with grpc.aio.insecure_channel(pg_controller) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for spec in fleet.specs:
                await stub.EnrollNode(
                    fleet_pb2.EnrollNodeRequest(
                        name=spec.name,
                        bmc_url=fleet.bmc_url(spec.name),
                        username=SIM_USERNAME,
                        password=SIM_PASSWORD,
                        rack=spec.rack,
                    )
                )
            deadline = time.monotonic() + 60
            while True:
                nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
                if all(n.state == types_pb2.NODE_STATE_READY and n.schedulable for n in nodes):
                    break
                assert time.monotonic() < deadline, [(n.name, n.state_reason) for n in nodes]
                await asyncio.sleep(0.2)
            spec = fleet_pb2.AllocationSpec(racks=1)
            first = await stub.CreateAllocation(
                fleet_pb2.CreateAllocationRequest(key="pg", spec=spec)
            )
            again = await stub.CreateAllocation(
                fleet_pb2.CreateAllocationRequest(key="pg", spec=spec)
            )
            assert first.state == fleet_pb2.ALLOCATION_STATE_READY and len(first.nodes) == 3
            assert again.id == first.id
            released = await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=first.id))
            assert released.state == fleet_pb2.ALLOCATION_STATE_RELEASED
            seqs = [e.seq async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest())]
            assert seqs == sorted(set(seqs)) and len(seqs) > 10
    finally:
        await fleet.stop()
