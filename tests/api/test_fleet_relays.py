"""FleetService calls through the relay workers (``--agent-relays``): a
real controller and worker process, a client on the relay port. A
relayed call answers what the direct one does (the same message, the
same status and text), is authenticated and audited the same way, a
server stream follows and ends with its client, and the call's deadline
reaches the controller."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_agent_relays import enrol, relayed, until

from controller.api.relay import frames
from controller.api.relay.frames import FrameWriter
from controller.api.relay.methods import FORWARDED
from controller.api.relay.relayed import CallDetails, RelayedCalls, RelayedContext
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


def test_the_workers_forward_every_method_of_kilns_services_with_its_shape() -> None:
    assert FORWARDED["/kiln.v1.AgentService/Connect"] == (True, True)
    assert FORWARDED["/kiln.v1.FleetService/CreateAllocation"] == (False, False)
    assert FORWARDED["/kiln.v1.FleetService/WatchEvents"] == (False, True)
    fleet = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"]
    assert {f"/kiln.v1.FleetService/{m.name}" for m in fleet.methods} <= set(FORWARDED)


@pytest.mark.timeout(120)
async def test_a_relayed_fleet_call_answers_what_a_direct_one_does(tmp_path: Path) -> None:
    async with relayed(tmp_path) as r:
        direct = fleet_pb2_grpc.FleetServiceStub(r.api)
        via = fleet_pb2_grpc.FleetServiceStub(r.agents)
        await enrol(r.agents, "f0")  # enrolled through the worker
        got = await via.GetNode(fleet_pb2.GetNodeRequest(name="f0"))
        assert got.name == "f0"
        assert got == await direct.GetNode(fleet_pb2.GetNodeRequest(name="f0"))
        listed = await via.ListNodes(fleet_pb2.ListNodesRequest())
        assert [n.name for n in listed.nodes] == ["f0"]

        # An error keeps its status and text.
        errors = []
        for stub in (via, direct):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.GetNode(fleet_pb2.GetNodeRequest(name="nowhere"))
            errors.append((raised.value.code(), raised.value.details()))
        assert errors[0] == errors[1] and errors[0][0] == grpc.StatusCode.NOT_FOUND

        # Bytes that are not the request: the request limits' answer.
        raw = r.agents.unary_unary("/kiln.v1.FleetService/GetNode")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await raw(b"\xff\xff\xff")
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # A call with a deadline is served within it.
        node = await via.GetNode(fleet_pb2.GetNodeRequest(name="f0"), timeout=5)
        assert node.name == "f0"
        assert r.server.relays is not None
        await until(lambda: r.server.relays.calls() == 0)  # type: ignore[union-attr]


@pytest.mark.timeout(120)
async def test_relayed_fleet_calls_are_authenticated_and_audited(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    async with relayed(tmp_path, auth=True, bootstrap_token_file=token_file) as r:
        admin = (("authorization", f"Bearer {token_file.read_text().strip()}"),)
        via = fleet_pb2_grpc.FleetServiceStub(r.agents)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await via.ListNodes(fleet_pb2.ListNodesRequest())
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED

        await enrol(r.agents, "g0", metadata=admin)
        audit = await via.ListAudit(fleet_pb2.ListAuditRequest(method="EnrollNode"), metadata=admin)
        entries = [e for e in audit.entries if e.code == "OK"]
        assert len(entries) == 1
        assert entries[0].arguments_json and "g0" in entries[0].arguments_json
        refused = await via.ListAudit(
            fleet_pb2.ListAuditRequest(method="ListNodes"), metadata=admin
        )
        assert "UNAUTHENTICATED" in {e.code for e in refused.entries}


@pytest.mark.timeout(120)
async def test_a_relayed_event_stream_follows_and_ends_with_its_client(tmp_path: Path) -> None:
    async with relayed(tmp_path) as r:
        via = fleet_pb2_grpc.FleetServiceStub(r.agents)
        watch = via.WatchEvents(fleet_pb2.WatchEventsRequest(follow=True, from_now=True))
        await until(lambda: r.server.relays.calls() == 1)  # type: ignore[union-attr]
        await enrol(r.api, "w0")
        event = await asyncio.wait_for(watch.read(), 10)
        assert event is not grpc.aio.EOF and event.node == "w0"
        watch.cancel()
        # The controller's handler ends with the client's call.
        await until(lambda: r.server.relays.calls() == 0)  # type: ignore[union-attr]


async def test_a_relayed_calls_deadline_reaches_the_handler() -> None:
    context = RelayedContext((), {}, "ipv4:127.0.0.1:1", 5.0)
    left = context.time_remaining()
    assert left is not None and 4.0 < left <= 5.0
    assert RelayedContext((), {}, "ipv4:127.0.0.1:1", None).time_remaining() is None

    # Through a link: the handler sees the deadline the worker forwarded.
    seen: list[float | None] = []

    async def unary(request: bytes, context: RelayedContext) -> bytes:
        seen.append(context.time_remaining())
        return request[::-1]

    async def handler_for(details: CallDetails) -> grpc.RpcMethodHandler | None:
        assert details.method == "/kiln.v1.FleetService/GetNode"
        return grpc.unary_unary_rpc_method_handler(unary)

    ours, theirs = await _pipe()
    link = FrameWriter(ours[1])
    sending = asyncio.create_task(link.run())
    calls = RelayedCalls(link, handler_for)
    calls.on_frame((frames.OPEN, 3, "/kiln.v1.FleetService/GetNode", (), {}, "peer", 2.5))
    calls.on_frame((frames.MESSAGES, [(3, b"abc")]))
    calls.on_frame((frames.HALF_CLOSE, 3))
    out = await asyncio.wait_for(frames.read_frame(theirs[0]), 10)
    end = await asyncio.wait_for(frames.read_frame(theirs[0]), 10)
    assert out == (frames.OUT, 3, b"cba")
    assert end == (frames.END, 3, 0, "")
    assert seen and seen[0] is not None and 1.5 < seen[0] <= 2.5
    sending.cancel()


async def _pipe() -> tuple[
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
]:
    a, b = socket.socketpair()
    return await asyncio.open_unix_connection(sock=a), await asyncio.open_unix_connection(sock=b)


async def test_a_relayed_server_stream_sends_no_more_than_its_window_ahead_of_the_worker() -> None:
    made = 0

    async def stream(request: bytes, context: RelayedContext) -> AsyncIterator[bytes]:
        nonlocal made
        for _ in range(10 * frames.WINDOW):
            made += 1
            yield request

    async def handler_for(details: CallDetails) -> grpc.RpcMethodHandler | None:
        return grpc.unary_stream_rpc_method_handler(stream)

    ours, theirs = await _pipe()
    link = FrameWriter(ours[1])
    sending = asyncio.create_task(link.run())
    calls = RelayedCalls(link, handler_for)
    calls.on_frame((frames.OPEN, 5, "/kiln.v1.FleetService/WatchEvents", (), {}, "p", None, b"e"))

    async def outs(count: int) -> None:
        for _ in range(count):
            frame = await asyncio.wait_for(frames.read_frame(theirs[0]), 10)
            assert frame == (frames.OUT, 5, b"e")

    await outs(frames.WINDOW)
    await asyncio.sleep(0.2)  # a client that reads nothing: the handler waits
    assert made <= frames.WINDOW + 1
    calls.on_frame((frames.SENT, 5, 10))  # the worker's client took 10
    await outs(10)
    await asyncio.sleep(0.2)
    assert made <= frames.WINDOW + 11
    calls.on_frame((frames.GONE, 5))  # the client goes: the handler ends
    await calls.end_all()
    sending.cancel()


@pytest.mark.timeout(120)
async def test_a_relayed_stream_longer_than_the_window_delivers_every_message(
    tmp_path: Path,
) -> None:
    async with relayed(tmp_path) as r:
        await enrol(r.api, *(f"e{i}" for i in range(frames.WINDOW + 16)))
        request = fleet_pb2.WatchEventsRequest(after_seq=0, follow=False)
        direct = [e.seq async for e in fleet_pb2_grpc.FleetServiceStub(r.api).WatchEvents(request)]
        via = fleet_pb2_grpc.FleetServiceStub(r.agents).WatchEvents(request, timeout=30)
        relayed_seqs = [e.seq async for e in via]
        assert len(direct) > 2 * frames.WINDOW
        assert relayed_seqs[: len(direct)] == direct
