"""Node reads come from memory: the view the store keeps current on commit.

Against both stores (the in-memory fake and SQLite): once loaded, reads make
no store call; a commit is visible to the next read; a unit of work that
fails leaves the view as it was (also inside a group commit); a commit that
lands while the view loads is not hidden by the load; what could ever fit the
fleet is re-judged only when its inventory changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from core_fakes import FakeBmc
from store_probes import ReadCountingStore, group_sizes

from controller.core.errors import NotFound
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec, EnrollSpec, GpuInfo
from controller.core.node_view import NodeChanges, NodeView
from controller.core.ports import Store, Tx
from controller.core.records import NodeRecord
from controller.core.states import NodeState
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.sql_store import SqlStore

T = TypeVar("T")


def spec(i: int, rack: str = "r1") -> EnrollSpec:
    return EnrollSpec(
        name=f"n{i:03d}", bmc_url=f"fake://bmc-{i}", username="admin", password="pw", rack=rack
    )


def h200(index: int, clique: str = "") -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", model="NVIDIA H200", clique=clique)


@pytest.mark.timeout(60)
async def test_reads_after_the_load_make_no_store_call(store: Store) -> None:
    counting = ReadCountingStore(store)
    fleet = Fleet(counting, FakeBmc())  # type: ignore[arg-type]
    for i in range(5):
        await fleet.enroll(spec(i, rack="r1" if i < 3 else "r2"))
    await fleet.nodes.agent_registered("n001", [h200(0), h200(1)], "")
    before = counting.reads
    assert (await fleet.get_node("n001")).gpu_count == 2
    assert [g.index for g in (await fleet.get_node("n001")).gpus] == [0, 1]
    assert [n.name for n in await fleet.nodes.query(rack="r2")] == ["n003", "n004"]
    assert [n.name for n in await fleet.nodes.page("n001", 2)] == ["n002", "n003"]
    assert [n.name for n in await fleet.nodes.records_in([NodeState.ENROLLED])][:2] == [
        "n000",
        "n001",
    ]
    with pytest.raises(NotFound):
        await fleet.get_node("ghost")
    assert counting.reads == before


@pytest.mark.timeout(60)
async def test_a_commit_is_visible_to_the_next_read_and_a_failed_one_is_not(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    fleet = make_fleet()
    await fleet.enroll(spec(1))
    await fleet.nodes.loaded()

    def drain(tx: Tx) -> None:
        node = tx.nodes.get("n001")
        assert node is not None
        node.drained = True
        node.state_reason = "by hand"
        tx.nodes.save(node)

    await store.tx(drain)
    shown = await fleet.get_node("n001")
    assert shown.drained and shown.state_reason == "by hand"

    def save_then_fail(tx: Tx) -> None:
        node = tx.nodes.get("n001")
        assert node is not None
        node.state_reason = "never committed"
        tx.nodes.save(node)
        raise RuntimeError("the unit of work fails after saving")

    with pytest.raises(RuntimeError):
        await store.tx(save_then_fail)
    assert (await fleet.get_node("n001")).state_reason == "by hand"
    # What a caller gets from ``record`` is its own copy.
    mine = await fleet.nodes.record("n001")
    mine.state_reason = "changed outside a transaction"
    assert (await fleet.get_node("n001")).state_reason == "by hand"


@pytest.mark.timeout(60)
async def test_a_failing_unit_in_a_group_commit_leaves_the_others_in_the_view(
    tmp_path: Path,
) -> None:
    store = SqlStore(open_engine(default_sqlite_url(tmp_path)))
    try:
        fleet = Fleet(store, FakeBmc())
        for i in range(3):
            await fleet.enroll(spec(i))
        await fleet.nodes.loaded()
        sizes = group_sizes(store)

        def reason(name: str, text: str, fail: bool = False) -> Callable[[Tx], None]:
            def write(tx: Tx) -> None:
                node = tx.nodes.get(name)
                assert node is not None
                node.state_reason = text
                tx.nodes.save(node)
                if fail:
                    raise ValueError("refused")

            return write

        results = await asyncio.gather(
            store.tx(reason("n000", "first")),
            store.tx(reason("n001", "failing", fail=True)),
            store.tx(reason("n002", "third")),
            return_exceptions=True,
        )
        assert isinstance(results[1], ValueError)
        assert (await fleet.get_node("n000")).state_reason == "first"
        assert (await fleet.get_node("n001")).state_reason == ""  # as enrolled
        assert (await fleet.get_node("n002")).state_reason == "third"
        assert sizes == [3]  # the three were tried as one group first
    finally:
        store.close()


def test_a_commit_during_the_load_is_applied_after_it() -> None:
    view = NodeView()
    old = NodeRecord(name="a", bmc_url="fake://a", state=NodeState.ENROLLED)
    new = NodeRecord(name="a", bmc_url="fake://a", state=NodeState.READY)
    added = NodeRecord(name="b", bmc_url="fake://b")
    view.begin_load()
    view.committed(NodeChanges(saved={"a": new, "b": added}))  # while the load reads
    assert not view.ready
    view.install([old], {})  # the load read the fleet before that commit
    assert view.ready
    assert view.get("a") is new
    assert [n.name for n in view.all()] == ["a", "b"]
    assert [n.name for n in view.in_states([NodeState.ENROLLED])] == ["b"]
    assert [n.name for n in view.in_states([NodeState.READY])] == ["a"]


def test_a_feed_gives_what_commits_saved_or_removed_since_its_last_take() -> None:
    view = NodeView()
    a = NodeRecord(name="a", bmc_url="fake://a")
    view.install([a, NodeRecord(name="b", bmc_url="fake://b")], {})
    feed = view.watch()
    assert feed.take() == (True, set())  # a new feed starts from everything
    assert feed.take() == (False, set())
    view.committed(NodeChanges(saved={"a": a}))
    view.committed(NodeChanges(removed=frozenset({"b"})))
    assert feed.take() == (False, {"a", "b"})
    assert feed.take() == (False, set())
    view.begin_load()
    view.committed(NodeChanges(saved={"c": NodeRecord(name="c", bmc_url="fake://c")}))
    view.install([a], {})  # loaded anew: the reader must look at everything
    assert feed.take() == (True, {"c"})


def test_inventory_version_moves_with_inventory_not_with_bookings() -> None:
    view = NodeView()
    node = NodeRecord(name="a", bmc_url="fake://a", state=NodeState.READY, gpu_count=8)
    view.install([node], {})
    version = view.inventory_version
    booked = NodeRecord(
        name="a", bmc_url="fake://a", state=NodeState.ALLOCATED, gpu_count=8, allocation_id="x"
    )
    view.committed(NodeChanges(saved={"a": booked}))
    assert view.inventory_version == version
    smaller = NodeRecord(name="a", bmc_url="fake://a", state=NodeState.ALLOCATED, gpu_count=4)
    view.committed(NodeChanges(saved={"a": smaller}))
    assert view.inventory_version == version + 1
    view.committed(NodeChanges(saved={"b": NodeRecord(name="b", bmc_url="fake://b")}))
    assert view.inventory_version == version + 2


@pytest.mark.timeout(60)
async def test_a_request_that_never_fits_is_judged_again_when_the_fleet_grows(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet()
    for i in range(2):
        await fleet.enroll(spec(i))
        await fleet.nodes.agent_registered(f"n{i:03d}", [h200(0)], "")
    three = AllocationSpec(nodes=3)
    with pytest.raises(Exception, match="can never fit"):
        await fleet.allocations.create("k1", three)
    with pytest.raises(Exception, match="can never fit"):  # the kept verdict
        await fleet.allocations.create("k2", three)
    await fleet.enroll(spec(2))
    await fleet.nodes.agent_registered("n002", [h200(0)], "")
    queued = await fleet.allocations.create("k3", three)  # three nodes now: it may fit
    assert queued.id


@pytest.mark.timeout(60)
async def test_an_unknown_node_names_the_closest_one(make_fleet: Callable[..., Fleet]) -> None:
    fleet = make_fleet()
    await fleet.enroll(spec(1))
    with pytest.raises(NotFound, match=r"node 'n00l' not found; did you mean 'n001'\?"):
        await fleet.get_node("n00l")
    with pytest.raises(NotFound) as far:
        await fleet.get_node("something-else")
    assert str(far.value) == "node 'something-else' not found"
