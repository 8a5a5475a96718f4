"""A relay worker digests agents' health reports (``relay/digest.py``): it
parses, checks and packs each one, and the controller's handler gets the
same report it would have made itself. What does not pass goes as it came,
for the controller to refuse; a call's messages and reports keep their
order over the link."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controller.api import convert
from controller.api.limits import Checker, FieldTooLarge, _checked_fields, limit_for
from controller.api.relay import frames
from controller.api.relay import relayed as relayed_calls
from controller.api.relay.digest import CHECKED, CONNECT, ReportDigest
from controller.api.relay.frames import MESSAGES, OPEN, REPORTS, FrameWriter
from controller.api.relay.worker import Relay
from controller.core.health import pack_report, packed_values, unpack_report
from kiln.v1 import agent_pb2, types_pb2


def health_message(temp_c: float = 61.5, **gpu: Any) -> agent_pb2.AgentMessage:
    """A report with most of what a real one carries: two H200s, one with
    readings absent, a non-finite reading, XIDs, ECC counts, BMC temperatures
    and drift."""
    first = types_pb2.GpuHealth(
        index=0,
        uuid="GPU-5b1a6c4e-0000-4000-8000-000000000000",
        temp_c=temp_c,
        mem_temp_c=48.0,
        slowdown_c=87.0,
        shutdown_c=92.0,
        gpu_max_c=89.0,
        power_w=402.5,
        power_limit_w=700.0,
        sm_clock_mhz=1980,
        mem_clock_mhz=3201,
        clock_event_reasons=0x4,
        ecc_sbe_volatile=2,
        ecc_dbe_aggregate=1,
        remap_correctable=0,
        remap_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
        xids=[79, 48],
        nvlink_down=[3],
        nvlink_errors=5,
        fabric_state=3,  # NVML_GPU_FABRIC_STATE_COMPLETED
        fabric_healthy=True,
        clique="cluster-a.7",
        **gpu,
    )
    second = types_pb2.GpuHealth(index=1, uuid="GPU-second", temp_c=math.nan, lost=False)
    return agent_pb2.AgentMessage(
        health=types_pb2.NodeHealth(
            sampled_at=1_765_000_000.25,
            source="agent",
            gpus=[first, second],
            bmc_temps_c=[31.0, math.inf, 29.5],
            drift=["gpu 0: clocks not locked"],
        )
    )


def test_a_report_is_packed_as_the_controller_would_have_made_it() -> None:
    message = health_message()
    packed = ReportDigest().packed(message.SerializeToString())
    assert packed is not None
    assert unpack_report(packed) == convert.health_from_pb(message.health)
    report = unpack_report(packed)
    assert report.gpus[1].temp_c is None  # NaN: unknown, as health_from_pb makes it
    assert report.bmc_temps_c == (31.0, 29.5)
    assert report.gpus[0].xids == (79, 48)


def test_the_packed_values_are_those_of_the_typed_report_packed() -> None:
    # The worker packs the message's values without the typed report; what it
    # packs reads back as the typed report packed, field for field: a report
    # with two GPUs, one with readings absent, and one with nothing in it
    # (no GPUs, no source: "agent").
    empty = agent_pb2.AgentMessage(health=types_pb2.NodeHealth(sampled_at=5.0))
    for message in (health_message(), health_message(temp_c=math.nan), empty):
        packed = ReportDigest().packed(message.SerializeToString())
        assert packed is not None
        typed = convert.health_from_pb(message.health)
        assert packed_values(packed) == packed_values(pack_report(typed))
    assert unpack_report(packed).source == "agent" and unpack_report(packed).gpus == ()


def test_what_is_not_a_report_in_bounds_goes_as_it_came() -> None:
    digest = ReportDigest()
    register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="n0"))
    result = agent_pb2.AgentMessage(result=agent_pb2.CommandResult(id="c1", ok=True))
    over = health_message(errors=["e"] * 17)  # GpuHealth.errors: at most 16
    too_long = health_message(errors=["e" * 257])
    for message in (register, result, over, too_long):
        assert digest.packed(message.SerializeToString()) is None
    assert digest.packed(b"\xff\xff\xff") is None  # not an AgentMessage
    assert digest.packed(b"") is None  # an empty message: no body


def _at_and_over(kind: str, name: str) -> list[tuple[Any, bool]]:
    """Values for one checked field at its limit and past it (True): its
    count of items, and for repeated strings, one item's length too."""
    field = getattr(types_pb2, kind).DESCRIPTOR.fields_by_name[name]
    limit = limit_for(field)
    counts = (limit, limit + 1)
    if name == "gpus":
        values: list[Any] = [[types_pb2.GpuHealth(index=i) for i in range(n)] for n in counts]
    elif name == "bmc_temps_c":  # non-finite ones are dropped from the values, not the count
        values = [[math.nan] * n for n in counts]
    elif name in ("xids", "nvlink_down"):
        values = [list(range(n)) for n in counts]
    elif field.is_repeated:
        each = limit_for(field, item=True)
        values = [["e"] * n for n in counts] + [["e" * n] for n in (each, each + 1)]
    else:
        values = ["s" * n for n in counts]
    return [(value, i % 2 == 1) for i, value in enumerate(values)]


def test_the_digest_checks_every_field_the_checker_checks() -> None:
    checked = {
        kind.full_name: tuple(name for name, _, _ in _checked_fields(kind))
        for kind in (types_pb2.NodeHealth.DESCRIPTOR, types_pb2.GpuHealth.DESCRIPTOR)
    }
    assert {k: set(v) for k, v in checked.items()} == {k: set(v) for k, v in CHECKED.items()}
    # An agent's message carries nothing checked beside its body.
    body = {name for name, _, _ in _checked_fields(agent_pb2.AgentMessage.DESCRIPTOR)}
    assert body == {"register", "health", "result"}


def test_a_report_over_any_limit_goes_as_it_came_and_one_at_it_is_packed() -> None:
    digest = ReportDigest()
    checker = Checker()
    tried = 0
    for kind, names in CHECKED.items():
        for name in names:
            for value, over in _at_and_over(kind.split(".")[-1], name):
                message = health_message()
                if kind == "kiln.v1.NodeHealth":
                    target: Any = message.health
                else:
                    target = message.health.gpus[1]
                if isinstance(value, list):
                    target.ClearField(name)
                    getattr(target, name).extend(value)
                else:
                    setattr(target, name, value)
                packed = digest.packed(message.SerializeToString())
                if over:
                    with pytest.raises(FieldTooLarge):
                        checker.check(message)
                    assert packed is None, (name, value)
                else:
                    checker.check(message)
                    assert packed is not None, (name, value)
                tried += 1
    assert tried == 2 * 7 + 4 * 2  # every field: at and past its limit


@contextlib.asynccontextmanager
async def _link(
    running: bool = True,
) -> AsyncIterator[tuple[FrameWriter, asyncio.StreamReader]]:
    """A FrameWriter on one end of a socket pair (writing, when ``running``)
    and a reader on the other."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    reader, other = await asyncio.open_unix_connection(sock=theirs)
    link = FrameWriter(writer)
    sending = asyncio.create_task(link.run()) if running else None
    try:
        yield link, reader
    finally:
        if sending is not None:
            sending.cancel()
        writer.close()
        other.close()


REGISTER = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="n0"))


@contextlib.asynccontextmanager
async def _relayed_call(
    handler: Any, *, running: bool = False
) -> AsyncIterator[tuple[relayed_calls.RelayedCalls, asyncio.StreamReader]]:
    """``RelayedCalls`` on a link (sent on when ``running``, read by the
    reader yielded), with call 1 an ``AgentService.Connect`` served by
    ``handler`` and sent its register."""

    async def handler_for(_details: object) -> grpc.RpcMethodHandler:
        return grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=agent_pb2.AgentMessage.FromString
        )

    async with _link(running=running) as (link, reader):
        calls = relayed_calls.RelayedCalls(link, handler_for)
        try:
            calls.on_frame((OPEN, 1, CONNECT, (), {}, "ipv4:127.0.0.1:1", None))
            calls.on_frame((MESSAGES, [(1, REGISTER.SerializeToString())]))
            yield calls, reader
        finally:
            await calls.end_all()


async def _frames(reader: asyncio.StreamReader, count: int) -> list[tuple[Any, ...]]:
    got = []
    for _ in range(count):
        frame = await asyncio.wait_for(frames.read_frame(reader), 5)
        assert frame is not None
        got.append(frame)
    return got


@pytest.mark.timeout(30)
async def test_a_calls_messages_and_reports_keep_their_order_on_the_link() -> None:
    async with _link() as (link, reader):
        link.message(1, b"m1")
        link.report(1, b"r1")
        link.report(1, b"r2")
        link.message(1, b"m2")
        link.send((frames.HALF_CLOSE, 1))
        link.report(1, b"r3")
        got = await _frames(reader, 5)
        assert got == [
            (MESSAGES, [(1, b"m1")]),
            (REPORTS, [(1, b"r1"), (1, b"r2")]),
            (MESSAGES, [(1, b"m2")]),
            (frames.HALF_CLOSE, 1),
            (REPORTS, [(1, b"r3")]),
        ]


@pytest.mark.timeout(30)
async def test_the_worker_forwards_an_agents_reports_digested_and_the_rest_raw() -> None:
    register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="n0"))
    report, over = health_message(), health_message(errors=["e"] * 17)

    async def requests() -> AsyncIterator[bytes]:
        for message in (register, report, over):
            yield message.SerializeToString()

    async with _link() as (link, reader):
        relay = Relay(link, certificates=False)
        await relay._forward(7, link, requests(), ReportDigest().packed)
        got = await _frames(reader, 4)
        assert [f[0] for f in got] == [MESSAGES, REPORTS, MESSAGES, frames.HALF_CLOSE]
        assert got[0][1] == [(7, register.SerializeToString())]
        (ident, packed), *_ = got[1][1]
        assert ident == 7 and unpack_report(packed) == convert.health_from_pb(report.health)
        assert got[2][1] == [(7, over.SerializeToString())]  # for the controller to refuse


@pytest.mark.timeout(30)
async def test_the_controller_hands_a_digested_report_to_the_handler_as_it_came() -> None:
    """``RelayedCalls``: a REPORTS frame reaches the stream's handler as a
    packed report itself (``bytes``, which the collector never tracks),
    between the call's parsed messages, in order, and counts in the backlog
    until taken up."""
    received: list[Any] = []
    done = asyncio.Event()

    async def handler(requests: AsyncIterator[Any], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            received.append(request)
        done.set()
        yield b""

    packed = ReportDigest().packed(health_message().SerializeToString())
    assert packed is not None
    async with _relayed_call(handler) as (calls, _):
        calls.on_frame((REPORTS, [(1, packed), (1, packed)]))
        assert calls.queued == 3
        assert calls.queued_bytes == REGISTER.ByteSize() + 2 * len(packed)
        calls.on_frame((frames.HALF_CLOSE, 1))
        await asyncio.wait_for(done.wait(), 5)
        assert received == [REGISTER, packed, packed]
        assert not gc.is_tracked(received[1])
        assert calls.queued == 0 and calls.queued_bytes == 0


@pytest.mark.timeout(30)
async def test_a_call_that_takes_its_reports_gets_them_pushed_in_order_with_its_messages() -> None:
    """``RelayedContext.take_reports``: once the handler asks for them, the
    call's digested reports go to its sink and wake no stream; a message
    the call is sent meanwhile, and whatever follows it until the stream has
    taken it, still comes through the stream, so the two keep the order the
    agent sent them in. Every one counts in the backlog until taken."""
    seen: list[tuple[str, Any]] = []
    registered, done = asyncio.Event(), asyncio.Event()

    async def sink(packed: bytes) -> None:
        await asyncio.sleep(0)  # a sink may wait: what comes meanwhile waits behind it
        seen.append(("sink", packed))

    async def handler(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            seen.append(("stream", request))
            if not registered.is_set():
                context.take_reports(sink)
                registered.set()
        done.set()
        yield b""

    result = agent_pb2.AgentMessage(result=agent_pb2.CommandResult(id="c1", ok=True))
    digest = ReportDigest()
    r1, r2, r3, r4 = (
        digest.packed(health_message(temp_c=t).SerializeToString()) for t in (50, 51, 52, 53)
    )
    assert r1 and r2 and r3 and r4
    async with _relayed_call(handler) as (calls, _):
        await asyncio.wait_for(registered.wait(), 5)
        calls.on_frame((REPORTS, [(1, r1), (1, r2)]))
        calls.on_frame((MESSAGES, [(1, result.SerializeToString())]))
        calls.on_frame((REPORTS, [(1, r3)]))
        assert calls.queued == 4
        for _ in range(50):
            if len(seen) == 5:
                break
            await asyncio.sleep(0.01)
        calls.on_frame((REPORTS, [(1, r4)]))  # the stream has taken all: pushed again
        calls.on_frame((frames.HALF_CLOSE, 1))
        await asyncio.wait_for(done.wait(), 5)
        assert seen == [
            ("stream", REGISTER),
            ("sink", r1),
            ("sink", r2),
            ("stream", result),
            ("stream", r3),
            ("sink", r4),
        ]
        assert calls.queued == 0 and calls.queued_bytes == 0


@pytest.mark.timeout(30)
async def test_the_report_task_lets_the_loop_run_between_batches_of_reports() -> None:
    """A worker's frame can hold thousands of reports and a sink rarely
    waits: the link's report task hands on reports for ``PUSHED_TURN_S``,
    then lets the event loop run what else is ready (registrations, API
    calls, the link, timers)."""
    taken: list[bytes] = []
    registered, all_taken = asyncio.Event(), asyncio.Event()
    reports = 200
    each_s = relayed_calls.PUSHED_TURN_S / 4  # four reports' work a turn

    async def sink(packed: bytes) -> None:
        busy_until = time.perf_counter() + each_s
        while time.perf_counter() < busy_until:
            pass  # a report's work, on the event loop
        taken.append(packed)
        if len(taken) == reports:
            all_taken.set()

    async def other_work() -> int:
        return len(taken)  # as many as were handed on before it ran

    async def handler(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            context.take_reports(sink)
            registered.set()
        yield b""

    packed = ReportDigest().packed(health_message().SerializeToString())
    assert packed is not None
    async with _relayed_call(handler) as (calls, _):
        await asyncio.wait_for(registered.wait(), 5)
        calls.on_frame((REPORTS, [(1, packed)] * reports))
        seen_by_other_work = await asyncio.create_task(other_work())
        await asyncio.wait_for(all_taken.wait(), 5)
        # It ran after the first turn's reports, not after all 200.
        assert seen_by_other_work <= 20, "the report task held the loop too long"
        assert calls.queued == 0


@pytest.mark.timeout(30)
async def test_an_answer_sent_at_once_takes_credit_and_never_overtakes_a_held_one() -> None:
    """``RelayedContext.answer_now`` (a new pace for a relayed agent): it
    goes onto the link at once, beside the handler's own answers, and takes
    one of the call's credit; with none left, or while an answer of the
    handler's waits for credit (it may be an older pace), it is not sent
    (``AgentHub.pace`` then queues it behind)."""
    contexts: list[Any] = []
    go = asyncio.Event()

    async def handler(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        contexts.append(context)
        await go.wait()
        for i in range(frames.WINDOW):
            yield b"a%d" % i
        async for _ in requests:
            pass

    async with _relayed_call(handler, running=True) as (calls, reader):
        for _ in range(100):
            if contexts:
                break
            await asyncio.sleep(0.01)
        (context,) = contexts
        assert context.answer_now(b"now")
        go.set()  # WINDOW answers: the credit left takes all but the last, which waits
        sent = await _frames(reader, frames.WINDOW)
        assert sent == [(frames.OUT, 1, b"now")] + [
            (frames.OUT, 1, b"a%d" % i) for i in range(frames.WINDOW - 1)
        ]
        assert not context.answer_now(b"late")  # no credit left
        calls.on_frame((frames.SENT, 1, 1))
        assert not context.answer_now(b"late")  # the held answer goes first
        assert await _frames(reader, 1) == [(frames.OUT, 1, b"a%d" % (frames.WINDOW - 1))]
        calls.on_frame((frames.SENT, 1, 1))
        assert context.answer_now(b"next")
        assert await _frames(reader, 1) == [(frames.OUT, 1, b"next")]
