"""Allocation reads come from memory: the view the store keeps current on commit.

Against both stores (the in-memory fake and SQLite): once loaded, a
create/release cycle and the reads around it make no store read; a commit is
visible to the next read and a failed one is not (also inside a group
commit); after a restart, an idempotency key of an allocation the view no
longer holds is still honoured through the store; the view keeps only the
most recently closed allocations; events written as plain rows are read back
inside their own transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from core_builders import Racks
from core_fakes import FakeBmc
from store_probes import ReadCountingStore, group_sizes

from controller.core.allocation_view import AllocationView
from controller.core.errors import AlreadyExists, NotFound
from controller.core.eventlog import record
from controller.core.fleet import Fleet
from controller.core.kinds import EventKind
from controller.core.model import AllocationSpec
from controller.core.ports import Store, Tx
from controller.core.records import AllocationRecord
from controller.core.states import AllocationState
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore

T = TypeVar("T")
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def counted(store: Store) -> AsyncIterator[tuple[Fleet, ReadCountingStore]]:
    counting = ReadCountingStore(store)
    fleet = Fleet(counting, FakeBmc())  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(["t1", "t2"], rack="r1")
        yield fleet, counting
        await fleet.stop()


async def test_a_create_release_cycle_reads_nothing_from_the_store(
    counted: tuple[Fleet, ReadCountingStore],
) -> None:
    fleet, counting = counted
    await fleet.allocations.loaded()
    before = counting.reads
    first = await fleet.create_allocation("job-1", AllocationSpec(nodes=1))
    assert first.state == AllocationState.READY
    again = await fleet.create_allocation("job-1", AllocationSpec(nodes=1))  # same key
    assert again.id == first.id
    with pytest.raises(AlreadyExists):
        await fleet.create_allocation("job-1", AllocationSpec(nodes=2))
    assert (await fleet.get_allocation("job-1")).id == first.id  # by key
    assert [a.id for a in await fleet.list_allocations()] == [first.id]
    released = await fleet.release(first.id)
    assert released.state == AllocationState.RELEASED
    assert (await fleet.get_allocation(first.id)).state == AllocationState.RELEASED
    assert await fleet.list_allocations() == []
    assert counting.reads == before
    with pytest.raises(NotFound):  # not held here: the store is asked
        await fleet.get_allocation("alloc-ghost")
    assert counting.reads == before + 1


async def test_a_failed_unit_of_work_leaves_the_view_as_it_was(
    counted: tuple[Fleet, ReadCountingStore], store: Store
) -> None:
    fleet, _ = counted
    alloc = await fleet.create_allocation("job-1", AllocationSpec(nodes=1))

    def rename_then_fail(tx: Tx) -> None:
        saved = tx.allocations.get(alloc.id)
        assert saved is not None
        saved.reason = "never committed"
        tx.allocations.save(saved)
        raise RuntimeError("the unit of work fails after saving")

    with pytest.raises(RuntimeError):
        await store.tx(rename_then_fail)
    assert (await fleet.get_allocation(alloc.id)).reason == alloc.reason

    def change_after_save(tx: Tx) -> None:
        saved = tx.allocations.get(alloc.id)
        assert saved is not None
        saved.reason = "saved"
        tx.allocations.save(saved)
        saved.reason = "changed after the save, never saved"
        saved.nodes.append("not-saved")

    await store.tx(change_after_save)
    shown = await fleet.get_allocation(alloc.id)
    assert shown.reason == "saved" and "not-saved" not in shown.nodes


async def test_a_failing_unit_in_a_group_commit_leaves_the_others_in_the_view(
    tmp_path: Path,
) -> None:
    store = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    fleet = Fleet(store, FakeBmc())
    try:
        async with contextlib.AsyncExitStack() as stack:
            await Racks(fleet, stack).add(["t1", "t2", "t3"], rack="r1")
            ids = [
                (await fleet.create_allocation(f"job-{i}", AllocationSpec(nodes=1))).id
                for i in range(3)
            ]
            sizes = group_sizes(store)

            def reason(ident: str, text: str, fail: bool = False) -> Callable[[Tx], None]:
                def write(tx: Tx) -> None:
                    saved = tx.allocations.get(ident)
                    assert saved is not None
                    saved.reason = text
                    tx.allocations.save(saved)
                    if fail:
                        raise ValueError("refused")

                return write

            results = await asyncio.gather(
                store.tx(reason(ids[0], "first")),
                store.tx(reason(ids[1], "failing", fail=True)),
                store.tx(reason(ids[2], "third")),
                return_exceptions=True,
            )
            assert isinstance(results[1], ValueError)
            assert sizes == [3]  # the three were tried as one group first
            shown = [(await fleet.get_allocation(i)).reason for i in ids]
            assert shown[0] == "first" and shown[2] == "third"
            assert shown[1] != "failing"
            await fleet.stop()
    finally:
        store.close()


async def test_after_a_restart_an_old_key_is_honoured_through_the_store(
    store: Store,
) -> None:
    first = Fleet(store, FakeBmc())
    async with contextlib.AsyncExitStack() as stack:
        await Racks(first, stack).add(["t1"], rack="r1")
        done = await first.create_allocation("job-old", AllocationSpec(nodes=1))
        await first.release(done.id)
        await first.stop()
    counting = ReadCountingStore(store)
    second = Fleet(counting, FakeBmc())  # type: ignore[arg-type]
    await second.allocations.loaded()
    assert second.allocations.view.get(done.id) is None  # closed before the restart
    before = counting.reads
    again = await second.create_allocation("job-old", AllocationSpec(nodes=1))
    assert again.id == done.id and again.state == AllocationState.RELEASED
    with pytest.raises(AlreadyExists, match="job-old"):
        await second.create_allocation("job-old", AllocationSpec(nodes=1, exclusive=True))
    assert counting.reads > before  # the store answered, not the view
    assert (await second.get_allocation(done.id)).state == AllocationState.RELEASED
    await second.stop()


def _alloc(ident: str, state: AllocationState, submitted: int) -> AllocationRecord:
    return AllocationRecord(
        id=ident, key=f"key-{ident}", spec=AllocationSpec(nodes=1), state=state, submitted=submitted
    )


def test_the_view_keeps_the_latest_closed_allocations_and_the_queue_in_order() -> None:
    view = AllocationView(closed_kept=2)
    late = _alloc("b", AllocationState.PENDING, 2)
    view.begin_load()
    view.committed({"b": late})  # a commit while the load reads
    view.install([_alloc("a", AllocationState.READY, 1), _alloc("c", AllocationState.PENDING, 3)])
    assert [a.id for a in view.open()] == ["a", "b", "c"]
    assert view.pending()
    for ident in ("a", "b", "c"):
        view.committed({ident: _alloc(ident, AllocationState.RELEASED, 0)})
    assert view.open() == [] and not view.pending()
    assert view.get("a") is None and view.by_key("key-a") is None  # the oldest closed: gone
    assert view.get("b") is not None and view.get("key-c") is not None


async def test_events_written_in_a_unit_are_read_back_in_it_and_keep_their_order(
    store: Store,
) -> None:
    def write_and_read(tx: Tx) -> list[str]:
        record(tx, EventKind.ALLOCATION_CREATED, allocation="a1", reason="one")
        record(tx, EventKind.ALLOCATION_READY, allocation="a1", reason="two")
        return [e.reason for e in tx.events.since(0, allocation="a1")]

    def more(tx: Tx) -> None:
        record(tx, EventKind.ALLOCATION_RELEASED, allocation="a1", reason="three")

    assert await store.tx(write_and_read) == ["one", "two"]
    await asyncio.gather(store.tx(more), store.tx(more))
    events = await store.read(lambda tx: tx.events.since(0, allocation="a1"))
    assert [e.reason for e in events] == ["one", "two", "three", "three"]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert len({e.seq for e in events}) == 4


def test_the_queue_stays_in_order_through_random_commits() -> None:
    """Arrivals mostly in order, some not (a restart's load, a commit during
    it), updates and closes: ``open`` is always the sort of what is open."""
    rng = random.Random(4)
    view = AllocationView()
    view.install([])
    model: dict[str, AllocationRecord] = {}
    submitted = 0
    for step in range(2000):
        roll = rng.random()
        if roll < 0.45 or not model:
            submitted += 1
            late = rng.random() < 0.05  # out of order
            order = submitted - rng.randint(1, 50) if late else submitted
            ident = f"a{step:05d}"
            rec = _alloc(ident, AllocationState.PENDING, order)
        elif roll < 0.75:
            ident = rng.choice(sorted(model))
            rec = _alloc(ident, AllocationState.READY, model[ident].submitted)
        else:
            ident = rng.choice(sorted(model))
            rec = _alloc(ident, AllocationState.RELEASED, model[ident].submitted)
        view.committed({ident: rec})
        if rec.state == AllocationState.RELEASED:
            model.pop(ident, None)
        else:
            model[ident] = rec
        if step % 7 == 0:
            want = sorted(model.values(), key=lambda a: (a.submitted, a.id))
            assert view.open() == want
    assert [a.id for a in view.open()] == [
        a.id for a in sorted(model.values(), key=lambda a: (a.submitted, a.id))
    ]
