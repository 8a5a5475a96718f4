"""The store on both engines: migrations, the outbox, uniqueness of keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, SQLModel, select

from controller.core.errors import InvalidArgument
from controller.core.eventlog import EventLog, record
from controller.core.kinds import EventKind
from controller.core.records import LeakLook, NodeRecord
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.models import AllocationRow, EventRow
from controller.store.sql_store import SqlStore, SqlTx


def test_migrations_build_exactly_the_models(engine: Engine) -> None:
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == []
    assert {"nodes", "gpus", "allocations", "events"} <= set(inspect(engine).get_table_names())


def test_migrating_twice_is_a_no_op(engine: Engine) -> None:
    from controller.store.engine import migrate

    migrate(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0009"


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    eng = open_engine(default_sqlite_url(tmp_path))
    with eng.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    eng.dispose()


def test_unknown_database_scheme_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="unsupported database"):
        open_engine("mysql://localhost/kiln")
    with pytest.raises(InvalidArgument, match="psycopg"):
        open_engine("postgresql://localhost/kiln")


def test_allocation_keys_are_unique(engine: Engine) -> None:
    with Session(engine) as s:
        s.add(AllocationRow(id="a1", key="k", spec_json="{}"))
        s.commit()
    with Session(engine) as s, pytest.raises(IntegrityError):
        s.add(AllocationRow(id="a2", key="k", spec_json="{}"))
        s.commit()


async def test_events_commit_with_the_change_and_read_back_in_order(engine: Engine) -> None:
    db = SqlStore(engine)
    log = EventLog(db)

    def write(tx: SqlTx) -> None:
        node = NodeRecord(name="n1", bmc_url="redfish+http://127.0.0.1:1/redfish/v1/Systems/1")
        tx.nodes.add(node, "pw")
        record(tx, EventKind.NODE_ENROLLED, node="n1", reason="enrolled", extra=1)
        record(tx, EventKind.NODE_TRANSITION, node="n1", reason="next")

    await db.tx(write)

    def failing(tx: SqlTx) -> None:
        record(tx, EventKind.NODE_TRANSITION, node="n1", reason="never")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await db.tx(failing)  # rolled back: its event is gone with it
    events = await log.since(0)
    assert [e.kind for e in events] == ["node.enrolled", "node.transition"]
    assert events[0].seq < events[1].seq
    assert events[0].data == {"extra": 1}
    later = await log.since(events[0].seq)
    assert [e.reason for e in later] == ["next"]
    rows = await db.read(lambda tx: list(tx.session.exec(select(EventRow))))
    assert all(not r.published for r in rows)
    assert json.loads(rows[0].data_json) == {"extra": 1}
    db.close()


def test_health_json_is_the_whole_report_by_name_and_reads_back_the_same() -> None:
    import json

    from controller.core.health import GpuHealth, HealthReport
    from controller.store.repositories import health_from_json, health_to_json

    gpu = GpuHealth(
        index=3,
        uuid="GPU-3",
        temp_c=71.5,
        sm_clock_mhz=1980,
        remap_pending=True,
        xids=(79, 48),
        nvlink_down=(2,),
        errors=("remapped rows: Not Supported",),
        recovery_action=2,
    )
    report = HealthReport(
        sampled_at=12.5, source="bmc", gpus=(gpu,), bmc_temps_c=(41.0,), drift=("clocks",)
    )
    stored = json.loads(health_to_json(report))
    named = dict(zip(stored["report_fields"], stored["values"], strict=True))
    assert named["sampled_at"] == 12.5 and named["drift"] == ["clocks"]
    first = dict(zip(stored["gpu_fields"], named["gpus"][0], strict=True))
    assert first["temp_c"] == 71.5 and first["xids"] == [79, 48] and first["recovery_action"] == 2
    assert health_from_json(health_to_json(report)) == report


def test_a_report_stored_in_an_older_shape_still_reads_back() -> None:
    """Reports written as objects (Kiln before the positional document,
    NaN as json.dumps wrote it) and positional ones whose fields were since
    added or dropped read back by name; unknown fields are ignored."""
    import json
    import math

    from controller.core.health import GpuHealth, HealthReport
    from controller.store.repositories import health_from_json

    as_objects = (
        '{"sampled_at": 3.0, "source": "agent", "gpus": [{"index": 0, "uuid": "GPU-0", '
        '"temp_c": NaN, "xids": [79], "retired": 1}], "bmc_temps_c": [], "drift": []}'
    )
    read = health_from_json(as_objects)
    assert read is not None and read.sampled_at == 3.0
    assert read.gpus[0].uuid == "GPU-0" and read.gpus[0].xids == (79,)
    assert read.gpus[0].temp_c is not None and math.isnan(read.gpus[0].temp_c)

    older = json.dumps(
        {
            "report_fields": ["sampled_at", "gpus", "retired_field"],
            "gpu_fields": ["index", "temp_c", "old_counter"],
            "values": [9.5, [[1, 66.0, 7]], "x"],
        }
    )
    assert health_from_json(older) == HealthReport(
        sampled_at=9.5, gpus=(GpuHealth(index=1, temp_c=66.0),)
    )


async def test_rows_written_on_the_driver_read_back_and_keep_their_constraints(
    engine: Engine,
) -> None:
    """A node's save, an allocation's add and save and a unit's events go
    as plain SQL on the driver (``controller.store.driver_sql``): what they
    wrote reads back column for column on both engines (a keyword column,
    ``key``; a boolean; a JSON list; a quote in a value), and a second
    allocation with the same key is refused as a duplicate, writing
    nothing of its unit."""
    from controller.core.errors import DuplicateKey
    from controller.core.model import AllocationSpec
    from controller.core.records import AllocationRecord
    from controller.core.states import AllocationState, NodeState

    db = SqlStore(engine)
    url = "redfish+http://127.0.0.1:1/redfish/v1/Systems/1"

    def enrol(tx: SqlTx) -> None:
        tx.nodes.add(NodeRecord(name="n1", bmc_url=url), "pw")

    await db.tx(enrol)

    def book(tx: SqlTx) -> None:
        node = tx.nodes.get("n1")
        assert node is not None
        node.state, node.drained, node.allocation_id = NodeState.ALLOCATED, True, "a1"
        node.state_reason = 'it\'s booked; "quoted" ? %s'
        tx.nodes.save(node)
        alloc = AllocationRecord(id="a1", key="select", spec=AllocationSpec(nodes=1), nodes=["n1"])
        tx.allocations.add(alloc)
        alloc.state = AllocationState.READY
        tx.allocations.save(alloc)
        record(tx, EventKind.NODE_TRANSITION, node="n1", allocation="a1", reason="booked ?")
        record(tx, EventKind.ALLOCATION_CREATED, allocation="a1", reason="%s it")

    await db.tx(book)
    fresh = SqlStore(engine)  # no rows remembered: read from the database
    node, alloc = await fresh.read(lambda tx: (tx.nodes.get("n1"), tx.allocations.by_key("select")))
    assert node is not None and alloc is not None
    assert (node.state, node.drained, node.allocation_id) == (NodeState.ALLOCATED, True, "a1")
    assert node.state_reason == 'it\'s booked; "quoted" ? %s'
    assert (alloc.id, alloc.state, alloc.nodes) == ("a1", AllocationState.READY, ["n1"])
    events = await EventLog(fresh).since(0)
    assert [(e.kind, e.reason) for e in events[-2:]] == [
        ("node.transition", "booked ?"),
        ("allocation.created", "%s it"),
    ]

    def again(tx: SqlTx) -> None:
        record(tx, EventKind.NODE_TRANSITION, node="n1", reason="never stored")
        tx.allocations.add(AllocationRecord(id="a2", key="select", spec=AllocationSpec(nodes=1)))

    with pytest.raises(DuplicateKey):
        await db.tx(again)
    assert await fresh.read(lambda tx: tx.allocations.get("a2")) is None
    assert len(await EventLog(fresh).since(0)) == len(events)
    db.close()
    fresh.close()


async def test_a_members_kind_and_a_trays_rack_hold_read_back(engine: Engine) -> None:
    from controller.core.states import NodeKind

    db = SqlStore(engine)
    url = "redfish+http://127.0.0.1:1/redfish/v1/Systems/"

    def write(tx: SqlTx) -> None:
        tx.nodes.add(NodeRecord(name="sw", bmc_url=url + "1", kind=NodeKind.SWITCH_TRAY), "pw")
        tx.nodes.add(NodeRecord(name="t1", bmc_url=url + "2", rack_hold="rack r1 held"), "pw")
        tx.nodes.add(NodeRecord(name="old", bmc_url=url + "3"), "pw")

    await db.tx(write)
    got = await db.read(lambda tx: {n: tx.nodes.get(n) for n in ("sw", "t1", "old")})
    assert got["sw"].kind == NodeKind.SWITCH_TRAY and got["sw"].rack_hold == ""
    assert got["t1"].kind == NodeKind.COMPUTE and got["t1"].rack_hold == "rack r1 held"
    assert got["old"].kind == NodeKind.COMPUTE
    db.close()


async def test_leak_looks_are_kept_replaced_and_go_with_their_node(engine: Engine) -> None:
    """The leak watcher's reads without detectors (``LeakLook``) on both
    engines: kept by node, replaced, forgotten (None), a node no longer
    enrolled skipped, and removed with its node (PostgreSQL's foreign key)."""
    db = SqlStore(engine)
    url = "redfish+http://127.0.0.1:1/redfish/v1/Systems/"

    def enrol(tx: SqlTx) -> None:
        for name in ("n1", "n2", "n3"):
            tx.nodes.add(NodeRecord(name=name, bmc_url=url + name), "pw")

    await db.tx(enrol)
    first = {
        "n1": LeakLook(url + "n1", 1000.0, 1),
        "n2": LeakLook(url + "n2", 1001.5, 3),
        "gone": LeakLook(url + "gone", 1002.0, 1),
    }
    await db.tx(lambda tx: tx.nodes.save_leak_looks(first))
    looks = await db.read(lambda tx: tx.nodes.leak_looks())
    assert looks == {"n1": first["n1"], "n2": first["n2"]}

    later = LeakLook(url + "n2", 1601.5, 4)
    await db.tx(lambda tx: tx.nodes.save_leak_looks({"n1": None, "n2": later, "n3": None}))
    assert await db.read(lambda tx: tx.nodes.leak_looks()) == {"n2": later}

    await db.tx(lambda tx: tx.nodes.remove("n2"))
    assert await db.read(lambda tx: tx.nodes.leak_looks()) == {}
    db.close()


async def test_a_view_that_fails_to_follow_a_commit_leaves_no_caller_waiting(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A node listener that raises on the loop: every caller of the group
    still gets its answer (a caller left unanswered would wait forever), the
    other listeners still hear, the writes stay committed, and it is logged."""
    import asyncio

    db = SqlStore(engine)
    url = "redfish+http://127.0.0.1:1/redfish/v1/Systems/"
    heard: list[str] = []

    def broken(changes: object) -> None:
        raise RuntimeError("view out of step")

    db.on_nodes_committed(broken)
    db.on_nodes_committed(lambda changes: heard.extend(changes.saved))

    def enrol(name: str):  # type: ignore[no-untyped-def]
        return lambda tx: tx.nodes.add(NodeRecord(name=name, bmc_url=url + name), "pw")

    async with asyncio.timeout(30):
        await asyncio.gather(*(db.tx(enrol(f"n{i}")) for i in range(8)))
    assert sorted(heard) == [f"n{i}" for i in range(8)]
    stored = await db.read(lambda tx: [n.name for n in tx.nodes.find()])
    assert sorted(stored) == [f"n{i}" for i in range(8)]
    assert "failed to follow" in caplog.text
    db.close()
