"""A loopback HTTP/1.x proxy that injects faults, for resilience tests.

For each request it reads from a client it decides, with a seeded random
source: drop the connection (``drop_ratio``), answer ``500`` itself
(``error_ratio``), or wait ``delay_s`` and forward it to ``target`` over a
per-client upstream connection. It parses HTTP framing (Content-Length and
chunked bodies) so faults apply per request, also on keep-alive connections.
Plain HTTP only: put it in front of an emulator started without TLS.

``swallow`` models a BMC that accepts a command and never carries it out: a
request whose request line contains that text (``"POST "`` plus a path, say
``.../Actions/ComputerSystem.Reset``) is answered ``204 No Content`` by the
proxy and never forwarded -- every time, or the first ``swallow_limit``
times.

``payload_faults`` models a BMC that answers with a broken payload: a
request whose method and path match a ``PayloadFault`` is answered by the
proxy with that fault's body -- wrong types, missing fields, not JSON, not
UTF-8, deeply nested, or huge (streamed in 64 KiB pieces, so the proxy never
holds it; with a ``Content-Length`` or chunked) -- and never forwarded. The
first matching fault wins; the list may be changed between requests.

Counters (``requests``, ``dropped``, ``errors``, ``forwarded``,
``swallowed``, ``replaced``; ``replaced_bytes``: body bytes the proxy wrote
for replaced answers before the client took them or hung up) let tests check
that faults really happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from controller.sim.ports import free_port

_SWALLOWED = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
_ERROR_BODY = b'{"error": {"code": "Base.1.0.InternalError", "message": "injected fault"}}'
_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_ERROR_BODY)).encode() + b"\r\nConnection: close\r\n\r\n"
) + _ERROR_BODY


_PIECE = 64 * 1024


@dataclass(frozen=True)
class PayloadFault:
    """Answer matching requests with ``body`` instead of forwarding them.

    ``path`` is a regular expression searched in the request's path (so
    ``r"/Systems/node-00001$"`` or ``r"/Thermal$"``), ``method`` the request
    method it applies to. With ``size`` the body is ``body`` followed by
    filler bytes up to ``size`` bytes in all (a huge answer), written piece
    by piece. ``chunked`` sends it with ``Transfer-Encoding: chunked`` and no
    ``Content-Length``. ``limit``: answer only the first ``limit`` matches.
    ``delay``: seconds before the answer (a BMC slow on one document).
    """

    path: str
    body: bytes = b""
    status: int = 200
    content_type: str = "application/json"
    method: str = "GET"
    size: int | None = None
    chunked: bool = False
    limit: int | None = None
    delay: float = 0.0

    @classmethod
    def json(cls, path: str, document: Any, **options: Any) -> PayloadFault:
        """A well-formed JSON body (of whatever wrong shape ``document`` has)."""
        return cls(path, json.dumps(document).encode(), **options)

    @classmethod
    def nested(cls, path: str, depth: int, **options: Any) -> PayloadFault:
        """Valid JSON nested ``depth`` lists deep."""
        return cls(path, b"[" * depth + b"]" * depth, **options)

    @classmethod
    def huge(cls, path: str, size: int, *, chunked: bool = False, **options: Any) -> PayloadFault:
        """A ``size``-byte JSON object (one long string), streamed."""
        return cls(path, b'{"Padding": "', size=size, chunked=chunked, **options)

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and re.search(self.path, path) is not None

    def pieces(self) -> Iterator[bytes]:
        """The body in pieces of at most 64 KiB; a huge one never held whole."""
        if self.size is None:
            for start in range(0, len(self.body), _PIECE):
                yield self.body[start : start + _PIECE]
            return
        tail = b'"}'
        yield self.body
        left = self.size - len(self.body) - len(tail)
        filler = b"x" * _PIECE
        while left > 0:
            yield filler[: min(left, _PIECE)]
            left -= _PIECE
        yield tail

    @property
    def length(self) -> int:
        return len(self.body) if self.size is None else max(self.size, len(self.body) + 2)

    def head(self) -> bytes:
        status = HTTPStatus(self.status)
        lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {self.content_type}"]
        lines.append(
            "Transfer-Encoding: chunked" if self.chunked else f"Content-Length: {self.length}"
        )
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_message(reader: asyncio.StreamReader, *, head_only: bool = False) -> bytes:
    """One HTTP message (head + body); empty bytes at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise ConnectionError("truncated HTTP head") from e
        return b""
    if head_only:
        return head
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            chunk = await reader.readexactly(size + 2)
            body += size_line + chunk
            if size == 0:
                return head + body
    return head + (await reader.readexactly(length) if length else b"")


class FaultProxy:
    """Listens on 127.0.0.1:``port`` and forwards to ``target`` with faults."""

    def __init__(
        self,
        target: tuple[str, int],
        *,
        delay_s: float = 0.0,
        drop_ratio: float = 0.0,
        error_ratio: float = 0.0,
        seed: int = 0,
        swallow: str | None = None,
        swallow_limit: int | None = None,
        payload_faults: Sequence[PayloadFault] = (),
    ) -> None:
        if target[0] not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("FaultProxy only forwards to loopback targets")
        self.target = target
        self.delay_s = delay_s
        self.drop_ratio = drop_ratio
        self.error_ratio = error_ratio
        self.swallow = swallow
        self.swallow_limit = swallow_limit
        self.payload_faults: list[PayloadFault] = list(payload_faults)
        self._rng = random.Random(seed)
        self.port = 0
        self.requests = 0
        self.dropped = 0
        self.errors = 0
        self.forwarded = 0
        self.swallowed = 0
        self.replaced = 0
        self.replaced_bytes = 0
        self._fault_hits: dict[PayloadFault, int] = {}  # answers given, for ``limit``
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self) -> None:
        self.port = free_port()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _swallows(self, request: bytes) -> bool:
        if self.swallow is None:
            return False
        if self.swallow_limit is not None and self.swallowed >= self.swallow_limit:
            return False
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        return self.swallow in line

    def _payload_fault(self, request: bytes) -> PayloadFault | None:
        if not self.payload_faults:
            return None
        method, _, rest = request.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.rsplit(" ", 1)[0].split("?", 1)[0]
        for fault in self.payload_faults:
            if fault.limit is not None and self._fault_hits.get(fault, 0) >= fault.limit:
                continue
            if fault.matches(method, path):
                self._fault_hits[fault] = self._fault_hits.get(fault, 0) + 1
                return fault
        return None

    async def _replace(self, writer: asyncio.StreamWriter, fault: PayloadFault) -> None:
        """Write ``fault``'s answer; the client may hang up at any point."""
        self.replaced += 1
        if fault.delay:
            await asyncio.sleep(fault.delay)
        writer.write(fault.head())
        for piece in fault.pieces():
            if not piece:
                continue
            if fault.chunked:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                writer.write(piece)
            await writer.drain()
            self.replaced_bytes += len(piece)
        if fault.chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                request = await _read_message(reader)
                if not request:
                    return
                self.requests += 1
                if self._swallows(request):
                    self.swallowed += 1
                    writer.write(_SWALLOWED)
                    await writer.drain()
                    continue
                fault = self._payload_fault(request)
                if fault is not None:
                    await self._replace(writer, fault)
                    return  # the answer said "Connection: close"
                roll = self._rng.random()
                if roll < self.drop_ratio:
                    self.dropped += 1
                    return  # close without an answer
                if roll < self.drop_ratio + self.error_ratio:
                    self.errors += 1
                    writer.write(_ERROR)
                    await writer.drain()
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.target)
                up_reader, up_writer = upstream
                up_writer.write(request)
                await up_writer.drain()
                is_head = request.startswith(b"HEAD ")
                response = await _read_message(up_reader, head_only=is_head)
                if not response:
                    return
                self.forwarded += 1
                writer.write(response)
                await writer.drain()
                if b"\r\nconnection: close" in response.split(b"\r\n\r\n", 1)[0].lower():
                    up_writer.close()
                    upstream = None
                    if response.startswith(b"HTTP/1.0"):
                        return
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            return
        except asyncio.CancelledError:
            # Only stop() cancels these; ending normally keeps asyncio's
            # stream callback from logging the cancellation as an error.
            return
        finally:
            if upstream is not None:
                upstream[1].close()
            writer.close()
            if task is not None:
                self._tasks.discard(task)
