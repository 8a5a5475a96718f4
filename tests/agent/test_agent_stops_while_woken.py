"""An agent stops even when its monitor is cancelled in the same loop turn
that wakes it (a command's result, a registration).

On Python 3.11, ``asyncio.wait_for`` returns the awaited result and drops a
cancellation that arrives as the awaited thing completes (CPython gh-86296):
the monitor, waiting on its wake event that way, ran on after ``stop()``,
and ``Agent.run`` waited for it forever (the in-process demo hung at its
shutdown). The monitor now waits under ``asyncio.timeout``; ruff's TID251
bans ``asyncio.wait_for`` from the services.
"""

from __future__ import annotations

import asyncio

import pytest
from bare_controller import BareController, serving, until

from agent.client import Agent
from agent.nvml import open_backend

pytestmark = pytest.mark.timeout(60)


async def test_a_monitor_cancelled_as_it_is_woken_ends() -> None:
    nvml = open_backend("fake:h200", node_name="h200-woken")
    controller = BareController(60.0)
    async with serving(controller) as port:
        agent = Agent(f"127.0.0.1:{port}", "h200-woken", nvml, backoff=(0.1, 0.3))
        run = asyncio.create_task(agent.run())
        try:
            async with asyncio.timeout(30):
                await controller.registered.wait()
            await until(lambda: len(controller.health) == 1)  # the report on registering
            monitor = next(
                t for t in asyncio.all_tasks() if t.get_name() == "kiln-monitor-h200-woken"
            )
            # Waiting out its 60 s interval; woken and cancelled in one turn.
            agent._wake.set()
            monitor.cancel()
            async with asyncio.timeout(5):
                await asyncio.gather(monitor, return_exceptions=True)
            assert monitor.cancelled()
        finally:
            await agent.stop()
            async with asyncio.timeout(30):
                await run
