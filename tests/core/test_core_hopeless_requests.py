"""Requests no fleet state could ever admit are refused at once, storing
nothing: an unknown queue, more GPUs than the queue's quota plus borrowing,
and requests that only drained or out-of-service uninspected nodes seemed to
keep possible — on both stores."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import Racks, reconcile, spec

from controller.core.admission import fewest_gpus
from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec
from controller.core.ports import Tx
from controller.core.records import NodeRecord
from controller.core.states import AllocationState, NodeState
from controller.core.transitions import load_node
from controller.placement import QueueConfig

TRAYS = [f"t{i}" for i in range(1, 5)]  # one NVL rack of 4 trays, 4 GB200 each
QUEUES = (QueueConfig("research", gpu_quota=8, borrowing_limit=4), QueueConfig("batch"))


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet(queues=QUEUES)
    async with contextlib.AsyncExitStack() as stack:
        yield fleet, Racks(fleet, stack)
        await fleet.stop()


async def nothing_stored(fleet: Fleet, events_before: int) -> None:
    assert await fleet.list_allocations(include_released=True) == []
    assert len(await fleet.events.since(0)) == events_before


async def put_out_of_service(fleet: Fleet, name: str, how: str) -> None:
    """An enrolled, never-inspected node taken out of service."""
    if how == "drained":
        await fleet.drain(name, "bad PSU")
        await reconcile(fleet)
        return

    def write(tx: Tx) -> None:
        node = load_node(tx, name)
        node.state = NodeState(how)
        tx.nodes.save(node)

    await fleet.store.tx(write)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("nope", "unknown queue 'nope'; the configured queues are batch, research"),
        ("", "unknown queue 'default'"),  # no queue named: the default one, not configured
    ],
    ids=["unknown", "default-not-configured"],
)
async def test_an_unknown_queue_is_refused_and_stores_nothing(
    fleet: tuple[Fleet, Racks], queue: str, message: str
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await f.enroll(spec("new"))  # uninspected: used to keep any request waiting
    before = len(await f.events.since(0))
    with pytest.raises(InvalidArgument, match=message):
        await f.create_allocation("q", AllocationSpec(nodes=1, queue=queue))
    await nothing_stored(f, before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("ask", "least"),
    [
        (AllocationSpec(nodes=4, queue="research"), 16),
        (AllocationSpec(nodes=2, spares_per_domain=2, queue="research"), 16),
        (AllocationSpec(racks=1, queue="research"), 16),
    ],
    ids=["nodes", "nodes-and-spares", "rack"],
)
async def test_more_than_quota_plus_borrowing_is_refused_and_stores_nothing(
    fleet: tuple[Fleet, Racks], ask: AllocationSpec, least: int
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    before = len(await f.events.since(0))
    with pytest.raises(
        FailedPrecondition,
        match=rf"needs at least {least} GPUs, more than queue 'research' may ever hold "
        r"\(quota 8 \+ borrowing limit 4\)",
    ):
        await f.create_allocation("big", ask)
    await nothing_stored(f, before)
    # Within quota plus borrowing it is admitted; an unlimited queue has no bound.
    fits = await f.create_allocation("fits", AllocationSpec(nodes=2, queue="research"))
    assert fits.state == AllocationState.READY
    await f.release(fits.id)
    await reconcile(f)
    whole = await f.create_allocation("whole", AllocationSpec(racks=1, queue="batch"))
    assert whole.state == AllocationState.READY


@pytest.mark.timeout(60)
async def test_a_node_awaiting_inspection_does_not_excuse_a_request_over_quota(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await f.enroll(spec("new"))  # in service, GPUs unknown: counts as at least one GPU
    await reconcile(f)
    # Any 4 of the 5 nodes hold at least 4 + 4 + 4 + 1 GPUs, over 8 + 4.
    with pytest.raises(FailedPrecondition, match="needs at least 13 GPUs"):
        await f.create_allocation("big", AllocationSpec(nodes=4, queue="research"))
    await nothing_stored(f, len(await f.events.since(0)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["drained", "powered_off", "quarantined", "maintenance"])
async def test_an_out_of_service_uninspected_node_keeps_no_hope_alive(
    fleet: tuple[Fleet, Racks], how: str
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await f.enroll(spec("new", "r2"))
    await put_out_of_service(f, "new", how)
    assert (await f.get_node("new")).gpu_count == 0
    before = len(await f.events.since(0))
    with pytest.raises(FailedPrecondition, match="can never fit"):
        await f.create_allocation("five", AllocationSpec(nodes=5, queue="batch"))
    with pytest.raises(FailedPrecondition, match="can never fit"):
        await f.create_allocation("two-racks", AllocationSpec(racks=2, queue="batch"))
    await nothing_stored(f, before)


@pytest.mark.timeout(60)
async def test_a_waiting_request_fails_once_its_only_hope_is_drained(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(TRAYS, rack="r1")
    await f.enroll(spec("new", "r2"))
    await reconcile(f)
    waiting = await f.create_allocation("five", AllocationSpec(nodes=5, queue="batch"))
    assert waiting.state == AllocationState.PENDING
    assert "(yet: 1 node(s) still being inspected)" in waiting.reason
    await f.drain("new", "bad PSU")
    await f.allocations.schedule_pass()
    failed = await f.get_allocation(waiting.id)
    assert failed.state == AllocationState.FAILED and "still being inspected" not in failed.reason


@pytest.mark.timeout(60)
async def test_a_stored_request_whose_queue_is_gone_fails_despite_uninspected_nodes(
    make_fleet: Callable[..., Fleet],
) -> None:
    # Queued under one configuration; the controller restarts with another.
    before = make_fleet()
    await before.enroll(spec("new"))
    queued = await before.create_allocation("old", AllocationSpec(nodes=1, queue="gone"))
    assert queued.state == AllocationState.PENDING
    await before.stop()
    after = make_fleet(queues=QUEUES)
    await after.allocations.schedule_pass()
    failed = await after.get_allocation(queued.id)
    assert failed.state == AllocationState.FAILED and "unknown queue 'gone'" in failed.reason
    await after.stop()


def tray(name: str, gpus: int, domain: str = "") -> NodeRecord:
    return NodeRecord(
        name=name,
        bmc_url=f"fake://{name}",
        gpu_count=gpus,
        gpu_model="GB200" if gpus else "",
        nvlink_domain=domain,
        state=NodeState.READY if gpus else NodeState.INSPECTING,
    )


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("ask", "nodes", "least"),
    [
        (AllocationSpec(nodes=2), [tray("a", 8), tray("b", 4), tray("c", 4)], 8),
        (AllocationSpec(nodes=2), [tray("a", 8), tray("b", 4), tray("new", 0)], 5),
        (AllocationSpec(nodes=3), [tray("a", 8), tray("b", 4)], None),
        (AllocationSpec(nodes=1, gpu_model="H200"), [tray("a", 8)], None),
        (AllocationSpec(nodes=1, spares_per_domain=1), [tray("a", 8), tray("b", 4)], 12),
        (
            AllocationSpec(racks=1),
            [tray("a", 4, "r1"), tray("b", 4, "r1"), tray("c", 8, "solo")],
            8,
        ),
        (AllocationSpec(racks=1), [tray("c", 8, "solo")], None),
    ],
    ids=[
        "two-smallest",
        "uninspected-as-one",
        "too-few",
        "no-such-model",
        "spare-counts",
        "rack-domain",
        "single-node-is-no-rack",
    ],
)
def test_fewest_gpus_is_a_lower_bound_of_any_admission(
    ask: AllocationSpec, nodes: list[NodeRecord], least: int | None
) -> None:
    assert fewest_gpus(ask, nodes) == least
