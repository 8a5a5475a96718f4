"""The agent reports at once after it has set its GPUs (``apply_profile``,
``reset_gpus``), not at its next sample a whole interval later: the
controller's health gate waits for a report sampled after its command.

A bare ``grpc.aio`` AgentService on loopback registers the agent with a
60 s sample interval, takes the report it sends on registering, then sends
each command and waits for its result and a report sampled after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import yaml

from agent.client import Agent
from agent.nvml import FakeNvml, open_backend
from controller.sim.ports import free_port
from kiln.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.timeout(60)

INTERVAL = 60.0  # the controller's sample interval: far past this test's waits
PROFILE = yaml.safe_dump(
    {"version": "v1", "name": "train", "persistence_mode": True, "power_limit_w": 600}
)


class Controller(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.commands: asyncio.Queue[agent_pb2.Command] = asyncio.Queue()
        self.results: dict[str, tuple[float, agent_pb2.CommandResult]] = {}
        self.reports: list[tuple[float, agent_pb2.NodeHealth]] = []  # (received, report)
        self.registered = asyncio.Event()

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: object
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        first = await anext(aiter(request_iterator))
        assert first.WhichOneof("body") == "register"
        yield agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=first.register.node_name, sample_interval_s=INTERVAL
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
                self.results[msg.result.id] = (time.time(), msg.result)
            elif body == "health":
                self.reports.append((time.time(), msg.health))


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


@pytest.fixture
async def running() -> AsyncIterator[tuple[Controller, FakeNvml]]:
    port = free_port()
    nvml = open_backend("fake:h200", node_name="h200-prep")
    assert isinstance(nvml, FakeNvml)
    controller = Controller()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(controller, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    agent = Agent(f"127.0.0.1:{port}", "h200-prep", nvml, backoff=(0.1, 0.3))
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(controller.registered.wait(), 30)
        await until(lambda: len(controller.reports) == 1)  # the one sent on registering
        yield controller, nvml
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 30)
        await server.stop(0)


async def command_then_report(controller: Controller, command: agent_pb2.Command) -> None:
    sent = time.time()
    seen = len(controller.reports)
    await controller.commands.put(command)
    await until(lambda: command.id in controller.results)
    answered, result = controller.results[command.id]
    assert result.ok, list(result.failures)
    # Well inside the 60 s interval: a report sampled after the command.
    await until(lambda: len(controller.reports) > seen)
    received, report = controller.reports[seen]
    assert report.sampled_at >= sent
    assert received >= answered  # after the result, so it shows what was set


async def test_a_report_follows_an_applied_profile_at_once(
    running: tuple[Controller, FakeNvml],
) -> None:
    controller, _ = running
    command = agent_pb2.Command(id="p1", apply_profile=agent_pb2.ApplyProfile(profile_yaml=PROFILE))
    await command_then_report(controller, command)
    _, report = controller.reports[-1]
    assert {g.power_limit_w for g in report.gpus} == {600.0}


async def test_a_report_follows_a_reset_to_defaults_at_once(
    running: tuple[Controller, FakeNvml],
) -> None:
    controller, _ = running
    command = agent_pb2.Command(id="r1", reset_gpus=agent_pb2.ResetGpus())
    await command_then_report(controller, command)
