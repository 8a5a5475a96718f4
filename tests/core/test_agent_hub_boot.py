"""``AgentHub.attached_since``: after a power cycle the controller waits for
the agent of the new boot, not a session of the old one still attached; and
``without_agent``, the silent-agent scan's first cut; ``pace``, told at once
where the transport can."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.core.agents import AgentHub
from controller.core.model import ReportInterval


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


@pytest.mark.timeout(10)
async def test_a_pace_is_told_at_once_only_where_nothing_older_could_come_after_it() -> None:
    """``AgentHub.pace``: a session whose transport can tell its agent at
    once is told so; one that holds something not yet sent (an older pace
    may be in it), or whose transport cannot now, gets it in its queue."""
    hub = AgentHub()
    told: dict[str, list[float]] = {"now": [], "busy": [], "refusing": []}
    for name, accepts in (("now", True), ("busy", True), ("refusing", False)):
        session = hub.attach(name)
        session.tell_pace = lambda s, name=name, accepts=accepts: told[name].append(s) or accepts
    plain = hub.attach("plain")  # a transport that cannot: always its queue
    busy = hub.session("busy")
    assert busy is not None
    busy.queue.put_nowait(ReportInterval(30.0))
    assert hub.pace(45.0) == 4
    assert told == {"now": [45.0], "busy": [], "refusing": [45.0]}
    queued = {
        name: [s.queue.get_nowait() for _ in range(s.queue.qsize())]
        for name in ("now", "busy", "refusing", "plain")
        if (s := hub.session(name)) is not None
    }
    assert queued == {
        "now": [],
        "busy": [ReportInterval(30.0), ReportInterval(45.0)],
        "refusing": [ReportInterval(45.0)],
        "plain": [ReportInterval(45.0)],
    }
    assert plain.tell_pace is None
