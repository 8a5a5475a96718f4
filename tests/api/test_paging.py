"""ListNodes and ListAllocations page and filter on the controller.

One controller for the module (its lifecycle idle: see
``paging_fleet.paging_controller``), 1,200 nodes enrolled through the API (BMCs
on a loopback port where nothing listens). Pages are keyset pages by name: a
client paging while others enrol sees every node that existed when it began
exactly once, and no node twice.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from paging_fleet import (
    DeadBmcs,
    add_parked_nodes,
    code_of,
    enrol,
    every_name,
    in_store,
    paging_controller,
)
from peers import ControllerThread

from controller.core.ports import Tx
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

pytestmark = pytest.mark.timeout(300)

INITIAL = 1200
RACKS = 12
NAMES = [f"n{i:05d}-a" for i in range(INITIAL)]


def rack_of(name: str) -> str:
    if not name.endswith("-a"):
        return "late"
    return f"r{int(name[1:6]) % RACKS:02d}"


@dataclass
class Fleet:
    controller: ControllerThread
    stub: fleet_pb2_grpc.FleetServiceStub
    bmcs: DeadBmcs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with (
        paging_controller(tmp_path_factory.mktemp("paging")) as controller,
        grpc.insecure_channel(controller.address) as channel,
    ):
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        bmcs = DeadBmcs()
        started = time.monotonic()
        enrol(stub, bmcs, NAMES, rack_of)
        print(f"enrolled {INITIAL} nodes through the API in {time.monotonic() - started:.1f}s")
        yield Fleet(controller, stub, bmcs)


def refused(call: object) -> str:
    """The details of a call refused INVALID_ARGUMENT."""
    assert callable(call)
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert code_of(err.value) == grpc.StatusCode.INVALID_ARGUMENT, err.value
    details: str = err.value.details()  # type: ignore[attr-defined]
    return details


# -- every node once, while others enrol ------------------------------------------------


def test_paging_lists_every_node_once_while_more_are_enrolled(fleet: Fleet) -> None:
    before = set(every_name(fleet.stub, fleet_pb2.ListNodesRequest(page_size=1000)))
    assert set(NAMES) <= before
    # New names land all over the listing: behind the cursor, ahead of it,
    # before the first name and after the last.
    late = [f"n{(k * 4) % INITIAL:05d}-b" for k in range(296)]
    late += ["a-late-0", "a-late-1", "z-late-0", "z-late-1"]
    random.Random(7).shuffle(late)
    enrolled: list[str] = []
    first = threading.Event()
    failure: list[BaseException] = []

    def enrol_late() -> None:
        def done(name: str) -> None:
            enrolled.append(name)
            first.set()

        try:
            enrol(fleet.stub, fleet.bmcs, late, rack_of, in_flight=4, done=done)
        except BaseException as e:  # reported by the test
            failure.append(e)
            first.set()

    thread = threading.Thread(target=enrol_late, daemon=True)
    thread.start()
    assert first.wait(60)
    at_start = len(enrolled)
    seen: list[str] = []
    pages = 0
    request = fleet_pb2.ListNodesRequest(page_size=100)
    while True:
        response = fleet.stub.ListNodes(request, timeout=60)
        pages += 1
        assert len(response.nodes) <= 100
        seen += [n.name for n in response.nodes]
        if not response.next_page_token:
            break
        request.page_token = response.next_page_token
        time.sleep(0.05)  # a client that works on each page before the next
    during = len(enrolled) - at_start
    thread.join(120)
    assert not failure, failure
    assert not thread.is_alive()

    assert during > 0, "no enrolment finished while the pages were read"
    assert len(seen) == len(set(seen)), "a node was listed twice"
    assert before <= set(seen), f"missed: {sorted(before - set(seen))[:5]}"
    assert set(seen) <= before | set(late)
    assert seen == sorted(seen)
    assert pages >= len(before) // 100
    print(f"{pages} pages of 100 while {during} nodes were enrolled")
    everything = every_name(fleet.stub, fleet_pb2.ListNodesRequest(page_size=100))
    assert set(everything) == before | set(late)


# -- page sizes ---------------------------------------------------------------------------


def test_no_page_size_is_a_page_of_500(fleet: Fleet) -> None:
    total = len(every_name(fleet.stub, fleet_pb2.ListNodesRequest(page_size=5000)))
    first = fleet.stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=60)
    assert len(first.nodes) == 500
    assert first.next_page_token
    names = [n.name for n in first.nodes]
    request = fleet_pb2.ListNodesRequest(page_token=first.next_page_token)
    while request.page_token:
        response = fleet.stub.ListNodes(request, timeout=60)
        assert len(response.nodes) == 500 or not response.next_page_token
        names += [n.name for n in response.nodes]
        request.page_token = response.next_page_token
    assert len(names) == total == len(set(names))
    assert names == sorted(names)


def test_a_negative_page_size_is_refused(fleet: Fleet) -> None:
    details = refused(lambda: fleet.stub.ListNodes(fleet_pb2.ListNodesRequest(page_size=-1)))
    assert "page_size" in details
    details = refused(
        lambda: fleet.stub.ListAllocations(fleet_pb2.ListAllocationsRequest(page_size=-5))
    )
    assert "page_size" in details


# -- filters, on the controller ---------------------------------------------------------------


def test_filters_by_rack_state_gpu_model_and_allocation(fleet: Fleet) -> None:
    stub = fleet.stub
    r03 = every_name(stub, fleet_pb2.ListNodesRequest(rack="r03", page_size=7))
    assert r03 == [n for n in NAMES if rack_of(n) == "r03"]

    drained = NAMES[5::100]  # 12 nodes, racks r05, r01, r09, ...
    for name in drained:
        stub.DrainNode(fleet_pb2.DrainNodeRequest(name=name, reason="paging test"), timeout=60)
    draining = fleet_pb2.ListNodesRequest(state=types_pb2.NODE_STATE_DRAINING, page_size=5)
    assert every_name(stub, draining) == drained
    response = stub.ListNodes(draining, timeout=60)
    assert all(n.state == types_pb2.NODE_STATE_DRAINING for n in response.nodes)
    enrolled = every_name(stub, fleet_pb2.ListNodesRequest(state=types_pb2.NODE_STATE_ENROLLED))
    assert set(enrolled).isdisjoint(drained) and set(NAMES) - set(drained) <= set(enrolled)

    # Only an agent sets a node's GPU model and only the scheduler books a
    # node, so the store is told directly.
    h200, held = drained[:6], drained[::4]

    def kit(tx: Tx) -> None:
        for name in drained:
            node = tx.nodes.get(name)
            assert node is not None
            node.gpu_model = "H200" if name in h200 else "GB200"
            node.gpu_count = 8
            node.allocation_id = "alloc-paging" if name in held else ""
            tx.nodes.save(node)

    in_store(fleet.controller, kit)
    assert every_name(stub, fleet_pb2.ListNodesRequest(gpu_model="H200", page_size=2)) == h200
    assert every_name(stub, fleet_pb2.ListNodesRequest(gpu_model="h200")) == h200
    gb200 = every_name(stub, fleet_pb2.ListNodesRequest(gpu_model="GB200", page_size=4))
    assert gb200 == [n for n in drained if n not in h200]
    by_alloc = fleet_pb2.ListNodesRequest(allocation="alloc-paging", page_size=1)
    assert every_name(stub, by_alloc) == held
    assert all(n.allocation == "alloc-paging" for n in stub.ListNodes(by_alloc).nodes)
    both = fleet_pb2.ListNodesRequest(
        rack=rack_of(drained[0]),
        state=types_pb2.NODE_STATE_DRAINING,
        gpu_model="H200",
        allocation="alloc-paging",
    )
    assert every_name(stub, both) == [drained[0]]
    assert every_name(stub, fleet_pb2.ListNodesRequest(gpu_model="B300")) == []
    assert every_name(stub, fleet_pb2.ListNodesRequest(allocation="alloc-none")) == []


def test_an_unknown_state_is_refused(fleet: Fleet) -> None:
    details = refused(lambda: fleet.stub.ListNodes(fleet_pb2.ListNodesRequest(state=99)))
    assert "unknown node state 99" in details
    details = refused(
        lambda: fleet.stub.ListAllocations(fleet_pb2.ListAllocationsRequest(state=99))
    )
    assert "unknown allocation state 99" in details
    releasing = fleet_pb2.ListAllocationsRequest(state=fleet_pb2.ALLOCATION_STATE_RELEASING)
    assert "releasing" in refused(lambda: fleet.stub.ListAllocations(releasing))


# -- page tokens ------------------------------------------------------------------------------


def _forged(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "garbled!",
        "bm90LWpzb24",  # base64 of "not-json"
        _forged({"v": 1, "k": "nodes", "a": [7], "f": "0"}),
        _forged(["a", "list"]),
        "A" * 1000,
    ],
    ids=["not-base64", "not-json", "forged", "not-an-object", "long"],
)
def test_a_garbled_token_is_invalid_argument(fleet: Fleet, token: str) -> None:
    request = fleet_pb2.ListNodesRequest(page_token=token)
    assert "page_token" in refused(lambda: fleet.stub.ListNodes(request))
    alloc_request = fleet_pb2.ListAllocationsRequest(page_token=token)
    assert "page_token" in refused(lambda: fleet.stub.ListAllocations(alloc_request))


def test_a_token_past_the_field_limit_is_refused_before_decoding(fleet: Fleet) -> None:
    request = fleet_pb2.ListNodesRequest(page_token="A" * 5000)
    assert "ListNodesRequest.page_token" in refused(lambda: fleet.stub.ListNodes(request))


def test_a_token_reused_with_other_filters_is_invalid_argument(fleet: Fleet) -> None:
    stub = fleet.stub
    first = stub.ListNodes(fleet_pb2.ListNodesRequest(rack="r01", page_size=10), timeout=60)
    assert first.next_page_token
    for other in (
        fleet_pb2.ListNodesRequest(rack="r02"),
        fleet_pb2.ListNodesRequest(),
        fleet_pb2.ListNodesRequest(rack="r01", state=types_pb2.NODE_STATE_READY),
        fleet_pb2.ListNodesRequest(rack="r01", gpu_model="H200"),
        fleet_pb2.ListNodesRequest(rack="r01", allocation="alloc-x"),
    ):
        other.page_token = first.next_page_token
        assert "other filters" in refused(lambda: stub.ListNodes(other))  # noqa: B023
    # With the same filters, a new page size is fine.
    same = fleet_pb2.ListNodesRequest(rack="r01", page_size=3, page_token=first.next_page_token)
    second = stub.ListNodes(same, timeout=60)
    assert [n.name for n in second.nodes] == [n for n in NAMES if rack_of(n) == "r01"][10:13]
    # A node token is no allocation token.
    wrong_list = fleet_pb2.ListAllocationsRequest(page_token=first.next_page_token)
    assert "not allocations" in refused(lambda: stub.ListAllocations(wrong_list))


# -- allocations ------------------------------------------------------------------------------


def _alloc_ids(stub: fleet_pb2_grpc.FleetServiceStub, request: object) -> list[str]:
    assert isinstance(request, fleet_pb2.ListAllocationsRequest)
    paged = fleet_pb2.ListAllocationsRequest()
    paged.CopyFrom(request)
    ids: list[str] = []
    while True:
        response = stub.ListAllocations(paged, timeout=60)
        ids += [a.id for a in response.allocations]
        if not response.next_page_token:
            return ids
        paged.page_token = response.next_page_token


def test_allocations_page_in_queue_order_and_filter_by_state(fleet: Fleet) -> None:
    stub = fleet.stub
    assert _alloc_ids(stub, fleet_pb2.ListAllocationsRequest(include_released=True)) == []
    created = []
    for i in range(5):
        alloc = stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                key=f"paging-{i}", spec=fleet_pb2.AllocationSpec(nodes=1)
            ),
            timeout=60,
        )
        created.append(alloc.id)
    # No node is ready (no BMC answers), so all five wait in the queue.
    every = fleet_pb2.ListAllocationsRequest(include_released=True, page_size=2)
    assert _alloc_ids(stub, every) == created
    first = stub.ListAllocations(every, timeout=60)
    assert len(first.allocations) == 2 and first.next_page_token
    assert _alloc_ids(stub, fleet_pb2.ListAllocationsRequest()) == created
    released = stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=created[1]), timeout=60)
    assert released.state == fleet_pb2.ALLOCATION_STATE_RELEASED
    open_ = [a for a in created if a != created[1]]
    assert _alloc_ids(stub, fleet_pb2.ListAllocationsRequest(page_size=1)) == open_
    pending = fleet_pb2.ListAllocationsRequest(
        state=fleet_pb2.ALLOCATION_STATE_PENDING, page_size=3
    )
    assert _alloc_ids(stub, pending) == open_
    only_released = fleet_pb2.ListAllocationsRequest(state=fleet_pb2.ALLOCATION_STATE_RELEASED)
    assert _alloc_ids(stub, only_released) == [created[1]]
    # A token is for the filters it was issued with.
    flipped = fleet_pb2.ListAllocationsRequest(page_token=first.next_page_token)
    assert "other filters" in refused(lambda: stub.ListAllocations(flipped))
    nodes_call = fleet_pb2.ListNodesRequest(page_token=first.next_page_token)
    assert "not nodes" in refused(lambda: stub.ListNodes(nodes_call))
    for ident in open_:
        stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=ident), timeout=60)


# -- the largest page ---------------------------------------------------------------------------


def test_a_page_size_over_5000_is_clamped_to_5000(fleet: Fleet) -> None:
    # Last in the module: it parks enough nodes in the store for 5,000 and more.
    now = len(every_name(fleet.stub, fleet_pb2.ListNodesRequest(page_size=5000)))
    add_parked_nodes(fleet.controller, [f"zz-parked-{i:05d}" for i in range(5001 + 37 - now)])
    started = time.monotonic()
    first = fleet.stub.ListNodes(fleet_pb2.ListNodesRequest(page_size=2**31 - 1), timeout=120)
    took = time.monotonic() - started
    assert len(first.nodes) == 5000 and first.next_page_token
    rest = fleet.stub.ListNodes(
        fleet_pb2.ListNodesRequest(page_size=2**31 - 1, page_token=first.next_page_token),
        timeout=120,
    )
    assert len(rest.nodes) == 38 and not rest.next_page_token
    assert first.nodes[-1].name < rest.nodes[0].name
    print(f"a page of 5000 nodes in {took:.2f}s")


def test_a_report_goes_to_the_wire_once_and_reads_the_same() -> None:
    from controller.api import convert
    from controller.core.health import GpuHealth, HealthReport

    wire = convert.HealthWire()
    first = HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0, temp_c=41.0, xids=(79,)),))
    data = wire.serialized("n1", first, 7)
    # Kept by the report's version: an equal copy of it is not converted again.
    copy = HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0, temp_c=41.0, xids=(79,)),))
    assert wire.serialized("n1", copy, 7) is data
    expected = convert.health_pb(first)
    assert expected is not None and data == expected.SerializeToString()
    later = HealthReport(sampled_at=2.0, gpus=(GpuHealth(index=0, temp_c=55.0),))
    assert wire.serialized("n1", later, 8) != data  # a new report: converted afresh
    # Version 0 (a report not held in memory): converted each time, never kept.
    assert wire.serialized("n1", first, 0) == data
    assert wire.serialized("n1", first, 0) is not wire.serialized("n1", first, 0)
    assert wire.serialized("n1", copy, 8) != data  # version 8 is still ``later``'s
    wire.forget("n1")
    assert wire.serialized("n1", first, 9) == data
