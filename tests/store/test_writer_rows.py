"""The writer's rows (``controller/store/writer_rows.py``): a unit of work reads
a node or allocation the writer last committed without a SELECT, sees exactly
what was committed, and nothing of a write that failed — on both engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from controller.core.errors import NotFound
from controller.core.health import HealthSample
from controller.core.model import AllocationSpec
from controller.core.records import AllocationRecord, NodeRecord
from controller.core.states import AllocationState, NodeState
from controller.store.sql_store import SqlStore, SqlTx
from controller.store.writer_rows import TableRows

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(engine: Engine) -> AsyncIterator[SqlStore]:
    sql = SqlStore(engine)
    yield sql
    sql.close()


def node(name: str) -> NodeRecord:
    return NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}")


@contextmanager
def selects_from(engine: Engine, table: str) -> Iterator[list[str]]:
    """The SELECTs sent that read ``table``, while the block runs."""
    seen: list[str] = []

    def listener(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and f"FROM {table}" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def set_state(name: str, state: NodeState, reason: str) -> Any:
    def write(tx: SqlTx) -> None:
        found = tx.nodes.get(name, with_health=False)
        assert found is not None
        found.state, found.state_reason = state, reason
        tx.nodes.save(found)

    return write


def state_of(name: str) -> Any:
    def read(tx: SqlTx) -> tuple[NodeState, str] | None:
        found = tx.nodes.get(name, with_health=False)
        return (found.state, found.state_reason) if found else None

    return read


async def test_a_write_reads_what_the_last_one_committed_without_a_select(
    engine: Engine, store: SqlStore
) -> None:
    await store.tx(lambda tx: tx.nodes.add(node("wr-1"), "pw"))
    alloc = AllocationRecord(id="wr-a1", key="wr-k1", spec=AllocationSpec(nodes=1))
    await store.tx(lambda tx: tx.allocations.add(alloc))
    await store.tx(set_state("wr-1", NodeState.INSPECTING, "powered on"))
    with selects_from(engine, "nodes") as nodes, selects_from(engine, "allocations") as allocs:
        seen = await store.tx(state_of("wr-1"))
        got = await store.tx(lambda tx: tx.allocations.get("wr-a1"))
    assert seen == (NodeState.INSPECTING, "powered on")
    assert got is not None and got.spec == alloc.spec and got.state == AllocationState.PENDING
    assert nodes == [] and allocs == []
    # The database says the same (a read has no writer's rows: it asks).
    with selects_from(engine, "nodes") as nodes:
        assert await store.read(state_of("wr-1")) == seen
    assert nodes


async def test_a_failed_write_leaves_nothing_behind_for_the_next(store: SqlStore) -> None:
    await store.tx(lambda tx: tx.nodes.add(node("wr-2"), "pw"))
    await store.tx(set_state("wr-2", NodeState.INSPECTING, "kept"))

    def change_then_fail(tx: SqlTx) -> None:
        set_state("wr-2", NodeState.QUARANTINED, "never")(tx)
        raise NotFound(kind="node", name="other")

    with pytest.raises(NotFound):
        await store.tx(change_then_fail)
    assert await store.tx(state_of("wr-2")) == (NodeState.INSPECTING, "kept")

    # In a group: the failing unit's change is gone, the others' are kept
    # and seen by the units after them.
    results = await asyncio.gather(
        store.tx(set_state("wr-2", NodeState.PREPARING, "first")),
        store.tx(change_then_fail),
        store.tx(state_of("wr-2")),
        return_exceptions=True,
    )
    assert isinstance(results[1], NotFound)
    assert results[2] == (NodeState.PREPARING, "first")
    assert await store.tx(state_of("wr-2")) == (NodeState.PREPARING, "first")
    assert await store.read(state_of("wr-2")) == (NodeState.PREPARING, "first")


async def test_columns_written_past_a_record_and_removals_are_seen(store: SqlStore) -> None:
    await store.tx(lambda tx: tx.nodes.add(node("wr-3"), "pw"))
    await store.tx(lambda tx: tx.nodes.add(node("wr-4"), "pw"))
    await store.tx(lambda tx: tx.nodes.save_health_batch([HealthSample.of("wr-3", None, 1234.5)]))
    found = await store.tx(lambda tx: tx.nodes.get("wr-3", with_health=False))
    assert found is not None and found.agent_last_seen == 1234.5

    await store.tx(lambda tx: tx.nodes.remove("wr-4"))
    assert await store.tx(state_of("wr-4")) is None
    with pytest.raises(KeyError):
        await store.tx(lambda tx: tx.nodes.save(node("wr-4")))


async def test_a_sighting_is_seen_by_its_own_unit_and_gone_with_its_failure(
    store: SqlStore,
) -> None:
    """A health batch's ``agent_last_seen`` is kept beside the writer's row,
    not on a copy of it: the unit that wrote it reads it back, a later unit
    reads it without a SELECT, and a unit that fails after it leaves the
    row as the last commit left it."""
    await store.tx(lambda tx: tx.nodes.add(node("wr-5"), "pw"))

    def sighted_at(at: float) -> Any:
        def sight(tx: SqlTx) -> float:
            tx.nodes.save_health_batch([HealthSample.of("wr-5", None, at)])
            found = tx.nodes.get("wr-5", with_health=False)
            assert found is not None
            return found.agent_last_seen

        return sight

    assert await store.tx(sighted_at(77.0)) == 77.0

    def sight_then_fail(tx: SqlTx) -> None:
        tx.nodes.save_health_batch([HealthSample.of("wr-5", None, 99.0)])
        raise NotFound(kind="node", name="other")

    with pytest.raises(NotFound):
        await store.tx(sight_then_fail)
    found = await store.tx(lambda tx: tx.nodes.get("wr-5", with_health=False))
    assert found is not None and found.agent_last_seen == 77.0
    assert await store.read(lambda tx: tx.nodes.get("wr-5", with_health=False)) == found


def test_a_touched_row_reads_its_columns_and_commits_them() -> None:
    committed: dict[str, dict[str, Any]] = {"a": {"state": "ready", "seen": 1.0}}
    rows = TableRows(committed)
    rows.touch("a", seen=2.0)
    rows.touch("ghost", seen=3.0)  # a row it does not know: ignored
    assert committed["a"]["seen"] == 1.0  # nothing committed before its commit
    assert rows.get("a") == {"state": "ready", "seen": 2.0}
    rows.commit()
    assert committed == {"a": {"state": "ready", "seen": 2.0}}

    later = TableRows(committed)
    later.touch("a", seen=4.0)
    later.commit()  # never read, still committed
    assert committed["a"] == {"state": "ready", "seen": 4.0}

    replaced = TableRows(committed)
    replaced.touch("a", seen=5.0)
    replaced["a"] = {"state": "failed", "seen": 6.0}  # a whole row saved after it
    replaced.commit()
    assert committed["a"] == {"state": "failed", "seen": 6.0}

    removed = TableRows(committed)
    removed.touch("a", seen=7.0)
    removed.remove("a")
    removed.commit()
    assert committed == {}


async def test_an_allocations_holders_come_from_its_members_rows_without_a_select(
    engine: Engine, store: SqlStore
) -> None:
    """``held_by`` with the allocation's members answers from the writer's
    rows when it holds them all, with what the query answers; a member it
    does not hold (a fresh writer) sends the query."""
    for name in ("hb-1", "hb-2", "hb-3"):
        await store.tx(lambda tx, n=name: tx.nodes.add(node(n), "pw"))  # type: ignore[misc]

    def book(tx: SqlTx) -> None:
        for name in ("hb-1", "hb-2"):
            found = tx.nodes.get(name, with_health=False)
            assert found is not None
            found.allocation_id = "hb-a"
            tx.nodes.save(found)

    await store.tx(book)
    members = ["hb-1", "hb-2", "hb-3"]  # hb-3 a member no longer held

    def holders(tx: SqlTx, among: list[str]) -> list[str]:
        return sorted(n.name for n in tx.nodes.held_by("hb-a", with_health=False, members=among))

    with selects_from(engine, "nodes") as seen:
        from_rows = await store.tx(lambda tx: holders(tx, members))
    assert from_rows == ["hb-1", "hb-2"] and seen == []
    with selects_from(engine, "nodes") as seen:
        queried = await store.tx(lambda tx: holders(tx, []))
    assert queried == from_rows and seen
    fresh = SqlStore(engine)  # a writer that holds no rows yet
    try:
        with selects_from(engine, "nodes") as seen:
            assert await fresh.tx(lambda tx: holders(tx, members)) == from_rows
        assert seen
    finally:
        fresh.close()
