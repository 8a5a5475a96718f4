"""Property-based fuzzing of the controller's gRPC surface (issue 12, item 6).

Every FleetService RPC — read from the service descriptor, so an RPC added to
the proto is fuzzed the day it is added — gets random and extreme requests:
strings of every kind in every field (empty, control and bidi characters,
just under and over their limits, far over), numbers at the ends of their
types, NaN and infinities, unknown enum values, nested messages, lists past
their limits; and bytes that are not a valid protobuf message at all, sent
through a generic channel with identity serializers. The AgentService stream
gets random first messages, and random health reports after a registration.

Every call must answer something other than INTERNAL or UNKNOWN within its
deadline (a server stream may stay open: a watch that follows), and the
controller must still answer a health check and ListNodes afterwards.

The controller runs on 127.0.0.1 with a BMC gateway that never touches the
network (a fuzzed BMC URL must not make it dial anything), and per-client
limits high enough that the fuzzer is never rate-limited.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peers import ControllerThread

from controller.core.errors import BmcUnreachable, InvalidArgument
from controller.core.model import BmcTarget, LeakReading
from controller.server import ControllerConfig
from kiln.v1 import agent_pb2, fleet_pb2, types_pb2

FLEET = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"]
AGENT = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
BROKEN = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
CALL_DEADLINE = 10.0  # a unary call answering later than this hangs
STREAM_DEADLINE = 0.5  # a server stream may stay open this long (a followed watch)
NODES = ("fz-n1", "fz-n2", "fz-n3")

FUZZ = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


# -- a controller that cannot reach out -------------------------------------------------


class LoopbackBmc:
    """BMCs at ``fake://NAME`` that power on and off at once; other schemes
    are refused, so no fuzzed URL makes the controller dial anything."""

    def __init__(self) -> None:
        self.power: dict[str, str] = {}

    def canonical_url(self, url: str) -> str:
        if not url.startswith("fake://") or len(url) > 200:
            raise InvalidArgument("this controller's BMCs are fake://NAME")
        return url

    def validate_target(self, url: str, username: str, password: str) -> str:
        return self.canonical_url(url)

    async def power_state(self, target: BmcTarget) -> str:
        return self.power.get(target.node, "off")

    async def set_power(self, target: BmcTarget, action: str) -> str:
        if target.url.endswith("/dead"):
            raise BmcUnreachable(host=target.url, reason="fuzzed BMC")
        self.power[target.node] = "off" if action in ("off", "force_off") else "on"
        return self.power[target.node]

    def health(self, node: str) -> str:
        return "ok"

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        return []  # no leak detectors on this BMC

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        return [40.0]

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        return {}

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        return None

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        return {}

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        return None

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        return {t.node: (self.power.get(t.node, "off"), "ok") for t in targets}

    def forget(self, node: str) -> None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """A channel to one controller for the module, with a few nodes enrolled."""
    state: Path = tmp_path_factory.mktemp("fuzz")
    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=state,
            reconcile_interval=0.2,
            max_streams_per_client=100_000,
            max_requests_per_second_per_client=1e6,
        ),
        bmc=LoopbackBmc(),
    )
    address = controller.start()
    try:
        with grpc.insecure_channel(address) as channel:
            enrol_nodes(channel)
            yield channel
    finally:
        controller.stop()


def enrol_nodes(channel: grpc.Channel) -> None:
    """The module's nodes (idempotent: enrolling one again changes nothing)."""
    enrol = channel.unary_unary(
        f"/{FLEET.full_name}/EnrollNode",
        request_serializer=fleet_pb2.EnrollNodeRequest.SerializeToString,
        response_deserializer=fleet_pb2.Node.FromString,
    )
    for i, name in enumerate(NODES):
        request = fleet_pb2.EnrollNodeRequest(
            name=name, bmc_url=f"fake://{name}", username="admin", password="pw"
        )
        request.rack = "fz-r1" if i < 2 else ""
        enrol(request, timeout=CALL_DEADLINE)


def assert_still_serving(channel: grpc.Channel) -> None:
    check = health_pb2_grpc.HealthStub(channel).Check
    reply = check(health_pb2.HealthCheckRequest(service=FLEET.full_name), timeout=CALL_DEADLINE)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    listed = channel.unary_unary(
        f"/{FLEET.full_name}/ListNodes",
        request_serializer=fleet_pb2.ListNodesRequest.SerializeToString,
        response_deserializer=fleet_pb2.ListNodesResponse.FromString,
    )(fleet_pb2.ListNodesRequest(), timeout=CALL_DEADLINE)
    assert set(NODES) <= {n.name for n in listed.nodes}


# -- strategies: any message, from its descriptor ---------------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=80)
EXTREME_TEXTS = st.sampled_from(
    [
        "",
        " ",
        *NODES,
        "fz-r1",
        "default",
        "fake://fz-new",
        "fake://fz-new/dead",
        "redfish://10.255.255.1/redfish/v1/Systems/1",
        "ipmi://[::1]:99999",
        "a" * 63,
        "a" * 64,
        "a" * 1025,
        "\x00",
        "\x1b]0;pwned\x07",
        "spine-\u202e1",
        "../../../etc/passwd",
        "'; DROP TABLE nodes; --",
        "%s%s%n%x",
        "{}",
        '{"kind": "heat", "gpu": 0, "target_c": NaN}',
        '{"kind": "heat", "gpu": 0, "target_c": 1e308}',
        '{"kind": "ecc", "gpu": 99, "sbe": -1}',
        "[" * 4000,
        "NaN",
        "alloc-0000000000",
    ]
)
HUGE_TEXTS = st.sampled_from([2_000, 10_000, 300_000, 1_100_000]).map(lambda n: "x" * n)
# Mostly ordinary and extreme strings; one field in seven is long (at most one
# in four of those over the whole-message cap, which gRPC itself refuses).
strings = st.one_of(texts, EXTREME_TEXTS, texts, EXTREME_TEXTS, texts, EXTREME_TEXTS, HUGE_TEXTS)
small_strings = st.one_of(texts, EXTREME_TEXTS)

# Values that get a call past validation, by field name, so that the fuzzer
# also reaches what runs after it: enrolments that succeed, drains of real nodes.
new_names = st.from_regex(r"fz-[a-z0-9]{1,8}", fullmatch=True)
node_names = st.one_of(st.sampled_from(NODES), new_names)
PLAUSIBLE: dict[str, st.SearchStrategy[str]] = {
    "name": node_names,
    "node": node_names,
    "node_name": st.sampled_from(NODES),
    "names": node_names,
    "bmc_url": new_names.map(lambda n: f"fake://{n}"),
    "username": st.just("admin"),
    "password": st.just("pw"),
    "rack": st.sampled_from(["", "fz-r1", "fz-r2"]),
    "leaf": st.sampled_from(["", "fz-l1"]),
    "spine": st.sampled_from(["", "fz-s1"]),
    "gpu_model": st.sampled_from(["", "H200", "GB200"]),
    "queue": st.sampled_from(["", "default"]),
    "role": st.sampled_from(["viewer", "operator", "provisioner", "admin"]),
    "profile": st.just(""),
    "model": st.sampled_from(["NVIDIA H200", "NVIDIA GB200"]),
}


def string_values(field: FieldDescriptor, small: bool) -> st.SearchStrategy[str]:
    anything = small_strings if small else strings
    plausible = PLAUSIBLE.get(field.name)
    return anything if plausible is None else st.one_of(plausible, plausible, anything)


INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),  # proto3 enums are open
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def integers(field: FieldDescriptor) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[field.type]
    edges = [low, high, 0, 1, 2, 63, 64, 65, 1024, 2**31 - 1, 2**63 - 1]
    edges = [e for e in edges if low <= e <= high]
    extra: list[st.SearchStrategy[int]] = []
    if field.type == FieldDescriptor.TYPE_ENUM:
        extra.append(st.sampled_from([v.number for v in field.enum_type.values]))
    return st.one_of(st.sampled_from(edges), st.integers(low, high), st.integers(0, 5), *extra)


FLOAT_EDGES = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 0.0, 95.0, 1e6]
doubles = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(allow_nan=True))
floats32 = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 3.4e38, 0.0]), st.floats(width=32)
)


def scalar(field: FieldDescriptor, depth: int, small: bool) -> st.SearchStrategy[Any]:
    """One value of ``field``'s type; ``small``: no long strings (an item of a list)."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1, small)
    if kind == FieldDescriptor.TYPE_STRING:
        return string_values(field, small)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=200)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return doubles
    if kind == FieldDescriptor.TYPE_FLOAT:
        return floats32
    return integers(field)


LONG_LISTS = st.sampled_from([65, 257, 1025, 5000])


def values(field: FieldDescriptor, depth: int, small: bool) -> st.SearchStrategy[Any]:
    if not field.is_repeated:
        return scalar(field, depth, small)
    item = scalar(field, depth, small=True)
    if field.type == FieldDescriptor.TYPE_MESSAGE:  # past its limit: empty messages
        empty = GetMessageClass(field.message_type)()
        long = LONG_LISTS.map(lambda n: [empty] * n)
    else:
        long = st.tuples(item, LONG_LISTS).map(lambda p: [p[0]] * p[1])
    return st.one_of(st.lists(item, max_size=4), st.lists(item, max_size=4), long)


@cache
def messages(
    descriptor: Descriptor, depth: int = 0, small: bool = False
) -> st.SearchStrategy[Message]:
    """Any message of ``descriptor``'s type: each field set or not, at random."""
    cls = GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    fields = [f for f in descriptor.fields if not _is_map(f)]
    strategies = {f.name: values(f, depth, small) for f in fields}
    usually = st.sampled_from([True, True, True, False])
    presence = {f.name: usually if f.name in PLAUSIBLE else st.booleans() for f in fields}

    @st.composite
    def build(draw: Callable[..., Any]) -> Message:
        message = cls()
        for field in fields:
            if not draw(presence[field.name]):
                continue
            value = draw(strategies[field.name])
            if field.is_repeated:
                getattr(message, field.name).extend(value)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(message, field.name).CopyFrom(value)
            else:
                setattr(message, field.name, value)
        return message

    return build()


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def not_protobuf(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes that are not a message: random, truncated, or a message with bytes flipped."""
    mangled = st.tuples(messages(descriptor), st.integers(0, 2**16), st.integers(1, 255)).map(
        lambda t: _flip(t[0].SerializeToString(), t[1], t[2])
    )
    truncated = messages(descriptor).map(lambda m: m.SerializeToString()[:-1])
    tags = st.sampled_from([b"\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\x0f", b"\x08" * 11])
    return st.one_of(st.binary(min_size=1, max_size=300), mangled, truncated, tags)


def _flip(data: bytes, at: int, mask: int) -> bytes:
    if not data:
        return b"\xff"
    i = at % len(data)
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]


# -- calls ------------------------------------------------------------------------------


def call(channel: grpc.Channel, method: MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    """Send ``payload`` as the request of ``method`` (no serializers: raw bytes);
    fail on INTERNAL, UNKNOWN or a unary call past its deadline."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    try:
        if method.server_streaming:
            stream = channel.unary_stream(path)(payload, timeout=STREAM_DEADLINE)
            for seen, _ in enumerate(stream):
                if seen >= 20:
                    stream.cancel()
                    break
        else:
            channel.unary_unary(path)(payload, timeout=CALL_DEADLINE)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""  # type: ignore[attr-defined]
    assert code not in BROKEN, f"{method.name} answered {code.name}: {details[:300]}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        assert method.server_streaming, f"{method.name} hung past {CALL_DEADLINE}s"
    assert len(details) <= 1024, f"{method.name}: a {len(details)}-character message"
    return code


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", FLEET.methods, ids=lambda m: m.name)
def test_no_request_breaks_a_fleet_rpc(channel: grpc.Channel, method: MethodDescriptor) -> None:
    @FUZZ
    @given(request=messages(method.input_type))
    def fuzz(request: Message) -> None:
        call(channel, method, request.SerializeToString())
        if method.name == "RemoveNode":
            enrol_nodes(channel)  # removing one is its job: put the fixture's nodes back

    fuzz()
    assert_still_serving(channel)


@pytest.mark.timeout(60)
def test_bytes_that_are_not_a_request_are_refused_by_every_fleet_rpc(
    channel: grpc.Channel,
) -> None:
    @settings(FUZZ, max_examples=150)
    @given(data=st.data(), method=st.sampled_from(list(FLEET.methods)))
    def fuzz(data: st.DataObject, method: MethodDescriptor) -> None:
        payload = data.draw(not_protobuf(method.input_type))
        call(channel, method, payload)
        if method.name == "RemoveNode":
            enrol_nodes(channel)  # bytes that happen to parse may name one of them

    fuzz()
    assert_still_serving(channel)


# -- the agent stream ---------------------------------------------------------------------


def connect(channel: grpc.Channel, *payloads: bytes) -> grpc.StatusCode:
    """One agent stream sending ``payloads`` and then closing its side; the
    stream must end (the server sees the end) with neither INTERNAL nor UNKNOWN."""
    path = f"/{AGENT.full_name}/Connect"
    try:
        for _ in channel.stream_stream(path)(iter(payloads), timeout=CALL_DEADLINE):
            pass
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""  # type: ignore[attr-defined]
    assert code not in BROKEN, f"Connect answered {code.name}: {details[:300]}"
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "the agent stream hung"
    return code


def registration(node: str) -> bytes:
    gpus = [
        types_pb2.Gpu(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H200", memory_mib=143771)
        for i in range(8)
    ]
    register = agent_pb2.Register(node_name=node, gpus=gpus)
    return agent_pb2.AgentMessage(register=register).SerializeToString()


first_messages = st.one_of(
    messages(agent_pb2.AgentMessage.DESCRIPTOR).map(lambda m: m.SerializeToString()),
    # a register for a node that exists, with a random inventory
    st.tuples(st.sampled_from(NODES), messages(agent_pb2.Register.DESCRIPTOR)).map(
        lambda t: _register_as(t[0], t[1])
    ),
    not_protobuf(agent_pb2.AgentMessage.DESCRIPTOR),
)


def _register_as(node: str, register: Message) -> bytes:
    register.node_name = node  # type: ignore[attr-defined]
    return agent_pb2.AgentMessage(register=register).SerializeToString()


@pytest.mark.timeout(60)
def test_no_first_message_breaks_the_agent_stream(channel: grpc.Channel) -> None:
    @settings(FUZZ, max_examples=80)
    @given(first=first_messages, then=st.lists(first_messages, max_size=2))
    def fuzz(first: bytes, then: list[bytes]) -> None:
        connect(channel, first, *then)

    fuzz()
    assert_still_serving(channel)


reports = st.one_of(
    messages(types_pb2.NodeHealth.DESCRIPTOR).map(
        lambda h: agent_pb2.AgentMessage(health=h).SerializeToString()
    ),
    messages(agent_pb2.CommandResult.DESCRIPTOR).map(
        lambda r: agent_pb2.AgentMessage(result=r).SerializeToString()
    ),
    not_protobuf(agent_pb2.AgentMessage.DESCRIPTOR),
)


@pytest.mark.timeout(60)
def test_no_health_report_breaks_the_agent_stream_or_the_node(channel: grpc.Channel) -> None:
    get_node = channel.unary_unary(
        f"/{FLEET.full_name}/GetNode",
        request_serializer=fleet_pb2.GetNodeRequest.SerializeToString,
        response_deserializer=fleet_pb2.Node.FromString,
    )

    @settings(FUZZ, max_examples=60)
    @given(node=st.sampled_from(NODES), sent=st.lists(reports, min_size=1, max_size=4))
    def fuzz(node: str, sent: list[bytes]) -> None:
        connect(channel, registration(node), *sent)
        get_node(fleet_pb2.GetNodeRequest(name=node), timeout=CALL_DEADLINE)  # still shown

    fuzz()
    assert_still_serving(channel)
