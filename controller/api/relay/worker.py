"""A relay worker: a process that serves gRPC connections on the relay
port (``--agent-listen``) and forwards their calls to the controller: the
agents' streams, and any client's calls to ``FleetService``.

It decides nothing and stores nothing: every call's messages go to the
controller as they arrive (``frames.MESSAGES``; an agent's health report
parsed, checked and packed, ``frames.REPORTS``: ``digest.py``), and what
the controller answers goes back to the agent. It reads its TLS files itself (and again
on SIGHUP, as the controller does) and binds the port with
``SO_REUSEPORT``, so that several workers share it and the kernel spreads
the connections over them. The agents' streams go on its link to the
controller, every other call on a second one (``--api-link-fd``), so that a
call to ``FleetService`` never queues behind reports. It exits when either
link ends.

    python -m controller.api.relay.worker --listen HOST:PORT --link-fd FD
        [--api-link-fd FD] [--tls-cert F --tls-key F [--tls-client-ca F]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import uvloop

from controller import heap
from controller.api.keepalive import DEFAULT_KEEPALIVE_S, keepalive_options
from controller.api.limits import MAX_RECEIVE_BYTES
from controller.api.relay import frames
from controller.api.relay.digest import CONNECT, ReportDigest
from controller.api.relay.frames import FrameWriter
from controller.api.relay.methods import FORWARDED, Shape
from controller.link import open_link

log = logging.getLogger("kiln.relay")

STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class _Call:
    __slots__ = ("ended", "link", "outgoing")

    def __init__(self, link: FrameWriter) -> None:
        self.link = link  # the link its frames go on
        # raw messages to send, then (code, details) to end with
        self.outgoing: asyncio.Queue[bytes | tuple[int, str]] = asyncio.Queue()
        self.ended = False  # the controller ended it (it needs no GONE)


class Relay(grpc.GenericRpcHandler):
    """Every method of Kiln's services, forwarded; answers from the controller.

    The agents' streams (``AgentService.Connect``) go on ``link``, every
    other call on ``api_link`` (default: the same): a call to
    ``FleetService`` then never waits behind the reports queued before it
    while the controller is behind (frames of one link go in order)."""

    def __init__(
        self, link: FrameWriter, *, certificates: bool, api_link: FrameWriter | None = None
    ) -> None:
        self._link = link
        self._api_link = api_link or link
        self._certificates = certificates  # the port asks for client certificates
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self._digest = ReportDigest()
        self._handlers = {
            method: self._handler(method, shape) for method, shape in FORWARDED.items()
        }

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        # None: UNIMPLEMENTED, the workers serve Kiln's services only.
        return self._handlers.get(handler_call_details.method)

    def _handler(self, method: str, shape: Shape) -> grpc.RpcMethodHandler:
        if shape.request_streaming and shape.response_streaming:
            return grpc.stream_stream_rpc_method_handler(partial(self._stream_stream, method))
        if shape.request_streaming:
            return grpc.stream_unary_rpc_method_handler(partial(self._stream_unary, method))
        if shape.response_streaming:
            return grpc.unary_stream_rpc_method_handler(partial(self._unary_stream, method))
        return grpc.unary_unary_rpc_method_handler(partial(self._unary_unary, method))

    def answer(self, frame: tuple[Any, ...]) -> None:
        """A frame from the controller for one of the calls."""
        call = self._calls.get(frame[1])
        if call is None:
            return  # ended meanwhile
        if frame[0] == frames.OUT:
            call.outgoing.put_nowait(frame[2])
        elif frame[0] == frames.END:
            call.ended = True
            call.outgoing.put_nowait((frame[2], frame[3]))

    def end_all(self) -> None:
        for call in self._calls.values():
            call.outgoing.put_nowait(
                (grpc.StatusCode.UNAVAILABLE.value[0], "the controller is not reachable")
            )

    # -- one call: opened, its messages forwarded, the controller's answers sent

    def _open(
        self, method: str, context: grpc.aio.ServicerContext, request: bytes | None = None
    ) -> tuple[int, _Call]:
        """Tell the controller of a new call; a call of one request message
        sends it in the same frame (its whole request stream)."""
        ident = next(self._ids)
        call = self._calls[ident] = _Call(self._link if method == CONNECT else self._api_link)
        auth: dict[str, list[bytes]] = {}
        if self._certificates:  # the verified certificate and the names gRPC read from it
            for key, values in context.auth_context().items():
                auth[str(key)] = [bytes(v) for v in values]
        metadata = tuple((m.key, m.value) for m in context.invocation_metadata() or ())
        opened = (frames.OPEN, ident, method, metadata, auth, context.peer())
        timeout = context.time_remaining()
        call.link.send((*opened, timeout) if request is None else (*opened, timeout, request))
        return ident, call

    def _close(self, ident: int) -> None:
        call = self._calls.pop(ident)
        if not call.ended:
            call.link.send((frames.GONE, ident))

    async def _answers(
        self, ident: int, call: _Call, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """The controller's messages for the call, until it ends it (a
        status other than OK aborts the call with it)."""
        handed = 0
        while True:
            item = await call.outgoing.get()
            if isinstance(item, bytes):
                yield item  # returns once gRPC has taken it
                handed += 1
                if handed >= frames.WINDOW // 2:
                    call.link.send((frames.SENT, ident, handed))
                    handed = 0
                continue
            code, details = item
            if code != 0:
                status = STATUS_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
                await context.abort(status, details)
            return

    async def _last(self, ident: int, call: _Call, context: grpc.aio.ServicerContext) -> bytes:
        """A unary answer: the controller's one message."""
        response = None
        async for raw in self._answers(ident, call, context):
            response = raw
        if response is None:
            await context.abort(grpc.StatusCode.INTERNAL, "the controller sent no answer")
        return response  # type: ignore[return-value]

    async def _unary_unary(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        ident, call = self._open(method, context, request)
        try:
            return await self._last(ident, call, context)
        finally:
            self._close(ident)

    async def _unary_stream(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        ident, call = self._open(method, context, request)
        try:
            async for raw in self._answers(ident, call, context):
                yield raw
        finally:
            self._close(ident)

    async def _stream_unary(
        self, method: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        ident, call = self._open(method, context)
        reader = asyncio.create_task(self._forward(ident, call.link, requests))
        try:
            return await self._last(ident, call, context)
        finally:
            reader.cancel()
            self._close(ident)

    async def _stream_stream(
        self, method: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        ident, call = self._open(method, context)
        digest = self._digest.packed if method == CONNECT else None
        reader = asyncio.create_task(self._forward(ident, call.link, requests, digest))
        try:
            async for raw in self._answers(ident, call, context):
                yield raw
        finally:
            reader.cancel()
            self._close(ident)

    async def _forward(
        self,
        ident: int,
        link: FrameWriter,
        requests: AsyncIterator[bytes],
        digest: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        """Send the call's messages on ``link``; with ``digest``, each one it
        packs goes as a report instead."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for raw in requests:
                packed = None if digest is None else digest(raw)
                if packed is None:
                    link.message(ident, raw)
                else:
                    link.report(ident, packed)
                await link.room()
            link.send((frames.HALF_CLOSE, ident))


async def serve(args: argparse.Namespace) -> int:
    reader, writer = await open_link(args.link_fd)
    link = FrameWriter(writer)
    sending = [asyncio.create_task(link.run())]
    answers = [reader]
    writers = [writer]
    api_link = None
    if args.api_link_fd is not None:
        api_reader, api_writer = await open_link(args.api_link_fd)
        api_link = FrameWriter(api_writer)
        sending.append(asyncio.create_task(api_link.run()))
        answers.append(api_reader)
        writers.append(api_writer)
    tls = None
    if args.tls_cert is not None:
        from controller.tls import ReloadableTls  # only with TLS

        tls = ReloadableTls.from_options(args.tls_cert, args.tls_key, args.tls_client_ca)
    relay = Relay(link, certificates=args.tls_client_ca is not None, api_link=api_link)
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),  # the workers share the port
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            *keepalive_options(args.keepalive),
        ]
    )
    server.add_generic_rpc_handlers((relay,))
    try:
        if tls is None:
            bound = server.add_insecure_port(args.listen)
        else:
            bound = server.add_secure_port(args.listen, tls.credentials())
    except RuntimeError:
        bound = 0
    if bound == 0:
        link.send((frames.FAILED, f"cannot listen on {args.listen}"))
        await asyncio.sleep(0.2)  # the writer task sends it
        for each in writers:
            each.close()
        return 1
    await server.start()
    # A worker's heap is its streams' waiting reads (about 20 objects each,
    # 25,000 streams at fleet size): with CPython's collector settings each
    # whole-heap collection walked them all (about a second at 25,000).
    # Set as the controller's; what the streams make later is frozen after a
    # long whole-heap collection.
    pauses = heap.settle_worker("the relay worker")
    loop = asyncio.get_running_loop()
    if tls is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: _reload(tls))

    def close_links() -> None:
        for each in writers:
            each.close()

    loop.add_signal_handler(signal.SIGTERM, close_links)
    link.send((frames.READY, bound))
    reading = [asyncio.create_task(_answer(each, relay)) for each in answers]
    try:
        # Until a link ends: the worker stops at the end of either.
        await asyncio.wait(reading, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pauses.stop()
        relay.end_all()
        await server.stop(1.0)
        for task in (*reading, *sending):
            task.cancel()
    return 0


async def _answer(reader: asyncio.StreamReader, relay: Relay) -> None:
    """Hand the controller's frames on one link to their calls, until it ends."""
    try:
        while True:
            frame = await frames.read_frame(reader)
            if frame is None:
                return
            relay.answer(frame)
    except frames.FrameError:
        log.exception("relay worker: the link to the controller failed")
    except ConnectionError as e:
        # The controller closed its end with frames of this worker's still to
        # send (it stops: every busy worker saw this; or it died, which its
        # own log says): the worker stops as at the link's end.
        log.info("relay worker: the controller closed the link (%s); stopping", e)


def _reload(tls: Any) -> None:
    try:
        tls.reload()
    except Exception as e:  # TlsConfigError: the current files stay in use
        log.warning("relay worker: TLS not reloaded, the current certificate stays: %s", e)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--api-link-fd", type=int, help="a link for calls other than Connect")
    parser.add_argument("--keepalive", type=float, default=DEFAULT_KEEPALIVE_S)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--tls-client-ca", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller's Ctrl-C is for it to handle
    # uvloop (libuv), as the BMC readers': gRPC's streams cost a tenth less
    # CPU a message there (a bare grpc.aio servicer reading 2,500 streams,
    # 155 us a report against 170 on asyncio's own loop).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
