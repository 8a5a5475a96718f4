"""Inputs found to break the API answer a clear refusal, never INTERNAL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import pytest
from peers import ControllerThread

from agent.client import Agent
from agent.nvml import FakeNvml, part_by_key
from controller.server import ControllerConfig
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc, types_pb2

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
    details = e.value.details()
    assert details == "EnrollNodeRequest.name: at most 63 characters, not 10000"
    assert list(stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=10).nodes) == []


# -- found when the API was fuzzed (issue 12, item 6) --------------------------------

BMC = "redfish+http://127.0.0.1:9/redfish/v1/Systems/"  # port 9: nothing answers


def enrol(stub: fleet_pb2_grpc.FleetServiceStub, name: str = "n1", **labels: str) -> None:
    request = fleet_pb2.EnrollNodeRequest(
        name=name, bmc_url=BMC + name, username="admin", password="pw", **labels
    )
    stub.EnrollNode(request, timeout=10)


def register(channel: grpc.Channel, gpus: list[types_pb2.Gpu], *later: agent_pb2.AgentMessage):
    """Open an agent stream that registers n1 with ``gpus``; the call's answers."""
    first = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="n1", gpus=gpus))
    return agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([first, *later]), timeout=10)


def refusal(call: Iterable[object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    return e.value


def gpu(index: int, **fields: object) -> types_pb2.Gpu:
    return types_pb2.Gpu(index=index, uuid=f"GPU-{index}", model="NVIDIA H200", **fields)


@pytest.fixture
def channel(controller_addr: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(controller_addr) as channel:
        yield channel


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        pytest.param([gpu(0), gpu(0)], "GPU index 0 is registered twice", id="same-index-twice"),
        pytest.param(
            [gpu(0, memory_mib=2**63)],
            "GPU 0: memory_mib 9223372036854775808 is out of range",
            id="memory-past-int64",
        ),
        pytest.param([gpu(99)], "GPU index 99 is out of range", id="index-past-64"),
        pytest.param(
            [types_pb2.Gpu(index=0, model="NVIDIA \x1b]0;owned\x07")],
            "has control characters",
            id="escape-in-model",
        ),
        pytest.param(
            [gpu(0, clique="\u202eevil")], "GPU 0 NVLink clique name", id="bidi-in-clique"
        ),
    ],
)
def test_a_malformed_gpu_inventory_is_refused_and_nothing_is_stored(
    stub: fleet_pb2_grpc.FleetServiceStub,
    channel: grpc.Channel,
    gpus: list[types_pb2.Gpu],
    message: str,
) -> None:
    enrol(stub)
    error = refusal(register(channel, gpus))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()
    assert "SQL" not in error.details() and "INSERT" not in error.details()
    node = stub.GetNode(fleet_pb2.GetNodeRequest(name="n1"), timeout=10)
    assert list(node.gpus) == [] and node.gpu_count == 0 and not node.agent_connected


def test_an_agent_registering_100000_gpus_is_refused_at_once(
    stub: fleet_pb2_grpc.FleetServiceStub, channel: grpc.Channel
) -> None:
    enrol(stub)
    started = time.monotonic()
    error = refusal(register(channel, [types_pb2.Gpu(index=i) for i in range(100_000)]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "AgentMessage.register.gpus: at most 64 items, not 100000"
    started = time.monotonic()
    assert stub.GetNode(fleet_pb2.GetNodeRequest(name="n1"), timeout=10).gpu_count == 0
    assert time.monotonic() - started < 2


def test_a_health_report_over_its_limits_ends_the_stream_invalid(
    stub: fleet_pb2_grpc.FleetServiceStub, channel: grpc.Channel
) -> None:
    enrol(stub)
    health = types_pb2.NodeHealth(gpus=[types_pb2.GpuHealth(index=i) for i in range(65)])
    error = refusal(register(channel, [gpu(0)], agent_pb2.AgentMessage(health=health)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "AgentMessage.health.gpus: at most 64 items, not 65"


def test_a_huge_drain_reason_is_refused_and_listing_nodes_keeps_working(
    stub: fleet_pb2_grpc.FleetServiceStub,
) -> None:
    enrol(stub, "n1")
    enrol(stub, "n2", rack="r1")
    with pytest.raises(grpc.RpcError) as e:
        stub.DrainNode(fleet_pb2.DrainNodeRequest(name="n1", reason="x" * 2000), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "DrainNodeRequest.reason: at most 1024 characters, not 2000"
    for name in ("n1", "n2"):  # 3 MB: over the whole-message cap, refused by gRPC itself
        with pytest.raises(grpc.RpcError) as e:
            stub.DrainNode(fleet_pb2.DrainNodeRequest(name=name, reason="x" * 3_000_000))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "x" * 100 not in e.value.details()
    listed = stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=10)
    assert [n.name for n in listed.nodes] == ["n1", "n2"]
    assert not any(n.state == types_pb2.NODE_STATE_DRAINING for n in listed.nodes)
    assert listed.ByteSize() < 10_000
    stub.DrainNode(fleet_pb2.DrainNodeRequest(name="n1", reason="r" * 1024), timeout=10)


@pytest.mark.parametrize(
    "method", ["/kiln.v1.FleetService/GetNode", "/kiln.v1.FleetService/EnrollNode"]
)
def test_bytes_that_are_not_a_request_are_invalid_not_unknown(
    channel: grpc.Channel, method: str
) -> None:
    call = channel.unary_unary(method)  # no serializers: raw bytes on the wire
    with pytest.raises(grpc.RpcError) as e:
        call(b"\xff\xff\xff\xff", timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("the request is not a valid kiln.v1.")


def test_bytes_that_are_not_an_agent_message_end_the_stream_invalid(
    channel: grpc.Channel,
) -> None:
    call = channel.stream_stream("/kiln.v1.AgentService/Connect")
    error = refusal(call(iter([b"\x0a\xff\xff"]), timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "the request is not a valid kiln.v1.AgentMessage message"


@pytest.mark.parametrize(
    ("label", "value", "shown"),
    [
        pytest.param("leaf", "leaf\x1b]0;pwned\x07", "'leaf\\x1b]0;pwned\\x07'", id="osc-leaf"),
        pytest.param("spine", "spine-\u202e1", "'spine-\\u202e1'", id="bidi-spine"),
        pytest.param("spine", "spine 1", "'spine 1'", id="space-in-spine"),
        pytest.param("rack", "r/1", "'r/1'", id="slash-in-rack"),
    ],
)
def test_leaves_and_spines_follow_the_rules_of_node_names(
    stub: fleet_pb2_grpc.FleetServiceStub, label: str, value: str, shown: str
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        enrol(stub, **{label: value})
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(f"{label} name {shown} is invalid")
    assert "\x1b" not in e.value.details() and "\u202e" not in e.value.details()
    assert list(stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=10).nodes) == []


def test_a_fault_no_gpu_could_show_is_refused_through_a_simulated_agent(
    tmp_path: Path,
) -> None:
    controller = ControllerThread(
        ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path, simulation=True)
    )
    address = controller.start()
    agent = Agent(address, "n1", FakeNvml(part_by_key("h200"), node_name="n1"), backend="fake")
    running = None
    try:
        with grpc.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            enrol(stub)
            running = asyncio.run_coroutine_threadsafe(agent.run(), controller.loop)
            deadline = time.monotonic() + 30
            while not stub.GetNode(fleet_pb2.GetNodeRequest(name="n1"), timeout=10).agent_connected:
                assert time.monotonic() < deadline, "the agent never registered"
                time.sleep(0.05)

            def inject(fault: str) -> fleet_pb2.InjectFaultResponse:
                request = fleet_pb2.InjectFaultRequest(node="n1", fault_json=fault)
                return stub.InjectFault(request, timeout=30)

            with pytest.raises(grpc.RpcError) as e:
                inject('{"kind": "heat", "gpu": 0, "target_c": NaN}')
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == "fault JSON holds NaN, which is not a number"
            refused = inject('{"kind": "heat", "gpu": 0, "target_c": 1e308}')
            assert not refused.ok
            assert refused.message == (
                "bad fault: fault 'heat': target_c must be a finite number "
                "from -2147483648 to 2147483647"
            )
            assert inject('{"kind": "heat", "gpu": 0, "target_c": 95}').ok
    finally:
        if running is not None:
            controller.call(agent.stop())
            running.result(timeout=30)
        controller.stop()
