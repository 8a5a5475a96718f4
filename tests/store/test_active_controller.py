"""One active controller per database: a second one waits as a standby and
takes over when the first goes away; agents move over with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from fleet_waits import wait_node
from sqlalchemy import create_engine, text

from agent.client import Agent
from agent.nvml import open_backend
from controller.server import ControllerConfig, ControllerServer
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


async def standby_takes_over(config_a: ControllerConfig, config_b: ControllerConfig) -> None:
    first = ControllerServer(config_a)
    second = ControllerServer(config_b)
    a = await first.start()
    async with grpc.aio.insecure_channel(a) as channel:
        await fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name="n1",
                username="u",
                password="p",
                bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
            )
        )
    waiting = asyncio.create_task(second.start())
    await asyncio.sleep(2.5)
    assert not waiting.done(), "a second controller must not run beside the active one"
    await first.stop()
    b = await asyncio.wait_for(waiting, 20)
    try:
        async with grpc.aio.insecure_channel(b) as channel:
            node = await fleet_pb2_grpc.FleetServiceStub(channel).GetNode(
                fleet_pb2.GetNodeRequest(name="n1")
            )
        assert node.name == "n1", "the standby serves the same state"
    finally:
        await second.stop()


async def test_sqlite_standby_waits_for_the_file_lock(tmp_path: Path) -> None:
    def config() -> ControllerConfig:
        return ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path)

    await standby_takes_over(config(), config())


async def test_postgresql_standby_takes_over_through_the_advisory_lock(
    postgres_url: str, tmp_path: Path
) -> None:
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    key = tmp_path / "shared-secret.key"

    def config() -> ControllerConfig:
        return ControllerConfig(listen="127.0.0.1:0", db_url=postgres_url, secret_key_file=key)

    await standby_takes_over(config(), config())


async def test_an_agent_moves_to_the_standby_when_the_active_controller_stops(
    tmp_path: Path,
) -> None:
    from controller.sim.ports import free_port

    ports = [free_port(), free_port()]
    first = ControllerServer(ControllerConfig(listen=f"127.0.0.1:{ports[0]}", state_dir=tmp_path))
    second = ControllerServer(ControllerConfig(listen=f"127.0.0.1:{ports[1]}", state_dir=tmp_path))
    await first.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
        await fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name="n1",
                username="u",
                password="p",
                bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
            )
        )
    agent = Agent(
        ",".join(f"127.0.0.1:{p}" for p in ports),
        "n1",
        open_backend("fake:h200", node_name="n1"),
        backend="fake:h200",
        backoff=(0.1, 0.5),
    )
    running = asyncio.create_task(agent.run())
    waiting = asyncio.create_task(second.start())
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
        assert agent.controller == f"127.0.0.1:{ports[0]}"
        await first.stop()
        await asyncio.wait_for(waiting, 20)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[1]}") as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            node = await wait_node(stub, "n1", lambda n: n.agent_connected, within=20)
        assert node.gpu_count == 8 and agent.controller == f"127.0.0.1:{ports[1]}"
    finally:
        await agent.stop()
        await asyncio.gather(running, return_exceptions=True)
        if not waiting.done():
            waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await second.stop()
