"""controller/api/limits.py: field sizes, and per-client streams and request rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from peers import ControllerThread

from controller.api import limits
from controller.api.limits import FieldTooLarge, StreamSlots, TokenBuckets, check, client_of
from controller.options import OptionError, parse
from controller.server import ControllerConfig
from kiln.v1 import agent_pb2, fleet_pb2, fleet_pb2_grpc, types_pb2

pytestmark = pytest.mark.timeout(60)


def request_types() -> list[Descriptor]:
    """Every message a client can send, and every message inside one."""
    seen: dict[str, Descriptor] = {}

    def visit(kind: Descriptor) -> None:
        if kind.full_name in seen:
            return
        seen[kind.full_name] = kind
        for field in kind.fields:
            if field.message_type is not None:
                visit(field.message_type)

    for service in (limits.FLEET_SERVICE, limits.AGENT_SERVICE):
        for method in service.methods:
            visit(method.input_type)
    return list(seen.values())


# -- the table --------------------------------------------------------------------------


def test_every_override_names_a_field_a_client_sends() -> None:
    fields = {f.full_name for kind in request_types() for f in kind.fields}
    named = {name.removesuffix("[]") for name in limits.OVERRIDES}
    assert named - fields == set(), "an override for a field no request has (a typo?)"


def test_every_string_and_repeated_field_has_a_limit_no_larger_than_a_message() -> None:
    for kind in request_types():
        for field in kind.fields:
            sized = field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)
            if field.is_repeated:
                assert 1 <= limits.limit_for(field) <= limits.MAX_RECEIVE_BYTES, field.full_name
            if sized:
                limit = limits.limit_for(field, item=field.is_repeated)
                assert 1 <= limit <= limits.MAX_RECEIVE_BYTES, field.full_name


@pytest.mark.parametrize(
    ("message", "error"),
    [
        pytest.param(
            fleet_pb2.EnrollNodeRequest(name="n" * 64),
            "EnrollNodeRequest.name: at most 63 characters, not 64",
            id="name",
        ),
        pytest.param(
            fleet_pb2.EnrollNodeRequest(spine="s" * 100),
            "EnrollNodeRequest.spine: at most 63 characters, not 100",
            id="spine",
        ),
        pytest.param(
            fleet_pb2.EnrollNodeRequest(spine="s" * 100, rack="r" * 70, insecure=True),
            "EnrollNodeRequest.rack: at most 63 characters, not 70",
            id="first-by-field-number",
        ),
        pytest.param(
            agent_pb2.AgentMessage(
                health=types_pb2.NodeHealth(
                    sampled_at=1.0,
                    gpus=[
                        types_pb2.GpuHealth(index=i, temp_c=40.0, power_w=300.0, lost=False)
                        for i in range(7)
                    ]
                    + [types_pb2.GpuHealth(index=7, temp_c=40.0, xids=[79] * 257)],
                )
            ),
            "AgentMessage.health.gpus[7].xids: at most 256 items, not 257",
            id="repeated-number-among-readings",
        ),
        pytest.param(
            fleet_pb2.EnrollNodeRequest(bmc_url="u" * 2049),
            "EnrollNodeRequest.bmc_url: at most 2048 characters, not 2049",
            id="url",
        ),
        pytest.param(
            fleet_pb2.DrainNodeRequest(reason="r" * 1025),
            "DrainNodeRequest.reason: at most 1024 characters, not 1025",
            id="reason",
        ),
        pytest.param(
            fleet_pb2.PowerNodesRequest(names=["n"] * 4097),
            "PowerNodesRequest.names: at most 4096 items, not 4097",
            id="override-items",
        ),
        pytest.param(
            fleet_pb2.PowerNodesRequest(names=["ok", "n" * 64]),
            "PowerNodesRequest.names[1]: at most 63 characters, not 64",
            id="repeated-string-item",
        ),
        pytest.param(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(gpus=[types_pb2.Gpu(), types_pb2.Gpu(model="m" * 97)])
            ),
            "AgentMessage.register.gpus[1].model: at most 96 characters, not 97",
            id="nested",
        ),
        pytest.param(
            agent_pb2.AgentMessage(
                health=types_pb2.NodeHealth(
                    gpus=[types_pb2.GpuHealth(errors=["e" * 257])],
                )
            ),
            "AgentMessage.health.gpus[0].errors[0]: at most 256 characters, not 257",
            id="override-item-length",
        ),
    ],
)
def test_the_first_field_over_its_limit_is_named_never_its_value(
    message: object, error: str
) -> None:
    with pytest.raises(FieldTooLarge) as e:
        check(message)  # type: ignore[arg-type]
    assert str(e.value) == error


def test_messages_within_their_limits_pass() -> None:
    check(fleet_pb2.EnrollNodeRequest(name="n" * 63, bmc_url="u" * 2048))
    check(agent_pb2.AgentMessage(register=agent_pb2.Register(gpus=[types_pb2.Gpu()] * 64)))
    check(fleet_pb2.ListRacksRequest())


# -- the pieces of the per-client limits ------------------------------------------------


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("ipv4:10.0.0.5:41234", "10.0.0.5"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:%5B2001:db8::7%5D:443", "2001:db8::7"),
        ("unix:/run/kiln.sock", "unix:/run/kiln.sock"),
        ("", ""),
    ],
)
def test_a_client_is_its_ip_address_whatever_its_port(peer: str, client: str) -> None:
    assert client_of(peer) == client


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=2.0, burst=4.0, clock=clock)
    assert [buckets.take("a") for _ in range(5)] == [True, True, True, True, False]
    assert buckets.take("b"), "one client's bucket is its own"
    clock.now += 0.5  # one token back
    assert [buckets.take("a") for _ in range(2)] == [True, False]
    clock.now += 60  # refilled to the burst, not beyond
    assert sum(buckets.take("a") for _ in range(10)) == 4


def test_idle_clients_are_forgotten_when_many_are_tracked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_CLIENTS_TRACKED", 3)
    clock = Clock()
    buckets = TokenBuckets(rate=1.0, burst=2.0, clock=clock)
    for client in ("a", "b", "c"):
        buckets.take(client)
    clock.now += 10
    buckets.take("d")
    assert len(buckets) == 1


def test_stream_slots_are_per_client_and_come_back() -> None:
    slots = StreamSlots(2)
    assert [slots.acquire("a") for _ in range(3)] == [True, True, False]
    assert slots.acquire("b")
    slots.release("a")
    assert slots.acquire("a") and slots.held("a") == 2
    slots.release("a")
    slots.release("a")
    assert slots.held("a") == 0


# -- on a real controller ----------------------------------------------------------------


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[str]:
    """A controller allowing each client 2 streams and 5 requests a second (burst 10)."""
    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            max_streams_per_client=2,
            max_requests_per_second_per_client=5.0,
        )
    )
    address = controller.start()
    try:
        yield address
    finally:
        controller.stop()


def test_a_client_over_its_rate_is_told_to_slow_down_and_health_still_answers(
    strict: str,
) -> None:
    with grpc.insecure_channel(strict) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        codes = []
        for _ in range(15):
            try:
                stub.ListRacks(fleet_pb2.ListRacksRequest(), timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
                details = e.details()
        assert codes.count(grpc.StatusCode.OK) in range(10, 13)
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert details == (
            "client 127.0.0.1 sends more than 5 requests a second; slow down and retry"
        )
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(20):  # not Kiln's API: never limited
            health.Check(health_pb2.HealthCheckRequest(), timeout=10)


def test_a_client_may_hold_only_its_share_of_streams(strict: str) -> None:
    with grpc.insecure_channel(strict) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        follow = fleet_pb2.WatchEventsRequest(follow=True)
        watches = [stub.WatchEvents(follow, timeout=30) for _ in range(2)]

        def drain(call: grpc.Future) -> None:
            try:
                for _ in call:  # type: ignore[attr-defined]
                    pass
            except grpc.RpcError:
                pass

        readers = [threading.Thread(target=drain, args=(w,)) for w in watches]
        for reader in readers:
            reader.start()
        # Both watches are open once the server answers another call after them.
        stub.ListRacks(fleet_pb2.ListRacksRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.WatchEvents(follow, timeout=10))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details() == (
            "client 127.0.0.1 already has 2 streams open, the most one client may; "
            "close one and retry"
        )
        watches[0].cancel()
        readers[0].join(timeout=10)
        # The cancelled watch's slot comes back once the server has seen it end.
        deadline = time.monotonic() + 10
        while True:
            try:
                list(stub.WatchEvents(fleet_pb2.WatchEventsRequest(follow=False), timeout=10))
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() < deadline, "the slot never came back"
                time.sleep(0.1)
        watches[1].cancel()
        readers[1].join(timeout=10)


# -- options ---------------------------------------------------------------------------------


def test_the_limits_are_options_with_generous_defaults(tmp_path: Path) -> None:
    config = parse(["--state-dir", str(tmp_path)]).config
    assert config.max_streams_per_client == 128
    assert config.max_requests_per_second_per_client == 200.0
    config = parse(
        [
            "--state-dir",
            str(tmp_path),
            "--max-streams-per-client",
            "4",
            "--max-requests-per-second-per-client",
            "2.5",
        ]
    ).config
    assert (config.max_streams_per_client, config.max_requests_per_second_per_client) == (4, 2.5)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--max-streams-per-client", "0"], "--max-streams-per-client: must be at least 1"),
        (["--max-requests-per-second-per-client", "0"], "must be more than 0, not 0"),
        (["--max-requests-per-second-per-client", "inf"], "must be more than 0, not inf"),
    ],
)
def test_unusable_limits_are_refused(tmp_path: Path, args: list[str], problem: str) -> None:
    with pytest.raises(OptionError, match=problem):
        parse(["--state-dir", str(tmp_path), *args])
