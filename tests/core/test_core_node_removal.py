"""Retiring a node (``Fleet.remove_node``), on the in-memory store and SQLite:
refused while allocated (naming the allocation) unless forced, which takes
the node out of its allocation first; its events stay; everything else of it
goes (record, GPUs, agent tokens, view, health samples, backoff, session)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import Racks
from core_fakes import FakeBmc

from controller.core.errors import FailedPrecondition, NotFound, Unauthenticated
from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.identity import SYSTEM
from controller.core.model import AllocationSpec
from controller.core.ports import Store, Tx
from controller.core.states import AllocationState

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        racks = Racks(fleet, stack)
        yield fleet, racks
        await fleet.stop()


async def test_a_free_node_is_removed_and_its_events_stay(
    fleet: tuple[Fleet, Racks], store: Store, bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["n1", "n2"], rack="r1")
    token = await f.tokens.issue_agent_token("n1", by=SYSTEM)
    assert (await f.authenticate(token)).name  # works before
    await f.nodes.agent_health("n1", HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0),)))
    assert await f.remove_node("n1", reason="decommissioned") == ""
    with pytest.raises(NotFound):
        await f.get_node("n1")
    assert [n.name for n in await f.list_nodes()] == ["n2"]
    assert not f.agents.is_connected("n1")
    assert f.live.health("n1") is None and f.live.history("n1") == []
    with pytest.raises(Unauthenticated):  # its agent's token went with it
        await f.authenticate(token)
    kinds = [e.kind for e in await f.events.since(0, node="n1")]
    assert kinds[0] == "node.enrolled" and kinds[-1] == "node.removed"  # history kept
    removed = (await f.events.since(0, node="n1"))[-1]
    assert removed.reason == "decommissioned" and removed.data["rack"] == "r1"

    def leftovers(tx: Tx) -> tuple[object, ...]:
        return tx.nodes.get("n1"), tx.nodes.gpus("n1"), [t.node for t in tx.tokens.find()]

    node, gpus, token_nodes = await store.read(leftovers)
    assert node is None and gpus == [] and "n1" not in token_nodes
    # The name may be enrolled again, as a new node.
    await racks.add(["n1"], rack="r1")
    assert (await f.get_node("n1")).state.value == "ready"


async def test_an_allocated_node_is_refused_naming_its_allocation_unless_forced(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(["r1-t1", "r1-t2", "r1-t3"], rack="r1")
    alloc = await f.create_allocation("job", AllocationSpec(nodes=2, topology="nvlink"))
    assert alloc.state == AllocationState.READY
    victim = alloc.nodes[0]
    with pytest.raises(FailedPrecondition, match=f"allocation {alloc.id}"):
        await f.remove_node(victim)
    assert (await f.get_node(victim)).allocation == alloc.id  # nothing changed
    assert await f.remove_node(victim, force=True, reason="pulled") == alloc.id
    after = await f.allocations.get(alloc.id)
    assert victim not in after.nodes and len(after.nodes) == 2  # replaced by the free tray
    kinds = [e.kind for e in await f.events.since(0, allocation=alloc.id)]
    assert "allocation.node_replaced" in kinds


async def test_an_unknown_node_is_not_found(fleet: tuple[Fleet, Racks]) -> None:
    f, _ = fleet
    with pytest.raises(NotFound):
        await f.remove_node("ghost")
