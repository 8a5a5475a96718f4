"""``AgentHub.attached_since``: after a power cycle the controller waits for
the agent of the new boot, not a session of the old one still attached; and
``without_agent``, the silent-agent scan's first cut."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.core.agents import AgentHub


@pytest.mark.timeout(10)
async def test_the_old_boots_session_does_not_count_a_new_registration_does() -> None:
    hub = AgentHub()
    old = hub.attach("n1")
    old.attached_at = time.time() - 10.0  # registered before the cycle
    since = time.time()
    waiting = asyncio.create_task(hub.attached_since("n1", since, timeout=5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the old boot's agent was taken for the new one"
    hub.attach("n2")  # another node's agent wakes nothing here
    await asyncio.sleep(0.05)
    assert not waiting.done()
    new = hub.attach("n1")
    assert await asyncio.wait_for(waiting, 1.0) is True
    assert new.attached_at >= since
    assert hub._arrivals == {}


@pytest.mark.timeout(10)
async def test_no_new_agent_within_the_timeout_is_false_and_leaves_no_waiter() -> None:
    hub = AgentHub()
    old = hub.attach("n1")
    old.attached_at = time.time() - 10.0
    assert await hub.attached_since("n1", time.time(), timeout=0.1) is False
    assert await hub.attached_since("n9", time.time(), timeout=0.1) is False  # never connected
    assert hub._arrivals == {}


@pytest.mark.timeout(10)
async def test_an_agent_already_back_is_seen_at_once() -> None:
    hub = AgentHub()
    since = time.time()
    hub.attach("n1")
    assert await hub.attached_since("n1", since, timeout=0.0) is True


@pytest.mark.timeout(10)
async def test_without_agent_names_the_nodes_whose_agent_is_not_connected() -> None:
    hub = AgentHub()
    first = hub.attach("n1")
    hub.attach("n3")
    assert hub.without_agent(["n0", "n1", "n2", "n3"]) == ["n0", "n2"]
    hub.detach(first)
    assert hub.without_agent(["n3", "n1"]) == ["n1"], "in the order given"
