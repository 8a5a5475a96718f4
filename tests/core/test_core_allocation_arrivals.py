"""Requests stored by the scheduling pass that decides them: concurrent
creates in one pass, keys reused from allocations the controller no longer
holds in memory, queue positions across a restart, and a failed pass
(on the in-memory store and on SQLite)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks

from controller.core.errors import AlreadyExists, KilnError
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec
from controller.core.states import AllocationState

pytestmark = pytest.mark.timeout(60)

TRAYS = [f"r1-t{i}" for i in range(1, 5)]


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        racks = Racks(fleet, stack)
        yield fleet, racks
        await fleet.stop()


async def created_events(f: Fleet) -> list[Any]:
    return [e for e in await f.events.since(0) if e.kind == "allocation.created"]


async def test_concurrent_requests_are_decided_in_call_order_with_one_event_each(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    answers = await asyncio.gather(
        *(f.create_allocation(f"job-{i}", AllocationSpec(nodes=1)) for i in range(6))
    )
    ready = [a for a in answers if a.state == AllocationState.READY]
    waiting = [a for a in answers if a.state == AllocationState.PENDING]
    # Four nodes: the first four callers got one each, the last two wait.
    assert [a.key for a in ready] == [f"job-{i}" for i in range(4)]
    assert [a.key for a in waiting] == ["job-4", "job-5"]
    assert all(a.reason and a.reason != "queued" for a in waiting)  # why it waits
    assert len({n for a in ready for n in a.nodes}) == 4  # no node twice
    # The queue keeps call order, and each request has one created event,
    # recorded before what the pass decided for it.
    assert [a.key for a in await f.list_allocations()] == [f"job-{i}" for i in range(6)]
    assert [e.data["key"] for e in await created_events(f)] == [f"job-{i}" for i in range(6)]
    for a in answers:
        kinds = [
            e.kind
            for e in await f.events.since(0)
            if e.allocation == a.id and e.kind.startswith("allocation.")
        ]
        assert kinds[0] == "allocation.created"
        assert kinds[1] == ("allocation.ready" if a in ready else "allocation.waiting")


async def test_one_key_in_one_pass_makes_one_allocation(fleet: tuple[Fleet, Racks]) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    spec = AllocationSpec(nodes=2)
    answers = await asyncio.gather(*(f.create_allocation("same", spec) for _ in range(3)))
    assert len({a.id for a in answers}) == 1
    assert answers[0].state == AllocationState.READY
    assert len(await f.list_allocations(include_released=True)) == 1
    assert len(await created_events(f)) == 1
    # The other requests of that pass still go through.
    mixed = await asyncio.gather(
        f.create_allocation("other", AllocationSpec(nodes=1)),
        f.create_allocation("same", AllocationSpec(nodes=1)),
        return_exceptions=True,
    )
    assert not isinstance(mixed[0], BaseException)
    assert mixed[0].state == AllocationState.READY
    assert isinstance(mixed[1], AlreadyExists)


async def test_a_key_of_an_allocation_released_before_a_restart_is_still_known(
    fleet: tuple[Fleet, Racks], make_fleet: Callable[..., Fleet]
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    spec = AllocationSpec(nodes=1)
    old = await f.release((await f.create_allocation("old", spec)).id)
    await f.create_allocation("before", AllocationSpec(nodes=1))
    await f.create_allocation("before-too", AllocationSpec(nodes=1))
    # A controller started on the same store holds only open allocations in
    # memory: the released one is known to the store alone.
    again = make_fleet()
    try:
        first = await again.create_allocation("first-after", AllocationSpec(nodes=1))
        same, conflict, new = await asyncio.gather(
            again.create_allocation("old", spec),
            again.create_allocation("old", AllocationSpec(nodes=2)),
            again.create_allocation("after", AllocationSpec(nodes=1)),
            return_exceptions=True,
        )
        assert not isinstance(same, BaseException) and same.id == old.id
        assert same.state == AllocationState.RELEASED
        assert isinstance(conflict, AlreadyExists)
        # Stored and queued (this controller's agents are not back yet).
        assert not isinstance(new, BaseException) and new.state == AllocationState.PENDING
        # Queue positions go on from the store's highest.
        order = ["old", "before", "before-too", "first-after", "after"]
        assert first.state == AllocationState.PENDING
        assert [a.key for a in await again.list_allocations(include_released=True)] == order
        assert [e.data["key"] for e in await created_events(again)] == order
    finally:
        await again.stop()


async def test_a_pass_that_fails_fails_its_requests_and_stores_none(
    fleet: tuple[Fleet, Racks], monkeypatch: pytest.MonkeyPatch
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    before = len(await f.events.since(0))

    class Broken(KilnError):
        template = "the database is gone"

    def broken(*_args: object) -> None:
        raise Broken()

    monkeypatch.setattr(f.allocations, "_apply", broken)
    answers = await asyncio.gather(
        f.create_allocation("a", AllocationSpec(nodes=1)),
        f.create_allocation("b", AllocationSpec(nodes=1)),
        return_exceptions=True,
    )
    assert all(isinstance(a, Broken) for a in answers)
    assert await f.list_allocations(include_released=True) == []
    assert len(await f.events.since(0)) == before
    monkeypatch.undo()
    # Nothing is left behind: the same keys are requests like any other.
    retried = await f.create_allocation("a", AllocationSpec(nodes=1))
    assert retried.state == AllocationState.READY
    assert [a.key for a in await f.list_allocations()] == ["a"]
