"""Scheduling passes overlap: one decides while the one before it commits.

The pass deciding counts the placements of the passes not committed yet as
booked, so two requests in two overlapping passes get different nodes; a
pass whose transaction fails leaves its nodes free and the pass after it
admitted as it was decided; a caller hears its answer only once every pass
before its own has committed — on the in-memory store and on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks

from controller.core.errors import KilnError
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec
from controller.core.states import AllocationState, NodeState

pytestmark = pytest.mark.timeout(60)

TRAYS = [f"r1-t{i}" for i in range(1, 5)]


class Broken(KilnError):
    template = "the database is gone"


class GatedStore:
    """The fleet's store with its first write held until ``gate`` opens
    (and then failed, when ``fail`` is set): that pass stays in flight."""

    def __init__(self, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = asyncio.Event()
        self.fail = False
        self.writes = 0
        store = fleet.allocations._store
        real = store.tx

        async def tx(fn: Callable[[Any], Any]) -> Any:
            self.writes += 1
            if self.writes == 1:
                await self.gate.wait()
                if self.fail:
                    raise Broken()
            return await real(fn)

        monkeypatch.setattr(store, "tx", tx)


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(TRAYS, rack="r1")
        yield fleet
        await fleet.stop()


async def until(check: Callable[[], bool]) -> None:
    for _ in range(5000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("not within 5 s")


async def test_a_pass_decides_while_the_one_before_it_commits(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = GatedStore(fleet, monkeypatch)
    first = asyncio.create_task(fleet.create_allocation("a", AllocationSpec(nodes=2)))
    await until(lambda: gated.writes == 1)  # its pass is in flight
    second = asyncio.create_task(fleet.create_allocation("b", AllocationSpec(nodes=2)))
    # The second pass decided and wrote while the first still waits ...
    await until(lambda: gated.writes == 2)
    await asyncio.sleep(0.05)
    # ... but its caller hears nothing before the pass before it committed.
    assert not first.done() and not second.done()
    gated.gate.set()
    a, b = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert a.state == b.state == AllocationState.READY
    assert not set(a.nodes) & set(b.nodes), "a node booked twice"
    nodes = {n.name: n for n in await fleet.list_nodes()}
    assert {nodes[n].allocation for n in a.nodes} == {a.id}
    assert {nodes[n].allocation for n in b.nodes} == {b.id}
    assert fleet.allocations._in_flight == []


async def test_a_failed_pass_leaves_its_nodes_free_and_the_next_as_decided(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = GatedStore(fleet, monkeypatch)
    gated.fail = True
    first = asyncio.create_task(fleet.create_allocation("a", AllocationSpec(nodes=2)))
    await until(lambda: gated.writes == 1)
    second = asyncio.create_task(fleet.create_allocation("b", AllocationSpec(nodes=2)))
    await until(lambda: gated.writes == 2)
    gated.gate.set()
    with pytest.raises(Broken):
        await asyncio.wait_for(first, 5)
    b = await asyncio.wait_for(second, 5)
    assert b.state == AllocationState.READY
    assert [a.key for a in await fleet.list_allocations(include_released=True)] == ["b"]
    free = [n for n in await fleet.list_nodes() if not n.allocation]
    assert len(free) == 2 and all(n.state == NodeState.READY for n in free)
    # The nodes the failed pass had chosen are free to the next request.
    c = await fleet.create_allocation("c", AllocationSpec(nodes=2))
    assert c.state == AllocationState.READY and set(c.nodes) == {n.name for n in free}
