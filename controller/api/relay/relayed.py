"""The controller's side of one relay worker's link: each forwarded call
runs through the same handler a direct call gets (the request limits,
authentication and audit, then ``AgentService`` or ``FleetService``), with
a ``RelayedContext`` standing in for gRPC's servicer context."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from controller.api.relay import frames
from controller.api.relay.frames import FrameWriter

log = logging.getLogger(__name__)

_END = object()  # the agent sent its last message, or its call is gone
# Messages forwarded but not yet taken up by their calls' handlers: above
# HIGH the link is not read until they are down to LOW, so a controller that
# falls behind holds the workers back (and they their agents, through gRPC's
# flow control) rather than queueing without bound.
HIGH = 20_000
LOW = 5_000
HIGH_BYTES = 256 * 1024 * 1024  # or their bytes (a message is at most 1 MiB)
LOW_BYTES = 64 * 1024 * 1024
# How long the link's report task hands on reports before it lets the event
# loop run other work: a worker's frame can hold thousands, and a report
# rarely waits. Every other task's step waits for this turn (an API call,
# a few of them, each awaiting the store): 64 reports a turn was 8 ms of a
# fleet's reports at its real pace, 2 ms is a yield every 15 or so.
PUSHED_TURN_S = 0.002


@dataclass(frozen=True)
class CallDetails:
    """``grpc.HandlerCallDetails`` of a forwarded call, for the interceptors."""

    method: str
    invocation_metadata: tuple[tuple[str, Any], ...]


HandlerFor = Callable[[CallDetails], Awaitable[grpc.RpcMethodHandler | None]]
# Takes one digested report of a call (its packed bytes, relay/digest.py).
ReportSink = Callable[[bytes], Awaitable[None]]


class RelayedContext:
    """What Kiln's interceptors and servicers ask of a servicer context, for
    a call a relay worker forwarded. ``abort`` raises gRPC's own
    ``AbortError``, and the status is sent to the worker when the handler
    ends."""

    def __init__(
        self,
        metadata: tuple[tuple[str, Any], ...],
        auth: Mapping[str, Iterable[bytes]],
        peer: str,
        timeout: float | None = None,
    ) -> None:
        self._metadata = metadata
        self._auth = auth
        self._peer = peer
        # The call's deadline, as the worker saw it when the call opened.
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._done: list[Callable[[Any], None]] = []
        self.report_sink: ReportSink | None = None
        # ``answer_now(raw)``, set by the link's side (``RelayedCalls``): send
        # one answer of the call (its serialized bytes) at once, beside its
        # handler's stream of answers, in no order with them; True when
        # sent, False when it cannot be now (the worker's client reads
        # slowly, or the call is over).
        self.answer_now: Callable[[bytes], bool] = lambda raw: False

    def take_reports(self, sink: ReportSink) -> None:
        """From now on the call's digested reports go to ``sink``, in order
        with its other messages, rather than through its request stream.

        A stream's handler waits about ten seconds for each next report: each
        report handed through the stream left the objects of that wait (its
        async generators' steps, a queue read and its future) alive until
        the next one, 25,000 streams' worth at fleet size, walked by every
        young and middle collection. Handed to ``sink`` by the link's one
        report task, a report wakes no stream.
        """
        self.report_sink = sink

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        return self._auth

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details
        raise grpc.aio.AbortError()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._done.append(callback)

    def finished(self) -> None:
        callbacks, self._done = self._done, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a relayed call's done callback failed")


class _Call:
    __slots__ = ("context", "credit", "handing", "holding", "more", "pushed", "requests", "task")

    def __init__(self, context: RelayedContext) -> None:
        self.context = context
        self.requests: asyncio.Queue[Any] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.credit = frames.WINDOW  # messages it may still send before a SENT
        self.more = asyncio.Event()
        self.pushed = 0  # its messages waiting in the link's report task's queue
        self.handing = False  # its request stream has handed out a message not yet done with
        self.holding = False  # its handler's answer waits for credit

    def sink_now(self) -> ReportSink | None:
        """Where a report of the call may go at once (None: through its
        stream, after what the stream holds or is handing out)."""
        if self.handing or not self.requests.empty():
            return None
        return self.context.report_sink


class RelayedCalls:
    """Runs the calls one worker forwards, until its link ends."""

    def __init__(self, link: FrameWriter, handler_for: HandlerFor) -> None:
        self._link = link
        self._handler_for = handler_for
        self._calls: dict[int, _Call] = {}
        self.queued = 0  # messages forwarded, not yet taken up
        self.queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        # Reports for calls that take them (RelayedContext.take_reports), and
        # whatever those calls are sent after them, in arrival order.
        self._pushed: deque[tuple[int, _Call, Any, bool]] = deque()
        self._pushed_ready = asyncio.Event()
        self._pusher: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._calls)

    async def room(self) -> None:
        """Wait while too many forwarded messages are waiting for their calls."""
        if not self._room.is_set():
            await self._room.wait()

    def _taken(self, count: int, size: int) -> None:
        self.queued -= count
        self.queued_bytes -= size
        if self.queued <= LOW and self.queued_bytes <= LOW_BYTES and not self._room.is_set():
            self._room.set()

    def on_frame(self, frame: tuple[Any, ...]) -> None:
        kind = frame[0]
        if kind == frames.MESSAGES or kind == frames.REPORTS:
            calls = self._calls
            digested = kind == frames.REPORTS
            pushed = self._pushed
            for ident, raw in frame[1]:
                call = calls.get(ident)
                if call is None:
                    continue
                self.queued += 1
                self.queued_bytes += len(raw)
                if call.pushed or (digested and call.sink_now() is not None):
                    # To its sink; and all it is sent next, until that is done.
                    call.pushed += 1
                    pushed.append((ident, call, raw, digested))
                else:
                    # A digested report is queued as a 1-tuple: raw bytes are a message.
                    call.requests.put_nowait((raw,) if digested else raw)
            if pushed:
                self._pushed_ready.set()
                if self._pusher is None:
                    self._pusher = asyncio.create_task(
                        self._hand_pushed(), name="kiln-relayed-reports"
                    )
            if self.queued > HIGH or self.queued_bytes > HIGH_BYTES:
                self._room.clear()
        elif kind == frames.OPEN:
            _, ident, method, metadata, auth, peer, timeout, *request = frame
            context = RelayedContext(tuple(metadata), auth, peer, timeout)
            call = self._calls[ident] = _Call(context)
            context.answer_now = partial(self._answer_now, ident, call)
            if request:  # a call of one request message: all its requests
                call.requests.put_nowait(request[0])
                call.requests.put_nowait(_END)
                self.queued += 1
                self.queued_bytes += len(request[0])
            call.task = asyncio.create_task(
                self._run(ident, call, CallDetails(method, context.invocation_metadata()), context),
                name=f"kiln-relayed-{ident}",
            )
        elif kind == frames.HALF_CLOSE:
            call = self._calls.get(frame[1])
            if call is not None:
                if call.pushed:  # after the messages still waiting for the report task
                    call.pushed += 1
                    self._pushed.append((frame[1], call, _END, False))
                    self._pushed_ready.set()
                else:
                    call.requests.put_nowait(_END)
        elif kind == frames.GONE:
            self._gone(frame[1])
        elif kind == frames.SENT:
            call = self._calls.get(frame[1])
            if call is not None:
                call.credit += frame[2]
                call.more.set()

    def _answer_now(self, ident: int, call: _Call, raw: bytes) -> bool:
        # Not ahead of an answer that waits for credit: that may be an older pace.
        if self._calls.get(ident) is not call or call.credit <= 0 or call.holding:
            return False
        call.credit -= 1
        self._link.send((frames.OUT, ident, raw))
        return True

    def _gone(self, ident: int) -> None:
        call = self._calls.pop(ident, None)
        if call is not None and call.task is not None:
            call.task.cancel()  # as gRPC cancels a handler whose call is gone

    async def end_all(self) -> None:
        """The link ended: every call is gone (the worker's agents reconnect)."""
        tasks = [c.task for c in self._calls.values() if c.task is not None]
        for ident in list(self._calls):
            self._gone(ident)
        if self._pusher is not None:
            self._pusher.cancel()
            tasks.append(self._pusher)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _hand_pushed(self) -> None:
        """Hand each pushed report to its call's sink, and each message sent
        after one to its call's stream, in the order they came."""
        pushed, ready, calls = self._pushed, self._pushed_ready, self._calls
        while True:
            await ready.wait()
            ready.clear()
            turn_ends = time.perf_counter() + PUSHED_TURN_S
            while pushed:
                if time.perf_counter() >= turn_ends:
                    await asyncio.sleep(0)  # the loop's other work between turns
                    turn_ends = time.perf_counter() + PUSHED_TURN_S
                ident, call, raw, report = pushed.popleft()
                call.pushed -= 1
                if raw is _END:
                    call.requests.put_nowait(_END)
                    continue
                if calls.get(ident) is not call:  # the call is over
                    self._taken(1, len(raw))
                    continue
                sink = call.sink_now() if report else None
                if sink is None:
                    # The stream takes it, after what it was handed before
                    # (and counts it taken).
                    call.requests.put_nowait((raw,) if report else raw)
                    continue
                self._taken(1, len(raw))
                try:
                    await sink(raw)
                except Exception:  # a sink ends its own call on a failure of its own
                    log.exception("a relayed report's handler failed")

    async def _run(
        self, ident: int, call: _Call, details: CallDetails, context: RelayedContext
    ) -> None:
        code, details_out = grpc.StatusCode.OK, ""
        gone = False
        try:
            handler = await self._handler_for(details)
            if handler is None:
                code, details_out = grpc.StatusCode.UNIMPLEMENTED, "not served"
                return
            await self._serve(ident, call, handler, context)
            code, details_out = context.code() or grpc.StatusCode.OK, context.details()
        except grpc.aio.AbortError:
            code, details_out = context.code() or grpc.StatusCode.UNKNOWN, context.details()
        except asyncio.CancelledError:
            gone = True
        except Exception:
            log.exception("a relayed call to %s failed", details.method)
            code, details_out = grpc.StatusCode.INTERNAL, "internal error in the relayed call"
        finally:
            context.finished()
            if self._calls.get(ident) is call:
                del self._calls[ident]
            left = size = 0
            while not call.requests.empty():
                raw = call.requests.get_nowait()
                if raw is not _END:
                    left, size = left + 1, size + _size(raw)
            self._taken(left, size)
            if not gone:
                self._link.send((frames.END, ident, code.value[0], str(details_out or "")))

    async def _serve(
        self, ident: int, call: _Call, handler: grpc.RpcMethodHandler, context: RelayedContext
    ) -> None:
        """Run the handler of whichever shape on the call's messages, and
        send its answers."""
        deserialize = handler.request_deserializer
        serialize = handler.response_serializer
        link = self._link

        def out(response: Any) -> None:
            link.send((frames.OUT, ident, serialize(response) if serialize else response))

        request: Any
        if handler.request_streaming:
            request = self._requests(call, deserialize)
        else:
            raw = await call.requests.get()
            if raw is _END:
                await context.abort(grpc.StatusCode.INTERNAL, "the call sent no request")
            self._taken(1, len(raw))
            request = deserialize(raw) if deserialize is not None else raw
        if not handler.response_streaming:
            unary = handler.stream_unary if handler.request_streaming else handler.unary_unary
            out(await unary(request, context))
            return
        streaming = handler.stream_stream if handler.request_streaming else handler.unary_stream
        # An async generator: the request limits serve every stream as one.
        responses = streaming(request, context)
        try:
            async for response in responses:
                while call.credit <= 0:  # the worker's client reads slowly: wait
                    call.holding = True
                    call.more.clear()
                    await call.more.wait()
                call.holding = False
                call.credit -= 1
                out(response)
        finally:
            with contextlib.suppress(Exception):
                await responses.aclose()

    async def _requests(
        self, call: _Call, deserialize: Callable[[bytes], Any] | None
    ) -> AsyncIterator[Any]:
        queue = call.requests
        while True:
            raw = await queue.get()
            if raw is _END:
                return
            call.handing = True  # until the handler asks for the next
            if raw.__class__ is tuple:  # a report the worker digested: its packed bytes
                raw = raw[0]  # the tuple is not kept while the stream waits for its next
                self._taken(1, len(raw))
                yield raw
            else:
                self._taken(1, len(raw))
                yield deserialize(raw) if deserialize is not None else raw
            call.handing = False


def _size(item: bytes | tuple[bytes]) -> int:
    """The bytes a forwarded message or a digested report counts for."""
    return len(item[0]) if isinstance(item, tuple) else len(item)
