"""Group commit: writes queued together commit together, each durable before
its caller hears back, and one failing write fails only its own caller."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine

from controller.core.errors import DuplicateKey, NotFound
from controller.core.kinds import EventKind
from controller.core.records import NewEvent, NodeRecord
from controller.core.states import NodeState
from controller.store.sql_store import SqlStore, SqlTx


def ours(names: list[str]) -> list[str]:
    """This test's nodes (the PostgreSQL database is shared with other tests)."""
    return [n for n in names if n.startswith("g0")]


def node(i: int) -> NodeRecord:
    return NodeRecord(name=f"g{i:04d}", bmc_url=f"redfish+http://127.0.0.1:{9000 + i}/x")


def add(i: int) -> object:
    def write(tx: SqlTx) -> str:
        tx.nodes.add(node(i), "pw")
        return f"g{i:04d}"

    return write


@pytest.mark.timeout(120)
async def test_concurrent_writes_commit_in_groups_and_in_order(engine: Engine) -> None:
    store = SqlStore(engine)
    try:
        names = await asyncio.gather(*(store.tx(add(i)) for i in range(300)))  # type: ignore[arg-type]
        assert names == [f"g{i:04d}" for i in range(300)]
        assert store.groups >= 1  # more than one write went in a commit
        stored = await store.read(lambda tx: [n.name for n in tx.nodes.find()])
        assert ours(stored) == names
    finally:
        store.close()


@pytest.mark.timeout(120)
async def test_a_failing_write_fails_alone(engine: Engine) -> None:
    store = SqlStore(engine)
    try:
        await store.tx(add(0))  # type: ignore[arg-type]

        def missing(tx: SqlTx) -> None:
            raise NotFound(kind="node", name="nope")

        def later_sees_earlier(tx: SqlTx) -> NodeState:
            found = tx.nodes.get("g0001")
            assert found is not None  # written by an earlier unit of the same group
            return found.state

        results = await asyncio.gather(
            store.tx(add(1)),  # type: ignore[arg-type]
            store.tx(add(0)),  # type: ignore[arg-type]  # a duplicate: fails
            store.tx(missing),
            store.tx(later_sees_earlier),
            store.tx(add(2)),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert results[0] == "g0001" and results[4] == "g0002"
        assert isinstance(results[1], DuplicateKey)
        assert isinstance(results[2], NotFound)
        assert results[3] == NodeState.ENROLLED
        stored = await store.read(lambda tx: [n.name for n in tx.nodes.find()])
        assert ours(stored) == ["g0000", "g0001", "g0002"]
    finally:
        store.close()


def event_of(allocation: str, reason: str) -> NewEvent:
    return NewEvent(at=1.0, kind=EventKind.ALLOCATION_WAITING, allocation=allocation, reason=reason)


@pytest.mark.timeout(120)
async def test_a_groups_events_are_stored_in_unit_order_and_read_by_later_units(
    engine: Engine,
) -> None:
    store = SqlStore(engine)
    try:

        def adds(allocation: str, reason: str) -> object:
            def write(tx: SqlTx) -> None:
                tx.events.add(event_of(allocation, reason))

            return write

        def reads_then_adds(allocation: str, reason: str) -> object:
            def write(tx: SqlTx) -> list[str]:
                seen = [e.reason for e in tx.events.since(0, allocation=allocation)]
                tx.events.add(event_of(allocation, reason))
                return seen

            return write

        def fails_after_adding(allocation: str) -> object:
            def write(tx: SqlTx) -> None:
                tx.events.add(event_of(allocation, "never stored"))
                raise NotFound(kind="node", name="nope")

            return write

        groups = store.groups
        results = await asyncio.gather(
            store.tx(adds("grp-a", "first")),  # type: ignore[arg-type]
            store.tx(reads_then_adds("grp-a", "second")),  # type: ignore[arg-type]
            store.tx(adds("grp-a", "third")),  # type: ignore[arg-type]
        )
        assert store.groups == groups + 1  # the three went in one commit
        assert results[1] == ["first"]  # sent before the read, in the same transaction

        # A failing unit: the group runs again unit by unit; its event is not
        # stored, and nobody's is stored twice.
        results = await asyncio.gather(
            store.tx(adds("grp-b", "first")),  # type: ignore[arg-type]
            store.tx(fails_after_adding("grp-b")),  # type: ignore[arg-type]
            store.tx(reads_then_adds("grp-b", "second")),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert isinstance(results[1], NotFound) and results[2] == ["first"]

        def stored(allocation: str) -> object:
            return lambda tx: [e.reason for e in tx.events.since(0, allocation=allocation)]

        assert await store.read(stored("grp-a")) == ["first", "second", "third"]  # type: ignore[arg-type]
        assert await store.read(stored("grp-b")) == ["first", "second"]  # type: ignore[arg-type]
    finally:
        store.close()


@pytest.mark.timeout(120)
async def test_many_events_in_one_unit_are_stored_whole_and_in_order(engine: Engine) -> None:
    """More events than one INSERT carries: every one stored, in the order
    recorded, with its data, and a rolled-back unit's none of them."""
    store = SqlStore(engine)
    try:

        def many(allocation: str, count: int, fail: bool = False) -> object:
            def write(tx: SqlTx) -> None:
                for i in range(count):
                    tx.events.add(
                        NewEvent(
                            at=float(i),
                            kind=EventKind.ALLOCATION_WAITING,
                            allocation=allocation,
                            reason=f"r{i}",
                            data={"i": i, "text": "100% 'quoted' ?"},
                        )
                    )
                if fail:
                    raise NotFound(kind="node", name="nope")

            return write

        await store.tx(many("grp-many", 250))  # type: ignore[arg-type]
        with pytest.raises(NotFound):
            await store.tx(many("grp-none", 120, fail=True))  # type: ignore[arg-type]
        stored = await store.read(
            lambda tx: tx.events.since(0, allocation="grp-many", limit=1000)  # type: ignore[arg-type,return-value]
        )
        assert [e.reason for e in stored] == [f"r{i}" for i in range(250)]
        assert [e.seq for e in stored] == sorted({e.seq for e in stored})
        assert stored[249].data == {"i": 249, "text": "100% 'quoted' ?"} and stored[7].at == 7.0
        assert not await store.read(lambda tx: tx.events.since(0, allocation="grp-none"))  # type: ignore[arg-type,return-value]
    finally:
        store.close()


@pytest.mark.timeout(120)
async def test_a_cancelled_caller_loses_only_its_answer(engine: Engine) -> None:
    """A caller cancelled while its write waits in the queue: the write still
    commits with its group (a unit of work is never half-dropped), the
    caller gets CancelledError, and the callers beside it their answers."""
    store = SqlStore(engine)
    try:
        await store.tx(add(10))  # type: ignore[arg-type]  # the writer is warm
        before = store.tx(add(11))  # type: ignore[arg-type]
        cancelled = asyncio.ensure_future(store.tx(add(12)))  # type: ignore[arg-type]
        after = store.tx(add(13))  # type: ignore[arg-type]
        beside = asyncio.gather(before, after)
        await asyncio.sleep(0)  # every caller has queued its unit
        cancelled.cancel()
        assert await beside == ["g0011", "g0013"]
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        stored = await store.read(lambda tx: [n.name for n in tx.nodes.find()])
        assert [n for n in ours(stored) if n >= "g0010"] == ["g0010", "g0011", "g0012", "g0013"]
    finally:
        store.close()
