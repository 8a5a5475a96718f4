"""A fleet's agents registering at once are all heard by the controller.

gRPC holds calls that arrive faster than the server takes them up, and by
default sheds them past 1,000 waiting (INTERNAL, or CANCELLED later): a
fleet reconnecting after a controller restart is thousands of calls in the
same second. Here 3,000 agent streams open at once against a real
controller; every one must get the controller's own answer (NOT_FOUND: the
nodes were never enrolled, which costs each call a database read), none a
refusal from gRPC. With gRPC's defaults about a quarter were refused.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.server import ControllerConfig, ControllerServer
from kiln.v1 import agent_pb2, agent_pb2_grpc, types_pb2

CALLS = 3000


async def register(name: str) -> AsyncIterator[agent_pb2.AgentMessage]:
    gpu = types_pb2.Gpu(index=0, uuid=f"GPU-{name}", model="NVIDIA H200", memory_mib=141000)
    yield agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[gpu]))
    await asyncio.Event().wait()


@pytest.mark.timeout(180)
async def test_thousands_of_agents_registering_at_once_all_get_the_controllers_answer(
    tmp_path: Path,
) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    outcomes: Counter[str] = Counter()
    details: Counter[str] = Counter()

    async def one(i: int) -> None:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(register(f"storm-{i:05d}"))
        try:
            first = await call.read()
            outcomes["answered" if first is not grpc.aio.EOF else "EOF"] += 1
        except grpc.aio.AioRpcError as e:
            outcomes[e.code().name] += 1
            details[e.details() or ""] += 1
        finally:
            call.cancel()

    try:
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CALLS))), 150)
    finally:
        await channel.close()
        await server.stop()
    assert outcomes == {"NOT_FOUND": CALLS}, (outcomes, details.most_common(3))
    assert all("never enrolled" in d or "not found" in d.lower() for d in details), details
