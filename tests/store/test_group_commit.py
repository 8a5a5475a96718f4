"""Group commit: writes queued together commit together, each durable before
its caller hears back, and one failing write fails only its own caller."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine

from controller.core.errors import DuplicateKey, NotFound
from controller.core.records import NodeRecord
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
