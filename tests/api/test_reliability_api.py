"""Refusals at the gRPC surface for faults that used to be accepted quietly:
the status code and the message an operator sees."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from kiln.v1 import fleet_pb2, fleet_pb2_grpc


@pytest.fixture
def stub(controller_addr: str) -> Iterator[fleet_pb2_grpc.FleetServiceStub]:
    with grpc.insecure_channel(controller_addr) as channel:
        yield fleet_pb2_grpc.FleetServiceStub(channel)


def enroll(stub: fleet_pb2_grpc.FleetServiceStub, name: str, url: str) -> fleet_pb2.Node:
    return stub.EnrollNode(
        fleet_pb2.EnrollNodeRequest(name=name, bmc_url=url, username="admin", password="pw"),
        timeout=30,
    )


@pytest.mark.timeout(60)
def test_a_second_node_on_one_bmc_is_already_exists_naming_the_first(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    enroll(stub, "n1", "redfish+http://127.0.0.1/redfish/v1/Systems/abc")
    # The same BMC spelled another way: the default port and a trailing slash.
    with pytest.raises(grpc.RpcError) as err:
        enroll(stub, "n2", "redfish+http://127.0.0.1:80/redfish/v1/Systems/abc/")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS  # type: ignore[attr-defined]
    details = err.value.details()  # type: ignore[attr-defined]
    assert "'n1'" in details and "redfish+http://127.0.0.1:80/redfish/v1/Systems/abc" in details
    assert [n.name for n in stub.ListNodes(fleet_pb2.ListNodesRequest()).nodes] == ["n1"]
    # Another system behind the same Redfish service is another machine.
    enroll(stub, "n3", "redfish+http://127.0.0.1/redfish/v1/Systems/def")
    names = sorted(n.name for n in stub.ListNodes(fleet_pb2.ListNodesRequest()).nodes)
    assert names == ["n1", "n3"]


@pytest.fixture
def queued_stub(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[fleet_pb2_grpc.FleetServiceStub]:
    """A controller with queues configured, on a fleet of nodes not yet inspected."""
    from peers import ControllerThread

    from controller.placement import QueueConfig
    from controller.server import ControllerConfig

    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path_factory.mktemp("controller"),
            reconcile_interval=0.2,
            queues=(QueueConfig("research", gpu_quota=2, borrowing_limit=1),),
        )
    )
    address = controller.start()
    try:
        with grpc.insecure_channel(address) as channel:
            yield fleet_pb2_grpc.FleetServiceStub(channel)
    finally:
        controller.stop()


def create(
    stub: fleet_pb2_grpc.FleetServiceStub, key: str, spec: fleet_pb2.AllocationSpec
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateAllocation(fleet_pb2.CreateAllocationRequest(key=key, spec=spec), timeout=30)
    return err.value


@pytest.mark.timeout(60)
def test_requests_no_queue_could_admit_are_refused_with_the_reason(
    queued_stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    stub = queued_stub
    # Nodes whose GPUs are still unknown used to keep every request waiting.
    for i in range(1, 5):
        enroll(stub, f"new-{i}", f"redfish+http://127.0.0.1:9/redfish/v1/Systems/new-{i}")
    unknown = create(stub, "q", fleet_pb2.AllocationSpec(nodes=1, queue="nope"))
    assert unknown.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "unknown queue 'nope'" in unknown.details()  # type: ignore[attr-defined]
    assert "research" in unknown.details()  # type: ignore[attr-defined]
    # 4 nodes of at least one GPU each are more than quota 2 + borrowing 1.
    too_big = create(stub, "big", fleet_pb2.AllocationSpec(nodes=4, queue="research"))
    assert too_big.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    details = too_big.details()  # type: ignore[attr-defined]
    assert "queue 'research'" in details and "quota 2 + borrowing limit 1" in details
    everything = stub.ListAllocations(fleet_pb2.ListAllocationsRequest(include_released=True))
    assert list(everything.allocations) == []
    # What they could hold once inspected still waits.
    ok = stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="ok", spec=fleet_pb2.AllocationSpec(nodes=2, queue="research")
        ),
        timeout=30,
    )
    assert ok.state == fleet_pb2.ALLOCATION_STATE_PENDING
