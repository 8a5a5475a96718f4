"""Inputs found to break the API answer a clear refusal, never INTERNAL."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from kiln.v1 import fleet_pb2, fleet_pb2_grpc

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stub(controller_addr: str) -> Iterator[fleet_pb2_grpc.FleetServiceStub]:
    with grpc.insecure_channel(controller_addr) as channel:
        yield fleet_pb2_grpc.FleetServiceStub(channel)


def test_an_unknown_node_state_filter_is_invalid_not_internal(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        stub.ListNodes(fleet_pb2.ListNodesRequest(state=99), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown node state 99" in e.value.details()


def test_watching_events_after_the_largest_sequence_number_is_empty(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    request = fleet_pb2.WatchEventsRequest(after_seq=2**64 - 1, follow=False)
    assert list(stub.WatchEvents(request, timeout=10)) == []


def test_an_error_never_echoes_unbounded_input(stub: fleet_pb2_grpc.FleetServiceStub) -> None:
    request = fleet_pb2.EnrollNodeRequest(
        name="n" * 10_000,
        bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
        username="admin",
        password="pw",
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.EnrollNode(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node name" in e.value.details() and len(e.value.details()) <= 1024
    assert list(stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=10).nodes) == []
