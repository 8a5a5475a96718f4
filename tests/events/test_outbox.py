"""The in-memory outbox: ordering, marking, and resuming from a sequence number."""

from __future__ import annotations

import asyncio

from controller.events import Event, MemoryOutbox


async def filled(n: int) -> MemoryOutbox:
    outbox = MemoryOutbox()
    for i in range(n):
        await outbox.append("node.transition", node=f"n{i}", reason=f"r{i}", at=float(i))
    return outbox


async def test_append_assigns_increasing_seq() -> None:
    outbox = await filled(3)
    events = await outbox.since(0)
    assert [e.seq for e in events] == [1, 2, 3]
    assert [e.node for e in events] == ["n0", "n1", "n2"]
    assert len(outbox) == 3


async def test_unpublished_in_order_with_limit_and_marking() -> None:
    outbox = await filled(5)
    assert [e.seq for e in await outbox.unpublished(2)] == [1, 2]
    await outbox.mark_published([2, 4])
    assert [e.seq for e in await outbox.unpublished(10)] == [1, 3, 5]
    await outbox.mark_published([1, 3, 5, 99])  # unknown seq ignored
    assert await outbox.unpublished(10) == []
    assert outbox.published_count == 5
    await outbox.mark_published([1])  # idempotent
    assert outbox.published_count == 5


async def test_since_returns_only_later_events() -> None:
    outbox = await filled(6)
    assert [e.seq for e in await outbox.since(4)] == [5, 6]
    assert [e.seq for e in await outbox.since(1, limit=2)] == [2, 3]
    assert await outbox.since(6) == []
    assert [e.seq for e in await outbox.since(-5)] == [1, 2, 3, 4, 5, 6]


async def test_follow_resumes_after_seq_and_waits_for_new_events() -> None:
    outbox = await filled(4)
    seen: list[Event] = []

    async def consume() -> None:
        async for event in outbox.follow(after=2):
            seen.append(event)
            if event.seq == 6:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    assert [e.seq for e in seen] == [3, 4]
    await outbox.append("node.power", node="n9")
    await outbox.append("node.power", node="n10")
    await asyncio.wait_for(task, timeout=2)
    assert [e.seq for e in seen] == [3, 4, 5, 6]
