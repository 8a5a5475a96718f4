"""The store's writing thread: it takes the next group as soon as one has
committed, without waiting for the event loop; closing it lets the group
running commit, fails what is still queued and refuses what comes after —
on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.engine import Engine

from controller.core.records import NodeRecord
from controller.store.sql_store import SqlStore, SqlTx, StoreUnavailable

pytestmark = pytest.mark.timeout(60)


def write(name: str, started: dict[str, float], hold: float = 0.0) -> object:
    def unit(tx: SqlTx) -> str:
        started[name] = time.monotonic()
        time.sleep(hold)  # a slow unit: the writer is busy meanwhile
        tx.nodes.add(NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}"), "pw")
        return name

    return unit


async def test_the_next_group_runs_while_the_event_loop_is_busy(engine: Engine) -> None:
    store = SqlStore(engine)
    started: dict[str, float] = {}
    try:
        first = asyncio.ensure_future(store.tx(write("wt-a", started, hold=0.1)))  # type: ignore[arg-type]
        await asyncio.sleep(0.02)  # the writer is in the first unit
        second = asyncio.ensure_future(store.tx(write("wt-b", started)))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # queued behind it
        blocked_at = time.monotonic()
        time.sleep(0.5)  # the event loop does nothing for half a second
        unblocked_at = time.monotonic()
        assert await asyncio.wait_for(asyncio.gather(first, second), 10) == ["wt-a", "wt-b"]
        # The second group began while the loop was still blocked.
        assert blocked_at < started["wt-b"] < unblocked_at
    finally:
        store.close()


async def test_closing_commits_the_group_running_and_fails_the_rest(engine: Engine) -> None:
    store = SqlStore(engine)
    started: dict[str, float] = {}
    running = asyncio.ensure_future(store.tx(write("wt-c", started, hold=0.3)))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    queued = asyncio.ensure_future(store.tx(write("wt-d", started)))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await asyncio.to_thread(store.close)  # waits for the group running
    assert await running == "wt-c"
    with pytest.raises(StoreUnavailable):
        await queued
    with pytest.raises(StoreUnavailable):
        await store.tx(write("wt-e", started))  # type: ignore[arg-type]
    assert "wt-d" not in started and "wt-e" not in started
    again = SqlStore(engine)
    try:
        stored = await again.read(
            lambda tx: [n.name for n in tx.nodes.find() if n.name.startswith("wt-")]
        )
        assert stored == ["wt-c"]
    finally:
        again.close()


async def test_the_writer_says_how_much_it_has_done(engine: Engine) -> None:
    store = SqlStore(engine)
    started: dict[str, float] = {}
    try:
        before = store.writer_figures()
        assert before == {"groups": 0, "units": 0, "busy_seconds": 0.0, "queued": 0}
        slow = asyncio.ensure_future(store.tx(write("wf-a", started, hold=0.2)))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # the writer is in the first unit
        rest = [asyncio.ensure_future(store.tx(write(f"wf-{i}", started))) for i in range(3)]  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert store.writer_figures()["queued"] == 3
        await asyncio.gather(slow, *rest)
        after = store.writer_figures()
        assert after["units"] == 4
        assert after["groups"] == 2  # the slow one, then the three queued behind it
        assert after["busy_seconds"] >= 0.2
        assert after["queued"] == 0
    finally:
        store.close()
