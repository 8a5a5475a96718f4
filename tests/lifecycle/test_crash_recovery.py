"""A controller killed at any moment and restarted resumes or rolls back every
unfinished operation: no node stuck mid-operation, none allocated twice, no
acknowledged allocation lost, released allocations stay released, and the
event log stays strictly increasing with nothing lost or rewritten.

The controller is a real child process that gets SIGKILL; the fleet (the
sushy-tools emulator and agents on the NVML fake) lives in the test process
and re-dials the restarted controller on its own. ``KILN_CRASH_SEED`` and
``KILN_CRASH_KILLS`` replay or lengthen a run.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from crash_driver import PROFILE_NAME, SPECS
from crash_harness import KILL_MODES, CrashHarness, KillRecord, summary, unsettled
from crash_store import (
    StoredAllocation,
    StoredEvent,
    StoredNode,
    StoreSnapshot,
    read_store,
    store_violations,
)

from controller.sim.fleet import default_fleet
from kiln.v1 import fleet_pb2, types_pb2

SEED = int(os.environ.get("KILN_CRASH_SEED", "20250611"))
KILLS = int(os.environ.get("KILN_CRASH_KILLS", "16"))


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[CrashHarness]:
    # One NVL72 rack of 4 trays (one NVLink domain) and 4 HGX H200 boxes.
    specs = default_fleet(nvl72_racks=1, hgx_nodes=4, trays=4)
    h = CrashHarness(tmp_path, specs, random.Random(SEED))
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


def kill_plan(rng: random.Random, kills: int) -> list[str]:
    """The first kill lands during initial preparation; then every mode in turn."""
    plan = ["preparing"]
    while len(plan) < kills:
        block = list(KILL_MODES)
        rng.shuffle(block)
        plan += block
    return plan[:kills]


async def test_controller_killed_at_random_points_recovers_every_operation(
    harness: CrashHarness,
) -> None:
    started = time.monotonic()
    records: list[KillRecord] = []
    for mode in kill_plan(random.Random(SEED), KILLS):
        records.append(await harness.crash_once(mode))
    final = await harness.wind_down()
    print(f"seed {SEED}: {summary(records, harness.ledger, time.monotonic() - started)}")

    assert harness.controller.kills == KILLS
    hits = {m: sum(r.hit for r in records if r.mode == m) for m in KILL_MODES}
    assert all(hits.values()), f"some crash moments were never reached: {hits}"
    assert len(harness.ledger.acked) >= KILLS, "too few acknowledged allocations to mean much"
    assert harness.ledger.released, "no release was ever acknowledged"
    assert all(n.state == "ready" and not n.allocation for n in final.nodes.values())
    assert {a.state for a in final.allocations.values()} <= {"released", "failed"}


async def test_node_drained_mid_preparation_resumes_it_after_crash_and_undrain(
    harness: CrashHarness,
) -> None:
    """A node drained while it is prepared for its allocation, then a crash, then
    undrain: the preparation resumes and the allocation is handed over."""
    await harness.check()
    driver = harness.driver()
    spec = dict(SPECS)["h200x1-profile"]
    for _ in range(5):  # the drain must land before the reconciler prepares the node
        alloc = await driver.create("mid-prep", spec)
        assert alloc is not None and len(alloc.nodes) == 1
        name = alloc.nodes[0]
        await driver.drain(name, True)
        snap = await asyncio.to_thread(read_store, harness.controller.db_path)
        drains = [e for e in snap.events if e.node == name and e.kind == "node.transition"]
        if drains[-1].data.get("from_state") == "preparing":
            break
        await driver.release(alloc.id)
        await driver.drain(name, False)
        await harness.check()
    else:
        pytest.fail("the reconciler always prepared the node before the drain landed")

    await harness.restart()
    await harness.check()  # drained and held: draining, the allocation still preparing
    await harness.driver().drain(name, False)
    snap = await harness.check()
    assert snap.allocations[alloc.id].state == "ready"
    assert snap.nodes[name].state == "allocated"
    assert snap.nodes[name].applied_profile == PROFILE_NAME


# -- the checks themselves catch what they claim to --------------------------------


def node(name: str, state: str = "ready", allocation: str = "") -> StoredNode:
    return StoredNode(name, state, allocation, drained=False)


def transition(seq: int, name: str, to_state: str) -> StoredEvent:
    return StoredEvent(seq, "node.transition", name, data={"to_state": to_state})


GOOD = StoreSnapshot(
    nodes={"a": node("a", "allocated", "x"), "b": node("b")},
    allocations={"x": StoredAllocation("x", "k1", "ready", ("a",))},
    events=[
        transition(1, "a", "ready"),
        transition(2, "b", "ready"),
        transition(3, "a", "allocated"),
    ],
)


@pytest.mark.parametrize(
    ("snap", "before", "expected"),
    [
        pytest.param(GOOD, GOOD.events[:2], [], id="consistent"),
        pytest.param(
            StoreSnapshot(
                nodes={"a": node("a", "allocated", "x")},
                allocations={
                    "x": StoredAllocation("x", "k1", "ready", ("a",)),
                    "y": StoredAllocation("y", "k2", "ready", (), ("a",)),
                },
                events=[transition(1, "a", "allocated")],
            ),
            [],
            ["booked by 2 allocations"],
            id="node-in-two-allocations",
        ),
        pytest.param(
            StoreSnapshot(
                nodes={"a": node("a", "allocated", "x")},
                allocations={"x": StoredAllocation("x", "k1", "released", ("a",))},
                events=[transition(1, "a", "allocated")],
            ),
            [],
            ["does not hold it"],
            id="node-held-by-released",
        ),
        pytest.param(
            StoreSnapshot(nodes={"a": node("a", "allocated")}, allocations={}, events=[]),
            [],
            ["allocated to nothing", "last transition event says enrolled"],
            id="allocated-to-nothing-and-unlogged",
        ),
        pytest.param(GOOD, [*GOOD.events, transition(4, "b", "draining")], ["was lost"], id="lost"),
        pytest.param(
            StoreSnapshot(GOOD.nodes, GOOD.allocations, [GOOD.events[1], GOOD.events[0]]),
            [],
            ["not strictly increasing", "its last transition event says"],
            id="out-of-order",
        ),
    ],
)
def test_store_checks_flag_broken_snapshots(
    snap: StoreSnapshot, before: list[StoredEvent], expected: list[str]
) -> None:
    problems = store_violations(snap, before)
    assert len(problems) == len(expected), problems
    for problem, want in zip(problems, expected, strict=True):
        assert want in problem


def api_node(name: str, state: int, **kw: object) -> fleet_pb2.Node:
    return fleet_pb2.Node(name=name, state=state, agent_connected=True, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nodes", "allocs", "drain", "expected"),
    [
        pytest.param([api_node("a", types_pb2.NODE_STATE_READY)], [], {}, 0, id="settled"),
        pytest.param([api_node("a", types_pb2.NODE_STATE_RELEASING)], [], {}, 1, id="releasing"),
        pytest.param(
            [api_node("a", types_pb2.NODE_STATE_DRAINING)], [], {"a": True}, 1, id="drain-stuck"
        ),
        pytest.param(
            [api_node("a", types_pb2.NODE_STATE_DRAINING, allocation="x")],
            [],
            {"a": True},
            0,
            id="draining-while-held",
        ),
        pytest.param(
            [api_node("a", types_pb2.NODE_STATE_READY)], [], {"a": True}, 1, id="drain-lost"
        ),
        pytest.param(
            [api_node("a", types_pb2.NODE_STATE_READY, schedulable=True, gpu_model="H200")],
            [
                fleet_pb2.Allocation(
                    id="p",
                    state=fleet_pb2.ALLOCATION_STATE_PENDING,
                    spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200"),
                )
            ],
            {},
            1,
            id="pending-that-fits",
        ),
    ],
)
def test_settle_check_flags_unfinished_operations(
    nodes: list[fleet_pb2.Node],
    allocs: list[fleet_pb2.Allocation],
    drain: dict[str, bool],
    expected: int,
) -> None:
    assert len(unsettled(nodes, allocs, drain, {})) == expected
