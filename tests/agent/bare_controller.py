"""A bare ``grpc.aio`` AgentService on loopback for the agent's own tests:
it registers one agent with a given sample interval, sends it the commands
put on ``commands``, and records what the agent sends with the time each
arrived (the agent's wire contract, without a database)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc

from controller.sim.ports import free_port
from kiln.v1 import agent_pb2, agent_pb2_grpc


class BareController(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, sample_interval: float) -> None:
        self.sample_interval = sample_interval
        self.commands: asyncio.Queue[agent_pb2.Command] = asyncio.Queue()
        self.results: dict[str, agent_pb2.CommandResult] = {}
        self.answered_at: dict[str, float] = {}  # command id -> when its result arrived
        self.health: list[agent_pb2.AgentMessage] = []
        self.received_at: list[float] = []  # when each of ``health`` arrived
        self.registered = asyncio.Event()

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: object
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        first = await anext(aiter(request_iterator))
        assert first.WhichOneof("body") == "register"
        yield agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=first.register.node_name, sample_interval_s=self.sample_interval
            )
        )
        self.registered.set()
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while True:
                yield agent_pb2.ControllerMessage(command=await self.commands.get())
        finally:
            reader.cancel()

    async def _read(self, messages: AsyncIterator[agent_pb2.AgentMessage]) -> None:
        async for msg in messages:
            body = msg.WhichOneof("body")
            if body == "result":
                self.results[msg.result.id] = msg.result
                self.answered_at[msg.result.id] = time.time()
            elif body == "health":
                self.health.append(msg)
                self.received_at.append(time.time())


@asynccontextmanager
async def serving(controller: BareController, port: int = 0) -> AsyncIterator[int]:
    """``controller`` served on loopback at ``port`` (a free one for 0),
    yielded, until the block ends."""
    port = port or free_port()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(controller, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def until(check: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)
