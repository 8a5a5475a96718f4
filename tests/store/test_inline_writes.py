"""Where writes run: SQLite's on the event loop itself (no thread hand-off
for every statement), PostgreSQL's on the writer thread; either way in
groups, in order. With SQLite inline, the WAL is checkpointed into the
database file by a reader thread after writes, not by a commit on the loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from controller.core.records import NodeRecord
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore, SqlTx


def _add(name: str) -> object:
    def write(tx: SqlTx) -> int:
        tx.nodes.add(NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}"), "pw")
        return threading.get_ident()

    return write


@pytest.mark.timeout(60)
@pytest.mark.parametrize("inline", [None, False])
async def test_sqlite_writes_run_on_the_loop_unless_told_otherwise(
    tmp_path: Path, inline: bool | None
) -> None:
    store = SqlStore(open_engine(default_sqlite_url(tmp_path)), inline=inline)
    try:
        assert store.inline is (inline is None)
        threads = await asyncio.gather(*(store.tx(_add(f"w{i:03d}")) for i in range(50)))  # type: ignore[arg-type]
        on_loop = {t == threading.get_ident() for t in threads}
        assert on_loop == {inline is None}
        assert store.groups >= 1, "grouped either way"
        stored = await store.read(lambda tx: sorted(n.name for n in tx.nodes.find()))
        assert stored == [f"w{i:03d}" for i in range(50)]
    finally:
        store.close()


@pytest.mark.timeout(120)
async def test_by_default_only_sqlite_is_written_on_the_loop(engine: Engine) -> None:
    """PostgreSQL (a real server) keeps its writes on the writer thread."""
    store = SqlStore(engine)
    try:
        sqlite = engine.dialect.name == "sqlite"
        assert store.inline is sqlite
        thread = await store.tx(_add(f"wd-{uuid.uuid4().hex[:12]}"))  # type: ignore[arg-type]
        assert (thread == threading.get_ident()) is sqlite
    finally:
        store.close()


@pytest.mark.timeout(60)
async def test_the_wal_is_checkpointed_into_the_database_file_after_writes(
    tmp_path: Path,
) -> None:
    store = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    store.checkpoint_every = 0.0
    try:
        await store.tx(_add("cp-1"))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while store.checkpoints < 1:
            assert time.monotonic() < deadline, "no checkpoint ran"
            await asyncio.sleep(0.02)
        # The database file alone (the WAL ignored) now holds the row.
        path = tmp_path / "kiln.db"
        with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as db:
            names = [r[0] for r in db.execute("SELECT name FROM nodes")]
        assert names == ["cp-1"]
    finally:
        store.close()
