"""One HTTP/1.1 GET on a connection of its own, its answer read by httptools.

The BMC reads made over and over (power sync's power reading, the leak
watcher's) each open a connection, send one GET and read one answer: a BMC
is read again a pass later, past any keep-alive. aiohttp's client costs
about 0.27 ms of CPU for that on this code's 2-core machine, most of it the
machinery of a general client (a connector and its pool, happy eyeballs,
request and response objects, a stream reader); a protocol that writes the
request and hands the answer to httptools' C parser (llhttp, the parser
uvicorn serves with) about 0.15 ms, and a bare socket that parses nothing
0.10 ms (``bench/bmc_read_cost.py``).
``RedfishHttp`` sends the reads that go straight to a BMC here; a read
through a proxy stays on aiohttp.

What the caller gets: the status and the body (a ``Content-Length``,
chunked or closing body), at most ``limit`` bytes of it (``AnswerTooLarge``
otherwise, the rest never read). Failures are the standard library's:
``TimeoutError`` (the connect or the whole read over its time),
``ssl.SSLError`` (a TLS handshake refused or a certificate not trusted),
``OSError`` (refused, unreachable, reset), ``ClosedEarly`` (a
``ConnectionError``: the BMC closed before its answer was whole) and
``NotHttp`` (what came back is not an HTTP answer).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from typing import NamedTuple, cast
from urllib.parse import urljoin, urlsplit

import httptools

MAX_REDIRECTS = 10  # as aiohttp's default (requests': 30)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Answer(NamedTuple):
    status: int
    body: bytes
    location: str | None  # a redirect's Location header


class AnswerTooLarge(Exception):
    """An answer over the cap; ``declared`` when its Content-Length said so."""

    def __init__(self, size: int, declared: bool) -> None:
        super().__init__(size)
        self.size = size
        self.declared = declared


class ClosedEarly(ConnectionError):
    """The BMC closed the connection before its answer was whole."""


class NotHttp(Exception):
    """What the BMC sent back is not an HTTP/1.x answer."""


@dataclass(frozen=True, slots=True)
class Address:
    """Where a URL's GET goes: the host and port to connect to, whether
    over TLS, and the request's first lines (request line and Host)."""

    host: str
    port: int
    tls: bool
    head: str

    @classmethod
    def of(cls, url: str) -> Address:
        """Raises:
        ValueError: not an http or https URL with a host."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {url!r}")
        host = parts.hostname
        port = parts.port or (443 if scheme == "https" else 80)
        name = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            name = f"{name}:{port}"
        target = parts.path or "/"
        if parts.query:
            target = f"{target}?{parts.query}"
        return cls(host, port, scheme == "https", f"GET {target} HTTP/1.1\r\nHost: {name}\r\n")

    def request(self, headers: dict[str, str]) -> bytes:
        """The whole request, asking the BMC to close the connection after."""
        lines = [self.head]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append("Connection: close\r\n\r\n")
        return "".join(lines).encode("latin-1")


class Names:
    """Host names resolved once for ``ttl`` seconds (as aiohttp's connector
    kept them: 300 s), so that a fleet whose BMC URLs name hosts does not
    ask its resolver again for every read. An address literal is its own
    answer; a name whose every address refused a connection is forgotten."""

    def __init__(self, ttl: float = 300.0) -> None:
        self._ttl = ttl
        self._known: dict[str, tuple[float, list[str]]] = {}

    async def resolve(self, host: str) -> list[str]:
        """The addresses to try for ``host``, in the resolver's order.

        Raises:
            OSError: the name does not resolve (socket.gaierror).
        """
        known = self._known.get(host)
        now = time.monotonic()
        if known is not None and known[0] > now:
            return known[1]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            self._known[host] = (float("inf"), [host])
            return [host]
        addresses = await self._lookup(host)
        if not addresses:
            raise OSError(f"{host} resolves to no address")
        self._known[host] = (now + self._ttl, addresses)
        return addresses

    async def _lookup(self, host: str) -> list[str]:
        """Ask the resolver (the loop's getaddrinfo, in its thread pool)."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    def forget(self, host: str) -> None:
        self._known.pop(host, None)


class _Answer(asyncio.Protocol):
    """Sends the request once connected and reads one answer into ``done``.

    httptools calls the ``on_*`` methods from ``feed_data``; they record
    and never raise (an exception there would come back wrapped)."""

    def __init__(self, request: bytes, limit: int, done: asyncio.Future[Answer]):
        self._request = request
        self._limit = limit
        self._done = done
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._declared: int | None = None
        self._chunked = False
        self._location: str | None = None
        self._status = 0
        self._headers_done = False
        self._received = False
        self._error: BaseException | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self._done.done():
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._error = self._error or NotHttp(f"not an HTTP answer ({e})")
        if self._error is not None:
            self._finish(error=self._error)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost decides

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done.done():
            return
        if self._headers_done and self._declared is None and not self._chunked:
            self._finish()  # a body that ends when the connection does
        elif exc is not None:
            self._finish(error=exc)
        elif self._received:
            self._finish(error=ClosedEarly("the BMC closed the connection mid-answer"))
        else:
            self._finish(error=ClosedEarly("Remote end closed connection without response"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-length":
            try:
                self._declared = int(value)
            except ValueError:
                self._error = NotHttp("a Content-Length that is not a number")
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            self._chunked = True
        elif key == b"location":
            self._location = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._status = self._parser.get_status_code()
        if self._declared is not None and self._declared > self._limit:
            self._error = AnswerTooLarge(self._declared, declared=True)

    def on_body(self, body: bytes) -> None:
        if self._error is not None:
            return
        self._size += len(body)
        if self._size > self._limit:
            self._error = AnswerTooLarge(self._size, declared=False)
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._error is None and 100 <= self._status < 200:
            self._reset()  # an interim answer ("100 Continue"): the real one follows
            return
        if self._error is None:
            self._finish()

    def _reset(self) -> None:
        self._chunks.clear()
        self._size = 0
        self._declared = None
        self._chunked = False
        self._headers_done = False

    def _finish(self, error: BaseException | None = None) -> None:
        if not self._done.done():
            if error is None:
                self._done.set_result(Answer(self._status, b"".join(self._chunks), self._location))
            else:
                self._done.set_exception(error)
        if self._transport is not None:
            self._transport.close()


async def get(
    url: str,
    headers: dict[str, str],
    *,
    tls: ssl.SSLContext | None,
    timeout: float,
    connect_timeout: float,
    limit: int,
    names: Names | None = None,
) -> tuple[int, bytes]:
    """GET ``url`` on a new connection: the status and at most ``limit``
    bytes of the body. ``tls`` is the context for an https URL. Redirects
    are followed as requests and aiohttp follow them (at most
    ``MAX_REDIRECTS``; the Authorization header dropped when one leads to
    another host, port or scheme), each on a new connection, all within
    ``timeout``. Every connection is closed on every way out. ``names``
    keeps host names resolved (without it, each connection resolves its
    host anew).

    Raises:
        AnswerTooLarge, ClosedEarly, NotHttp, TimeoutError, ssl.SSLError,
        OSError: as the module says. ValueError: not an http(s) URL.
    """
    address = Address.of(url)
    async with asyncio.timeout(timeout):
        for _ in range(MAX_REDIRECTS + 1):
            answer = await _get_once(address, headers, tls, connect_timeout, limit, names)
            if answer.status not in _REDIRECTS or not answer.location:
                return answer.status, answer.body
            url = urljoin(url, answer.location)
            moved = Address.of(url)
            if (moved.host, moved.port, moved.tls) != (address.host, address.port, address.tls):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            address = moved
    raise NotHttp(f"more than {MAX_REDIRECTS} redirects")


async def _get_once(
    address: Address,
    headers: dict[str, str],
    tls: ssl.SSLContext | None,
    connect_timeout: float,
    limit: int,
    names: Names | None,
) -> Answer:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Answer] = loop.create_future()
    request = address.request(headers)
    context = tls if address.tls else None
    if address.tls and context is None:
        raise ValueError("an https address needs a TLS context")
    async with asyncio.timeout(connect_timeout):
        hosts = [address.host] if names is None else await names.resolve(address.host)
        for i, host in enumerate(hosts):
            try:
                transport, _ = await loop.create_connection(
                    lambda: _Answer(request, limit, done),
                    host,
                    address.port,
                    ssl=context,
                    server_hostname=address.host if context is not None else None,
                )
                break
            except OSError:
                if i + 1 < len(hosts):
                    continue  # the host's next address
                if names is not None:
                    names.forget(address.host)  # resolved anew next time
                raise
    try:
        return await done
    finally:
        transport.close()
