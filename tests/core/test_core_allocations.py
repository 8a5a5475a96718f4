"""Allocations in the core alone: booking, idempotency, refusal, release,
replacement, requests stored by the pass that decides them (concurrent
creates, reused keys, queue positions across a restart, a failed pass),
ids and the line an admission logs — on the in-memory store and on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks, reconcile, states
from core_fakes import FakeBmc

from controller.core.errors import AlreadyExists, FailedPrecondition, KilnError, NotFound
from controller.core.fleet import Fleet
from controller.core.model import AllocationInfo, AllocationSpec
from controller.core.states import AllocationState, NodeState

pytestmark = pytest.mark.timeout(60)

TRAYS = [f"r1-t{i}" for i in range(1, 5)]


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        racks = Racks(fleet, stack)
        yield fleet, racks
        await fleet.stop()


async def test_a_node_reaches_ready_through_inspection_and_preparation(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    (node,) = await racks.add(["n1"], rack="r1")
    assert node.state == NodeState.READY and node.schedulable
    assert node.gpu_model == "GB200" and node.gpu_count == 4 and node.nvlink_domain == "r1"
    assert bmc.power["n1"] == "on"  # inspection powered it on through its BMC
    kinds = [e.kind for e in await f.events.since(0, node="n1")]
    assert kinds[0] == "node.enrolled" and "node.agent" in kinds
    assert [
        e.data["to_state"] for e in await f.events.since(0, node="n1") if e.data.get("to_state")
    ] == [
        "inspecting",
        "preparing",
        "ready",
    ]


async def test_gang_booked_whole_in_one_domain_and_released(fleet: tuple[Fleet, Racks]) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await racks.add(["r2-t1", "r2-t2"], rack="r2")
    alloc = await f.create_allocation("job-1", AllocationSpec(nodes=3, topology="nvlink"))
    assert alloc.state == AllocationState.READY
    assert set(alloc.nodes) <= set(TRAYS) and len(alloc.nodes) == 3
    assert alloc.domains == ("r1",)
    held = {n.name for n in await f.list_nodes() if n.allocation == alloc.id}
    assert held == set(alloc.nodes)
    now = await states(f)
    assert all(now[n] == NodeState.ALLOCATED for n in alloc.nodes)

    released = await f.release(alloc.id)
    assert released.state == AllocationState.RELEASED
    now = await states(f)
    assert all(now[n] == NodeState.RELEASING for n in alloc.nodes)
    await reconcile(f)
    nodes = {n.name: n for n in await f.list_nodes()}
    assert all(nodes[n].schedulable for n in alloc.nodes)
    again = await f.release(alloc.id)  # idempotent
    assert again.state == AllocationState.RELEASED and again.updated_at == released.updated_at


async def test_the_same_key_returns_the_same_allocation_and_another_spec_conflicts(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    first = await f.create_allocation("k", AllocationSpec(nodes=2))
    assert (await f.create_allocation("k", AllocationSpec(nodes=2))).id == first.id
    with pytest.raises(AlreadyExists, match="already used for a different request"):
        await f.create_allocation("k", AllocationSpec(nodes=3))
    assert len(await f.list_allocations()) == 1


async def test_a_request_that_can_never_fit_is_refused_and_stores_nothing(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    before = len(await f.events.since(0))
    with pytest.raises(FailedPrecondition, match="can never fit"):
        await f.create_allocation("big", AllocationSpec(nodes=5))
    assert await f.list_allocations(include_released=True) == []
    assert len(await f.events.since(0)) == before
    with pytest.raises(NotFound):
        await f.get_allocation("big")


async def one_held_one_waiting(f: Fleet, racks: Racks) -> tuple[AllocationInfo, AllocationInfo]:
    """A rack of TRAYS, an allocation of 3 nodes and one of 2 that waits for them."""
    await racks.add(TRAYS, rack="r1")
    first = await f.create_allocation("a", AllocationSpec(nodes=3))
    second = await f.create_allocation("b", AllocationSpec(nodes=2))
    return first, second


async def test_a_request_that_cannot_fit_now_waits_and_is_admitted_after_a_release(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    first, second = await one_held_one_waiting(f, racks)
    assert second.state == AllocationState.PENDING and "GB200" not in second.reason
    assert second.reason  # why it waits
    await f.release(first.id)
    await reconcile(f)
    await f.allocations.schedule_pass()
    admitted = await f.get_allocation(second.id)
    assert admitted.state == AllocationState.READY and len(admitted.nodes) == 2


async def test_a_failed_node_is_replaced_by_the_allocations_hot_spare(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    alloc = await f.create_allocation(
        "spare", AllocationSpec(nodes=2, topology="nvlink", spares_per_domain=1)
    )
    assert alloc.state == AllocationState.READY and len(alloc.spares) == 1
    failed, spare = alloc.nodes[0], alloc.spares[0]
    await f.drain(failed, "bad GPU")
    await f.allocations.node_failed(failed, "bad GPU")
    after = await f.get_allocation(alloc.id)
    assert failed not in after.nodes and spare in after.nodes and after.spares == ()
    assert (await f.get_node(failed)).allocation == ""
    replaced = [e for e in await f.events.since(0) if e.kind == "allocation.node_replaced"]
    assert replaced and replaced[-1].data["failed"] == failed
    # No node is ever in two allocations.
    holders = [n.allocation for n in await f.list_nodes() if n.allocation]
    assert len(holders) == len(after.nodes)


# -- requests stored by the scheduling pass that decides them ------------------


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


async def test_a_pass_remakes_only_the_bookings_whose_allocation_changed(
    fleet: tuple[Fleet, Racks],
) -> None:
    """Bookings of running jobs are kept between passes (a pass walks every
    one): an allocation saved again gets a new booking, the others keep
    theirs, and their content always matches the allocation."""
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    first = await f.create_allocation("job-1", AllocationSpec(nodes=1))
    second = await f.create_allocation("job-2", AllocationSpec(nodes=1))
    booked = dict(f.allocations._booked)
    assert set(booked) >= {first.id}  # the second's pass booked the first
    await f.create_allocation("job-3", AllocationSpec(nodes=1))
    kept = f.allocations._booked
    assert kept[first.id][1] is booked[first.id][1], "an unchanged allocation was booked anew"
    assert kept[second.id][1].nodes == second.nodes
    await f.release(second.id)
    await f.create_allocation("job-4", AllocationSpec(nodes=1))
    after = f.allocations._booked
    assert second.id not in after and after[first.id][1] is booked[first.id][1]
    for ident, (record, booking) in after.items():
        alloc = await f.get_allocation(ident)
        assert booking.nodes == alloc.nodes and record.id == ident
        assert booking.gpus == 4 * len(alloc.nodes)


async def test_a_release_does_not_wait_for_the_scheduling_pass_it_asks_for(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    first, second = await one_held_one_waiting(f, racks)
    assert second.state == AllocationState.PENDING
    asked = f.allocations._asked
    async with f.allocations._lock:  # a scheduling pass is running
        released = await asyncio.wait_for(f.release(first.id), 5)
        assert released.state == AllocationState.RELEASED
    await f.allocations.settle()
    assert f.allocations._passed > asked  # the pass it asked for ran once the lock was free
    await reconcile(f)  # the released nodes are reset and ready again
    await f.allocations.schedule_pass()
    admitted = await f.get_allocation(second.id)
    assert admitted.state == AllocationState.READY and len(admitted.nodes) == 2


ID = re.compile(r"alloc-[0-9a-f]{10}")


async def test_ids_keep_their_shape_and_never_repeat(fleet: tuple[Fleet, Racks]) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    ids = []
    for k in range(60):
        info = await f.create_allocation(f"job-{k}", AllocationSpec(nodes=1))
        ids.append(info.id)
        await f.release(info.id)
    # A request without a key gets one of its own.
    keyless = [await f.create_allocation("", AllocationSpec(nodes=1)) for _ in range(2)]
    ids += [a.id for a in keyless]
    assert all(ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)
    assert len({a.key for a in keyless}) == 2 and all(a.key for a in keyless)


async def test_two_controllers_do_not_share_a_sequence(make_fleet: Callable[..., Fleet]) -> None:
    # Ids come from a generator seeded from the kernel once per controller
    # (not a system call a request); a fixed seed would make two controllers
    # on one database (PostgreSQL) hand out the same ids in the same order.
    first, second = make_fleet(), make_fleet()
    try:
        one = [first.allocations._ids.getrandbits(40) for _ in range(3)]
        two = [second.allocations._ids.getrandbits(40) for _ in range(3)]
        assert one != two
    finally:
        await first.stop()
        await second.stop()


async def test_an_admission_is_logged_once_committed_and_not_when_it_rolls_back(
    fleet: tuple[Fleet, Racks], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    caplog.set_level(logging.INFO, logger="controller.core.allocations")
    store = f.allocations._store
    real = store.tx
    failing = True

    class DiskFull(KilnError):
        template = "the disk is full"

    async def tx(fn: Callable[[Any], Any]) -> Any:
        def then_fail(t: Any) -> Any:
            result = fn(t)  # the unit ran: the admission was decided and written ...
            if failing:
                raise DiskFull()  # ... and its transaction rolls back
            return result

        return await real(then_fail)

    def admissions() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "controller.core.allocations" and r.getMessage().startswith("allocation ")
        ]

    monkeypatch.setattr(store, "tx", tx)
    with pytest.raises(DiskFull):
        await f.create_allocation("lost", AllocationSpec(nodes=2))
    assert admissions() == []
    assert await f.list_allocations(include_released=True) == []  # nothing was stored

    failing = False
    info = await f.create_allocation("kept", AllocationSpec(nodes=2))
    assert admissions() == [f"allocation {info.id}: {info.state} on {','.join(info.nodes)}"]
