"""Monitoring does not wait for the control plane: an agent with no
controller to talk to samples and serves its metrics from start-up, keeps
the XIDs it sees, and sends them with its first report once a controller
registers it.

The controller here is a bare ``grpc.aio`` AgentService on loopback that
answers ``Registered`` and records what the agent sends (the agent's wire
contract, without a database), started only after the agent has run alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from agent.client import Agent
from agent.metrics import AgentMetrics
from agent.nvml import open_backend
from controller.sim.ports import free_port
from kiln.v1 import agent_pb2, agent_pb2_grpc


class RecordingController(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.health: list[agent_pb2.AgentMessage] = []
        self.registered = asyncio.Event()

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: object
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        first = await anext(aiter(request_iterator))
        assert first.WhichOneof("body") == "register"
        yield agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=first.register.node_name, sample_interval_s=0.2
            )
        )
        self.registered.set()
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "health":
                self.health.append(msg)


async def until(check, within: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(90)
async def test_metrics_before_any_controller_and_xids_kept_until_one_registers() -> None:
    port = free_port()
    nvml = open_backend("fake:h200", node_name="lonely")
    metrics = AgentMetrics("lonely")
    agent = Agent(
        f"127.0.0.1:{port}",
        "lonely",
        nvml,
        metrics=metrics,
        backoff=(0.1, 0.3),
        sample_interval=0.1,
    )
    metrics_port = await metrics.start("127.0.0.1", 0)
    running = asyncio.create_task(agent.run())
    server = None
    try:
        # Alone: sampled and served, though nothing answers at the controller's address.
        await until(lambda: agent.samples >= 2)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as reply:
                text = await reply.text()
        temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
        assert len(temps) == 8 and 'Hostname="lonely"' in temps[0]
        assert not agent.registered.is_set()

        nvml.faults.apply_fault({"kind": "xid", "gpu": 1, "code": 79})  # type: ignore[attr-defined]
        nvml.faults.apply_fault({"kind": "xid", "gpu": 3, "code": 94})  # type: ignore[attr-defined]
        await until(lambda: len(agent._away_xids) == 2)
        await asyncio.sleep(0.3)  # more samples while away: the XIDs stay kept
        assert sorted(agent._away_xids) == [(1, 79), (3, 94)]

        recorder = RecordingController()
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(recorder, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await asyncio.wait_for(recorder.registered.wait(), 30)
        await until(lambda: len(recorder.health) >= 3)
        first = recorder.health[0].health
        xids = {g.index: list(g.xids) for g in first.gpus}
        assert xids[1] == [79] and xids[3] == [94]  # seen while away, sent at once
        later = [list(g.xids) for m in recorder.health[1:] for g in m.health.gpus]
        assert not any(later)  # sent once, not again
        assert not agent._away_xids
    finally:
        await agent.stop()
        await asyncio.wait_for(running, 30)
        await metrics.stop()
        if server is not None:
            await server.stop(0)
