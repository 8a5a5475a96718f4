"""An agent's call that ends while the controller is sending it commands
detaches the agent's session at once, with the garbage collector off. gRPC
leaves the stream handler unclosed at its ``yield`` here (its cleanup runs
from the generator's finalizer, with GeneratorExit); the call's done
callback detaches the session whether or not that finalizer runs soon."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fleet_waits import enroll_unreachable

from controller.core.errors import Unavailable
from controller.core.model import AgentCommand
from controller.server import ControllerConfig, ControllerServer
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc, types_pb2

NODE = "s00"
COMMANDS = 3000  # with their payloads, far more than a stream's flow-control window
PAYLOAD = "x" * 4000


async def register(name: str) -> AsyncIterator[agent_pb2.AgentMessage]:
    gpu = types_pb2.Gpu(index=0, uuid=f"GPU-{name}", model="NVIDIA H200", memory_mib=141000)
    yield agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[gpu]))
    await asyncio.Event().wait()  # then stay connected, sending nothing


async def connected(channel: grpc.aio.Channel, names: list[str]) -> list[Any]:
    """Enrol ``names`` and open a registered agent call for each."""
    await enroll_unreachable(fleet_pb2_grpc.FleetServiceStub(channel), *names)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    calls = [stub.Connect(register(name)) for name in names]
    for call in calls:
        assert (await call.read()).WhichOneof("body") == "registered"
    return calls


@pytest.mark.timeout(120)
async def test_a_call_cancelled_while_commands_are_sent_detaches_its_session(
    tmp_path: Path,
) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    commands: list[asyncio.Task[object]] = []
    collecting = gc.isenabled()
    try:
        fleet = fleet_pb2_grpc.FleetServiceStub(channel)
        await fleet.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=NODE,
                bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/0",
                username="u",
                password="p",
            )
        )
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(register(NODE))
        first = await call.read()
        assert first.WhichOneof("body") == "registered"
        assert server.fleet is not None
        hub = server.fleet.agents
        assert hub.is_connected(NODE)

        # Commands the agent never reads: the controller's sends stall on
        # flow control, its handler waiting at a yield.
        command = AgentCommand("inject_fault", payload=PAYLOAD)
        commands = [
            asyncio.create_task(hub.call(NODE, command, timeout=60)) for _ in range(COMMANDS)
        ]
        await asyncio.sleep(1.0)
        assert hub.is_connected(NODE)

        gone = asyncio.Event()
        hub.watch(lambda node: gone.set() if not hub.is_connected(node) else None)
        gc.disable()  # only the call's end may detach it, not a collection
        call.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone.wait(), 10)
        assert not hub.is_connected(NODE), "the session outlived its call"
        outcomes = await asyncio.gather(*commands, return_exceptions=True)
        assert all(isinstance(o, Unavailable) for o in outcomes), "every waiting command fails"
    finally:
        if collecting:
            gc.enable()
        for task in commands:
            task.cancel()
        await server.stop()
        await channel.close()


@pytest.mark.timeout(120)
async def test_agents_gone_at_once_leave_no_task_pending(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """When the calls end, no task of theirs is left waiting on a queue
    nobody holds for the collector to destroy still pending (an error logged
    per agent: 3,984 of them when 4,000 agents went at once, when each
    handler read its session's queue in a task of its own)."""
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    names = [f"g{i:02d}" for i in range(20)]
    try:
        calls = await connected(channel, names)
        assert server.fleet is not None
        hub = server.fleet.agents
        assert all(hub.is_connected(name) for name in names)

        caplog.set_level("ERROR", logger="asyncio")
        for call in calls:
            call.cancel()
        deadline = asyncio.get_running_loop().time() + 10
        while any(hub.is_connected(n) for n in names):
            assert asyncio.get_running_loop().time() < deadline, "sessions outlived their calls"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # every handler's cleanup has run
        gc.collect()
        await asyncio.sleep(0)
        destroyed = [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
        assert destroyed == []
    finally:
        await server.stop()
        await channel.close()


@pytest.mark.timeout(120)
async def test_a_stream_waits_in_its_call_and_its_reader_alone_whatever_it_was_sent(
    tmp_path: Path,
) -> None:
    """Each stream's handler reads its session's queue in the call's own
    task: sending an agent a message makes no task (nor the wait set and
    callbacks around one) that lives until the next, which the collector
    would walk meanwhile at every agent's stream after a fleet-wide pace."""
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    names = [f"p{i:02d}" for i in range(10)]
    try:
        calls = await connected(channel, names)
        assert server.fleet is not None
        hub = server.fleet.agents
        for seconds in (15.0, 22.5, 30.0):
            assert hub.pace(seconds) == len(names)
            for call in calls:
                answer = await call.read()
                assert answer.pace.sample_interval_s == seconds
        await asyncio.sleep(0.2)  # every handler is back at its queue

        def running(qualname: str) -> int:
            return sum(
                1
                for t in asyncio.all_tasks()
                if getattr(t.get_coro(), "__qualname__", "") == qualname
            )

        assert running("Queue.get") == 0, "a task per queue read"
        assert running("AgentService._read") == len(names)
        for call in calls:
            call.cancel()
    finally:
        await server.stop()
        await channel.close()
