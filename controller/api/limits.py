"""What any client may send the controller, checked before a request reaches the core.

``RequestLimits`` is a grpc.aio server interceptor over Kiln's two services.
For every call, in this order:

1. **Per-client rate and streams** (FleetService only): each client — the
   peer's IP address, so every connection one host opens counts together — has
   a token bucket of ``rate`` requests per second (bursts up to ``burst``) and
   may hold at most ``max_streams`` server-streaming calls (``WatchEvents``,
   ``PowerNodes``) open at once. Over either, the call is refused
   RESOURCE_EXHAUSTED before it does any work, so one client cannot starve
   agents or other operators. AgentService is not limited here: each agent
   holds one stream, and registering needs an enrolled node.
2. **Well-formed messages**: bytes that are not a valid protobuf message of
   the method's request type are refused INVALID_ARGUMENT (gRPC alone would
   answer UNKNOWN with the parser's text).
3. **Sizes**: ``check`` walks the request's descriptor and refuses the first
   string, bytes or repeated field over its limit (``limit_for``): names 63
   characters, URLs 2 KiB, anything else 1 KiB; repeated fields 1024 items,
   GPUs per node 64; per-field exceptions in ``OVERRIDES``. The refusal names
   the field and its limit, never the value. Every message an agent sends on
   its stream is checked as it arrives (the servicer sees the refusal raised
   from its request iterator).
4. **The client's deadline** (unary calls): the time the client has left is
   opened as the request's deadline (``controller.core.deadline``), so slow
   work for it -- BMC calls and their retries -- stops in time to answer with
   its own error rather than the client's "deadline exceeded".
5. **Last line**: an exception a servicer let escape never reaches the client
   as text: a ``KilnError`` gets its status (``errors.status_for``), anything
   else INTERNAL with a generic message (and the traceback in the log).

Whole messages are also capped by the server's ``MAX_RECEIVE_BYTES``
(``grpc.max_receive_message_length``), which gRPC enforces before any of this.
"""

from __future__ import annotations

import inspect
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controller.api.errors import message_for, status_for
from controller.api.handler_cache import HandlerCache
from controller.core.deadline import caller_deadline
from controller.core.errors import InvalidArgument, KilnError
from controller.core.nodes import MAX_GPUS_PER_NODE, NAME_MAX
from kiln.v1 import agent_pb2, fleet_pb2

log = logging.getLogger(__name__)

# -- sizes -----------------------------------------------------------------------

MAX_RECEIVE_BYTES = 1024 * 1024  # one request message; the largest real one is ~100 KB

NAME = NAME_MAX  # node, rack, leaf, spine, queue: controller.core.nodes.validate_name
TEXT = 1024  # reasons, messages, anything not named below
URL = 2048
PATH = 4096  # a file on the controller (PATH_MAX)
ITEMS = 1024  # a repeated field

# The default for a field of this name, in any request message.
BY_NAME: Mapping[str, int] = {
    **dict.fromkeys(
        ("name", "node", "node_name", "rack", "leaf", "spine", "queue", "allocation", "id"), NAME
    ),
    **dict.fromkeys(("gpu_model", "role", "method", "architecture", "nvml_backend"), NAME),
    "agent_version": NAME,
    **dict.fromkeys(("profile", "applied_profile", "key"), 128),  # core: keys ≤ 128
    **dict.fromkeys(("uuid", "model"), 96),  # NVML's UUID and name buffers
    "bmc_url": URL,
    "username": 256,
}

# Exceptions, by the field's full name: the one table to change a limit in.
OVERRIDES: Mapping[str, int] = {
    "kiln.v1.EnrollNodeRequest.ca_bundle": PATH,
    "kiln.v1.InjectFaultRequest.fault_json": 4096,
    "kiln.v1.PowerNodesRequest.names": 4096,  # 4096 × 63 characters ≈ 256 KiB
    "kiln.v1.PowerNodesRequest.names[]": NAME,
    "kiln.v1.ProvisionNodesRequest.names": 4096,
    "kiln.v1.ProvisionNodesRequest.names[]": NAME,
    "kiln.v1.ProvisionNodesRequest.image": 63,  # a catalogue name (images/catalog.py)
    "kiln.v1.ProvisionNodesRequest.image_server": URL,
    "kiln.v1.BringUpRackRequest.members": 128,  # an NVL72 rack has 18 + 9 + 8
    "kiln.v1.BringUpRackRequest.image": 63,
    "kiln.v1.Register.hostname": 253,  # a DNS name
    "kiln.v1.Register.driver_version": 80,  # NVML's version buffer
    "kiln.v1.Register.gpus": MAX_GPUS_PER_NODE,
    "kiln.v1.Gpu.serial": 64,
    "kiln.v1.Gpu.pci_bus_id": 32,  # NVML's PCI bus id buffer
    "kiln.v1.Gpu.clique": 128,  # "<clusterUuid>.<cliqueId>"
    "kiln.v1.GpuHealth.clique": 128,
    "kiln.v1.NodeHealth.gpus": MAX_GPUS_PER_NODE,
    "kiln.v1.NodeHealth.bmc_temps_c": 256,
    "kiln.v1.NodeHealth.drift": 64,
    "kiln.v1.NodeHealth.drift[]": 256,
    "kiln.v1.GpuHealth.xids": 256,
    "kiln.v1.GpuHealth.nvlink_down": 64,
    "kiln.v1.GpuHealth.errors": 16,  # each reading that failed, once
    "kiln.v1.GpuHealth.errors[]": 256,
    "kiln.v1.CommandResult.changed": 256,
    "kiln.v1.CommandResult.failures": 256,
    "kiln.v1.CommandResult.message": 4096,
    "kiln.v1.CommandResult.figures_json": 16384,  # a check's measured figures
    "kiln.v1.RunChecksRequest.nodes": 4096,
    "kiln.v1.RunChecksRequest.nodes[]": NAME,
}


class FieldTooLarge(InvalidArgument):
    template = "%(field)s: at most %(limit)d %(unit)s, not %(size)d"


def limit_for(field: FieldDescriptor, *, item: bool = False) -> int:
    """The limit on one field: its count of items for a repeated field
    (``item=False``), else its length in characters (strings) or bytes."""
    if field.is_repeated and not item:
        return OVERRIDES.get(field.full_name, ITEMS)
    if field.is_repeated:
        found = OVERRIDES.get(field.full_name + "[]")
        if found is not None:
            return found
    elif field.full_name in OVERRIDES:
        return OVERRIDES[field.full_name]
    return BY_NAME.get(field.name, TEXT)


def _is_map(field: FieldDescriptor) -> bool:
    kind = field.message_type
    return kind is not None and kind.GetOptions().map_entry


def _sized(field: FieldDescriptor) -> bool:
    return field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one field is checked, decided once per field descriptor."""

    items: int | None  # a repeated field's most items (None: not repeated)
    length: int | None  # a string's characters or bytes' bytes (each item's, if repeated)
    unit: str
    message: bool  # a message (or a repeated one): checked field by field
    map_entry: FieldDescriptor | None  # a map: its entry type's key and value fields


def _plan_for(field: FieldDescriptor) -> _Plan:
    sized = _sized(field)
    return _Plan(
        items=limit_for(field) if field.is_repeated else None,
        length=limit_for(field, item=field.is_repeated) if sized else None,
        unit="characters" if field.type == FieldDescriptor.TYPE_STRING else "bytes",
        message=field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field),
        map_entry=field.message_type if _is_map(field) else None,
    )


class _Over(Exception):
    """Raised deep in a message and given its path on the way out."""

    def __init__(self, segment: str, limit: int, unit: str, size: int) -> None:
        self.segments = [segment]
        self.limit, self.unit, self.size = limit, unit, size


_Checked = tuple[tuple[str, _Plan, bool], ...]  # (field name, plan, a singular message)


def _checked_fields(kind: Descriptor) -> _Checked:
    """The fields of a message type that can be over a limit (strings, bytes,
    repeated fields, maps and messages), in field-number order (the order
    ``ListFields`` gives, so the first field over its limit is named)."""
    checked = []
    for field in sorted(kind.fields, key=lambda f: f.number):
        plan = _plan_for(field)
        if plan.items is not None or plan.length is not None or plan.message:
            checked.append((field.name, plan, plan.message and not field.is_repeated))
    return tuple(checked)


class Checker:
    """``check`` with each message type's checked fields and their plans
    worked out once. A report stream sends thousands of messages a second,
    each with ~250 set fields of which ~40 are strings, repeated fields or
    messages: numbers and flags have no limit and are never visited."""

    def __init__(self) -> None:
        self._checked: dict[Descriptor, _Checked] = {}

    def check(self, message: Message, *, path: str = "") -> None:
        """As ``check``: raises FieldTooLarge naming the field's path."""
        try:
            self._walk(message)
        except _Over as e:
            here = ".".join([path or message.DESCRIPTOR.name, *reversed(e.segments)])
            raise FieldTooLarge(field=here, limit=e.limit, unit=e.unit, size=e.size) from None

    def _walk(self, message: Message) -> None:
        kind = message.DESCRIPTOR
        checked = self._checked.get(kind)
        if checked is None:
            checked = self._checked[kind] = _checked_fields(kind)
        for name, plan, singular_message in checked:
            if singular_message and not message.HasField(name):
                continue
            value = getattr(message, name)
            if not singular_message and not value:  # an empty string, bytes, list or map
                continue
            try:
                self._field(plan, value)
            except _Over as e:
                e.segments[-1] = name + e.segments[-1]
                raise

    def _field(self, plan: _Plan, value: Any) -> None:
        # Raises _Over with a segment that the caller prefixes with the field's name.
        if plan.items is not None:
            if len(value) > plan.items:
                raise _Over("", plan.items, "items", len(value))
            if plan.map_entry is not None:
                key_field = plan.map_entry.fields_by_name["key"]
                value_field = plan.map_entry.fields_by_name["value"]
                for key in value:
                    for f, v in ((key_field, key), (value_field, value[key])):
                        try:
                            self._field(_plan_for(f), v)
                        except _Over as e:
                            e.segments[-1] = "[]" + e.segments[-1]
                            raise
            elif plan.message or plan.length is not None:
                for i, item in enumerate(value):
                    try:
                        self._one(plan, item)
                    except _Over as e:
                        e.segments[-1] = f"[{i}]" + e.segments[-1]
                        raise
        else:
            self._one(plan, value)

    def _one(self, plan: _Plan, value: Any) -> None:
        if plan.message:
            try:
                self._walk(value)
            except _Over as e:
                e.segments.append("")  # the nested path continues after a dot
                raise
        elif plan.length is not None and len(value) > plan.length:
            raise _Over("", plan.length, plan.unit, len(value))


def check(message: Message, *, path: str = "") -> None:
    """Refuse a message with a string, bytes or repeated field over its limit.

    Visits only the fields that are set, so an empty message costs nothing.
    Raises FieldTooLarge (InvalidArgument) naming the first such field by its
    path (``Register.gpus[3].model``) and its limit; never the value.
    """
    Checker().check(message, path=path)


# -- malformed messages -------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """What the deserializer hands over for bytes that do not parse."""

    type_name: str


class MalformedMessage(InvalidArgument):
    template = "the request is not a valid %(type_name)s message"


def _tolerant(deserialize: Callable[[bytes], Any], type_name: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:  # DecodeError, or a nesting too deep for the parser
            return Malformed(type_name)

    return parse


def _checked(checker: Checker, request: Any) -> Any:
    """The request, once it is well formed and within every size limit."""
    if isinstance(request, Malformed):
        raise MalformedMessage(type_name=request.type_name)
    if isinstance(request, Message):  # not the raw bytes a refusing handler takes
        checker.check(request)
    return request


async def _checked_stream(checker: Checker, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _checked(checker, request)


# -- per-client rate and streams ------------------------------------------------------

DEFAULT_MAX_STREAMS = 128
DEFAULT_RATE = 200.0  # requests per second
MAX_CLIENTS_TRACKED = 10_000  # then idle clients' buckets are dropped


def client_of(peer: str) -> str:
    """The client a call comes from: the peer's IP address without its port
    (``ipv4:10.0.0.5:41234`` → ``10.0.0.5``, ``ipv6:[::1]:5`` → ``::1``)."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or not rest:
        return peer
    host, _, _ = urllib.parse.unquote(rest).rpartition(":")
    return host.strip("[]") or peer


class TokenBuckets:
    """One token bucket per client: ``rate`` tokens a second, at most ``burst``.

    Not thread-safe; used from the server's event loop only.
    """

    def __init__(
        self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client → (tokens, at)

    def take(self, client: str) -> bool:
        """Spend one token of ``client``'s; False when it has none left."""
        now = self._clock()
        tokens, at = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if len(self._buckets) >= MAX_CLIENTS_TRACKED and client not in self._buckets:
            self._forget_idle(now)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return False
        self._buckets[client] = (tokens - 1.0, now)
        return True

    def _forget_idle(self, now: float) -> None:
        """Drop the buckets that have refilled: a new one starts full anyway."""
        full = [
            c for c, (t, at) in self._buckets.items() if t + (now - at) * self.rate >= self.burst
        ]
        for client in full:
            del self._buckets[client]

    def __len__(self) -> int:
        return len(self._buckets)


class StreamSlots:
    """At most ``limit`` open streams per client."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def acquire(self, client: str) -> bool:
        held = self._open.get(client, 0)
        if held >= self.limit:
            return False
        self._open[client] = held + 1
        return True

    def release(self, client: str) -> None:
        held = self._open.get(client, 0) - 1
        if held > 0:
            self._open[client] = held
        else:
            self._open.pop(client, None)

    def held(self, client: str) -> int:
        return self._open.get(client, 0)


# -- the interceptor -------------------------------------------------------------------

FLEET_SERVICE = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"]
AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
REQUEST_TYPES: Mapping[str, str] = {
    f"/{service.full_name}/{method.name}": method.input_type.full_name
    for service in (FLEET_SERVICE, AGENT_SERVICE)
    for method in service.methods
}
LIMITED_PREFIX = f"/{FLEET_SERVICE.full_name}/"

Behaviour = Callable[..., Any]


class RequestLimits(grpc.aio.ServerInterceptor):
    """The checks in the module docstring, on every call to Kiln's services.

    Register it first among the server's interceptors, so that what follows
    only ever sees well-formed requests within their limits.
    """

    def __init__(
        self,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        rate: float = DEFAULT_RATE,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buckets = TokenBuckets(rate, burst if burst is not None else 2 * rate, clock=clock)
        self.streams = StreamSlots(max_streams)
        self.checker = Checker()
        self._handlers = HandlerCache()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        type_name = REQUEST_TYPES.get(method)
        if handler is None or type_name is None:
            return handler
        return self._handlers.wrapped(
            method, handler, lambda inner: self._wrap(inner, method, type_name)
        )

    def _wrap(
        self, handler: grpc.RpcMethodHandler, method: str, type_name: str
    ) -> grpc.RpcMethodHandler:
        limited = method.startswith(LIMITED_PREFIX)
        name = method.rpartition("/")[2]
        deserializer = handler.request_deserializer
        tolerant = _tolerant(deserializer, type_name) if deserializer is not None else None
        kwargs = {
            "request_deserializer": tolerant,
            "response_serializer": handler.response_serializer,
        }
        if not handler.request_streaming and not handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, name, limited), **kwargs
            )
        if not handler.request_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(handler.unary_stream, name, limited), **kwargs
            )
        if not handler.response_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._stream_unary(handler.stream_unary, name, limited), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._stream_stream(handler.stream_stream, name, limited), **kwargs
        )

    # A call's admission: the rate first (cheapest, and no work for a flood),
    # then the streams (released when the call ends).

    async def _admit(self, context: grpc.aio.ServicerContext, limited: bool) -> str:
        client = client_of(context.peer())
        if limited and not self.buckets.take(client):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"client {client[:64]} sends more than {self.buckets.rate:g} requests a "
                "second; slow down and retry",
            )
        return client

    async def _open_stream(self, context: grpc.aio.ServicerContext, client: str) -> None:
        if not self.streams.acquire(client):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"client {client[:64]} already has {self.streams.limit} streams open, "
                "the most one client may; close one and retry",
            )

    def _unary(self, inner: Behaviour, name: str, limited: bool) -> Behaviour:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._admit(context, limited)
            try:
                # Work for this call (BMC retries) ends in time to answer.
                with caller_deadline(context.time_remaining()):
                    return await inner(_checked(self.checker, request), context)
            except Exception as e:
                await _refuse(context, e, name)

        return behaviour

    def _stream_unary(self, inner: Behaviour, name: str, limited: bool) -> Behaviour:
        async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await self._admit(context, limited)
            try:
                return await inner(_checked_stream(self.checker, requests), context)
            except Exception as e:
                await _refuse(context, e, name)

        return behaviour

    def _unary_stream(self, inner: Behaviour, name: str, limited: bool) -> Behaviour:
        # grpc.aio serves a stream only from an async generator function.
        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            checked = lambda: _checked(self.checker, request)  # noqa: E731
            async for item in self._streamed(inner, name, limited, checked, context):
                yield item

        return behaviour

    def _stream_stream(self, inner: Behaviour, name: str, limited: bool) -> Behaviour:
        async def behaviour(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            checked = lambda: _checked_stream(self.checker, requests)  # noqa: E731
            async for item in self._streamed(inner, name, limited, checked, context):
                yield item

        return behaviour

    async def _streamed(
        self,
        inner: Behaviour,
        name: str,
        limited: bool,
        request: Callable[[], Any],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[Any]:
        """A server-streaming call, admitted and counted as one of its client's
        streams; ``request`` checks the request (or wraps the stream) once admitted."""
        client = await self._admit(context, limited)
        if limited:
            await self._open_stream(context, client)
        try:
            async for item in _responses(inner, request(), context):
                yield item
        except Exception as e:
            await _refuse(context, e, name)
        finally:
            if limited:
                self.streams.release(client)


async def _responses(
    inner: Behaviour, request: Any, context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    """A server-streaming behaviour's messages, whether it is an async
    generator or a coroutine that writes through ``context`` (or aborts)."""
    result = inner(request, context)
    if inspect.isasyncgen(result) or hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):
        await result


async def _refuse(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    """End the call for an exception a servicer let escape: never its text,
    unless it is a KilnError (whose messages are written for clients)."""
    if isinstance(error, grpc.aio.AbortError):
        raise error  # the servicer already chose the status
    if isinstance(error, KilnError):
        await context.abort(status_for(error), message_for(error))
    if isinstance(error, NotImplementedError):  # the generated servicer's default
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")
    log.error("%s failed", method, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}")


__all__ = [
    "MAX_RECEIVE_BYTES",
    "OVERRIDES",
    "FieldTooLarge",
    "RequestLimits",
    "TokenBuckets",
    "check",
    "client_of",
    "limit_for",
]
