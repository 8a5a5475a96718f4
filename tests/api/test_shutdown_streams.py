"""A controller stopping with many agent streams open ends them all at once
and records no ``agent disconnected`` event for each: the agents did not go,
the controller did (they register again when it is back)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.server import ControllerConfig, ControllerServer
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc, types_pb2

NODES = 40


async def register(name: str) -> AsyncIterator[agent_pb2.AgentMessage]:
    gpu = types_pb2.Gpu(index=0, uuid=f"GPU-{name}", model="NVIDIA H200", memory_mib=141000)
    yield agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[gpu]))
    await asyncio.Event().wait()  # then stay connected, sending nothing


@pytest.mark.timeout(120)
async def test_stopping_with_streams_open_records_no_disconnect_per_agent(tmp_path: Path) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    streams = []
    try:
        fleet = fleet_pb2_grpc.FleetServiceStub(channel)
        for i in range(NODES):
            await fleet.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=f"s{i:02d}",
                    bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{i}",
                    username="u",
                    password="p",
                )
            )
        agents = agent_pb2_grpc.AgentServiceStub(channel)
        for i in range(NODES):
            call = agents.Connect(register(f"s{i:02d}"))
            first = await call.read()
            assert first.WhichOneof("body") == "registered"
            streams.append(call)
        assert server.fleet is not None and server.fleet.agents.count() == NODES
    finally:
        await server.stop()
        for call in streams:
            call.cancel()
        await channel.close()
    store = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    try:
        events = await store.read(lambda tx: tx.events.since(0, limit=10_000))
    finally:
        store.close()
    reasons = [e.reason for e in events if e.kind == "node.agent"]
    assert reasons.count("agent connected") == NODES
    assert "agent disconnected" not in reasons


@pytest.mark.timeout(60)
async def test_a_stuck_shutdown_step_is_named_and_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A step of ``stop`` that never ends (here the fleet's loops) is given up
    after its limit and logged by name; the store and the state directory's
    lock are still given back, so the next controller starts."""
    import controller.server as server_module

    monkeypatch.setattr(server_module, "STOP_STEP_S", 0.5)
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    await server.start()
    assert server.fleet is not None
    stuck = asyncio.Event()

    async def never_stops() -> None:
        stuck.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(server.fleet, "stop", never_stops)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(server.stop(), 30)
    assert stuck.is_set()
    assert asyncio.get_running_loop().time() - began < 10
    assert "the fleet's loops did not stop within" in caplog.text
    assert server.store is None
    again = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    try:
        await again.start()  # the lock was released
    finally:
        await again.stop()
