"""A database failure that is not the caller's reaches the core as one of Kiln's
errors with a generic message: never the SQL statement, its parameters (sealed
secrets among them) or the driver's text, which go to the log as one line."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from controller.api.errors import status_for
from controller.core.records import NodeRecord
from controller.store.models import GpuRow
from controller.store.sql_store import SqlStore, SqlTx, StoreFailed

pytestmark = pytest.mark.timeout(120)


def broken_sql(tx: SqlTx) -> None:
    tx.session.execute(text("SELEC 'the statement'"))


def oversized_gpu(tx: SqlTx) -> None:
    tx.nodes.add(NodeRecord(name="n1", bmc_url="fake://n1"), "sealed-secret-pw")
    tx.session.flush()
    tx.session.add(GpuRow(node="n1", index=0, memory_mib=2**63))


@pytest.mark.parametrize("work", [broken_sql, oversized_gpu], ids=["bad-sql", "int-past-64-bits"])
async def test_a_failed_unit_of_work_says_nothing_of_the_database(
    engine: Engine, work: object, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqlStore(engine)
    try:
        with caplog.at_level(logging.ERROR, logger="controller.store.sql_store"):
            with pytest.raises(StoreFailed) as e:
                await store.tx(work)  # type: ignore[arg-type]
        assert str(e.value) == (
            "the database could not complete the request; see the controller's log"
        )
        assert status_for(e.value).name == "INTERNAL"
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert logged.startswith("database call failed: ")
        for leak in ("the statement", "INSERT", "[SQL", "parameters", "sealed-secret-pw"):
            assert leak not in logged
        assert await store.read(lambda tx: tx.nodes.find()) == []  # rolled back
    finally:
        store.close()


async def test_writes_go_on_after_a_failed_one_and_nothing_committed_is_lost(
    engine: Engine,
) -> None:
    """The writer's connection is kept between transactions on SQLite: a
    unit of work that failed mid-transaction leaves nothing behind on it,
    and the next write commits (on a fresh connection)."""
    store = SqlStore(engine)
    try:
        await store.tx(lambda tx: tx.nodes.add(NodeRecord(name="n0", bmc_url="fake://n0"), "pw"))
        for work in (broken_sql, oversized_gpu):
            with pytest.raises(StoreFailed):
                await store.tx(work)
            await store.tx(lambda tx: tx.nodes.add(NodeRecord(name="n2", bmc_url="fake://2"), "pw"))
            names = await store.read(lambda tx: [n.name for n in tx.nodes.find()])
            assert names == ["n0", "n2"]  # n1 of the failed unit never landed
            await store.tx(lambda tx: tx.nodes.remove("n2"))
    finally:
        store.close()


async def test_the_sqlite_writer_keeps_one_connection(engine: Engine) -> None:
    """Each write transaction on SQLite runs on the writer's one connection
    (no checkout each time); on PostgreSQL each checks one out, pinged."""
    store = SqlStore(engine)
    checkouts: list[object] = []

    def checked_out(*args: object) -> None:
        checkouts.append(args)

    event.listen(engine, "checkout", checked_out)
    try:
        for i in range(20):
            await store.tx(
                lambda tx, i=i: tx.nodes.add(NodeRecord(name=f"n{i}", bmc_url="fake://x"), "pw")
            )
        expected = 1 if engine.dialect.name == "sqlite" else 20
        assert len(checkouts) == expected
        assert len(await store.read(lambda tx: tx.nodes.find())) == 20
    finally:
        event.remove(engine, "checkout", checked_out)
        store.close()
