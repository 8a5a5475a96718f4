"""Which nodes take new work: a ready node whose BMC is unreachable (or that
its BMC reports off) is held back from new allocations, a job already on it
keeps it, and ``racks list`` counts as ready exactly the nodes ``nodes list``
calls schedulable — on both stores."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks, power_sync_cycle, reconcile, set_fields
from core_fakes import FakeBmc

from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec
from controller.core.states import AllocationState, NodeState, PowerState

TRAYS = ["t1", "t2", "t3", "t4"]


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        yield fleet, Racks(fleet, stack)
        await fleet.stop()


async def rack_ready(fleet: Fleet, rack: str = "r1") -> int:
    (info,) = [r for r in await fleet.list_racks() if r.name == rack]
    return info.ready


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fields", "schedulable"),
    [
        ({}, True),
        ({"bmc_health": "degraded"}, True),  # answering, after retries
        ({"bmc_health": "unreachable"}, False),
        ({"power": PowerState.OFF}, False),
        ({"power": PowerState.UNKNOWN}, True),  # never read is not off
        ({"drained": True}, False),
    ],
    ids=["healthy", "bmc-degraded", "bmc-unreachable", "powered-off", "power-unknown", "drained"],
)
async def test_rack_ready_counts_exactly_the_schedulable_nodes(
    fleet: tuple[Fleet, Racks], fields: dict[str, Any], schedulable: bool
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await set_fields(f, "t1", **fields)
    node = await f.get_node("t1")
    assert node.state == NodeState.READY  # its state does not change, only what it may take
    assert node.schedulable is schedulable
    listed = await f.list_nodes(rack="r1")
    assert await rack_ready(f) == sum(n.schedulable for n in listed) == 3 + schedulable


@pytest.mark.timeout(60)
async def test_an_unreachable_bmc_holds_a_ready_node_back_until_it_answers_again(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["t1", "t2"], rack="r1")
    bmc.unreachable.add("t1")
    # Its agent vouches for its power: its BMC is read on its own pass of
    # every ``vouched_every``, so the BMC's loss shows within that many.
    await power_sync_cycle(f)
    node = await f.get_node("t1")
    assert node.bmc_health == "unreachable" and not node.schedulable
    assert await rack_ready(f) == 1

    # A single node goes to the one Kiln can still power off; two must wait.
    one = await f.create_allocation("one", AllocationSpec(nodes=1))
    assert one.state == AllocationState.READY and one.nodes == ("t2",)
    await f.release(one.id)
    await reconcile(f)
    two = await f.create_allocation("two", AllocationSpec(nodes=2))
    assert two.state == AllocationState.PENDING
    assert "1 node(s) held back: BMC unreachable" in two.reason

    # The BMC answers again: the next lifecycle pass lets the scheduler admit it.
    bmc.unreachable.discard("t1")
    await f.power_sync.run_once()
    await reconcile(f, passes=2)
    admitted = await f.get_allocation(two.id)
    assert admitted.state == AllocationState.READY and set(admitted.nodes) == {"t1", "t2"}


@pytest.mark.timeout(60)
async def test_a_job_keeps_its_node_when_the_bmc_becomes_unreachable(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["t1", "t2", "t3"], rack="r1")
    job = await f.create_allocation("job", AllocationSpec(nodes=2))
    assert job.state == AllocationState.READY
    held = job.nodes[0]
    bmc.unreachable.add(held)
    await power_sync_cycle(f)
    await f.allocations.schedule_pass()
    await reconcile(f)
    after = await f.get_allocation(job.id)
    assert after.state == AllocationState.READY and after.nodes == job.nodes
    node = await f.get_node(held)
    assert node.state == NodeState.ALLOCATED and node.allocation == job.id
    # Released, it is not handed to the next request while its BMC is away.
    await f.release(job.id)
    await reconcile(f)
    nxt = await f.create_allocation("next", AllocationSpec(nodes=2))
    assert nxt.state == AllocationState.READY and held not in nxt.nodes


@pytest.mark.timeout(60)
async def test_a_ready_node_its_bmc_reports_off_is_not_handed_out(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["t1", "t2"], rack="r1")
    bmc.power["t1"] = "off"  # pulled behind Kiln's back; the agent has not noticed yet
    await power_sync_cycle(f)  # its turn comes within vouched_every passes
    node = await f.get_node("t1")
    assert node.state == NodeState.READY and node.power == PowerState.OFF
    assert not node.schedulable and await rack_ready(f) == 1
    alloc = await f.create_allocation("a", AllocationSpec(nodes=1))
    assert alloc.nodes == ("t2",)
