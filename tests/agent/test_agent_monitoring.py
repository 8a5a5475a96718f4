"""Monitoring does not wait for the control plane: an agent with no
controller to talk to samples and serves its metrics from start-up, keeps
the XIDs it sees, and sends them with its first report once a controller
registers it.

The controller here is a bare ``grpc.aio`` AgentService on loopback
(``bare_controller``) that
answers ``Registered`` and records what the agent sends (the agent's wire
contract, without a database), started only after the agent has run alone.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from bare_controller import BareController, serving, until

from agent.client import Agent
from agent.metrics import AgentMetrics
from agent.nvml import open_backend
from controller.sim.ports import free_port


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

        recorder = BareController(sample_interval=0.2)
        async with serving(recorder, port):
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
