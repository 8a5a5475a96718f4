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
