"""The agent reports at once after it has set its GPUs (``apply_profile``,
``reset_gpus``), not at its next sample a whole interval later: the
controller's health gate waits for a report sampled after its command.

A bare ``grpc.aio`` AgentService on loopback (``bare_controller``)
registers the agent with a 60 s sample interval, takes the report it sends
on registering, then sends each command and waits for its result and a
report sampled after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import yaml
from bare_controller import BareController, serving, until

from agent.client import Agent
from agent.nvml import FakeNvml, open_backend
from kiln.v1 import agent_pb2

pytestmark = pytest.mark.timeout(60)

INTERVAL = 60.0  # the controller's sample interval: far past this test's waits
PROFILE = yaml.safe_dump(
    {"version": "v1", "name": "train", "persistence_mode": True, "power_limit_w": 600}
)


@pytest.fixture
async def running() -> AsyncIterator[BareController]:
    nvml = open_backend("fake:h200", node_name="h200-prep")
    assert isinstance(nvml, FakeNvml)
    controller = BareController(INTERVAL)
    async with serving(controller) as port:
        agent = Agent(f"127.0.0.1:{port}", "h200-prep", nvml, backoff=(0.1, 0.3))
        task = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(controller.registered.wait(), 30)
            await until(lambda: len(controller.health) == 1)  # the one sent on registering
            yield controller
        finally:
            await agent.stop()
            await asyncio.wait_for(task, 30)


async def command_then_report(
    controller: BareController, command: agent_pb2.Command
) -> agent_pb2.NodeHealth:
    """Send ``command``; the first report after it (well inside the 60 s
    interval, sampled after the command and sent after its result)."""
    sent = time.time()
    seen = len(controller.health)
    await controller.commands.put(command)
    await until(lambda: command.id in controller.results, within=10)
    result = controller.results[command.id]
    assert result.ok, list(result.failures)
    await until(lambda: len(controller.health) > seen, within=10)
    report = controller.health[seen].health
    assert report.sampled_at >= sent
    assert controller.received_at[seen] >= controller.answered_at[command.id]
    return report


async def test_a_report_follows_an_applied_profile_at_once(running: BareController) -> None:
    command = agent_pb2.Command(id="p1", apply_profile=agent_pb2.ApplyProfile(profile_yaml=PROFILE))
    report = await command_then_report(running, command)
    assert {g.power_limit_w for g in report.gpus} == {600.0}


async def test_a_report_follows_a_reset_to_defaults_at_once(running: BareController) -> None:
    command = agent_pb2.Command(id="r1", reset_gpus=agent_pb2.ResetGpus())
    await command_then_report(running, command)
