"""One GET on a bare connection, its answer read by httptools (``http_get``).

Power sync's and the leak watcher's reads straight to a BMC go this way
(``RedfishHttp``); sushy-tools' emulator, FaultProxy's broken payloads and
the TLS tests read through it too (``test_power_poll.py``,
``test_broken_payloads.py``, ``test_redfish.py``). Here a scripted HTTP peer
on 127.0.0.1 gives the answers those cannot: each way a body can be framed,
redirects, interim answers, what is not HTTP, a peer that closes early or
never answers, and a pool closed during a read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc import BmcCredentials, PowerState, parse_bmc_url
from controller.bmc.http_get import AnswerTooLarge, ClosedEarly, Names, NotHttp, get
from controller.bmc.redfish_http import RedfishHttp
from controller.core.errors import BmcUnreachable, KilnError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

AUTH = {"Authorization": "Basic c2VjcmV0", "Accept": "application/json"}
Script = Callable[[bytes], bytes | None]  # the request's head -> what to send (None: nothing)


class Peer:
    """An HTTP peer that answers each request with the bytes ``script``
    gives for its head, then closes (or, for None, waits to be closed)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.asked = asyncio.Event()  # set once a request has come
        self.open = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head)
            self.asked.set()
            answer = self.script(head)
            if answer is None:
                await reader.read()  # until the client goes away
                return
            writer.write(answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()

    def url(self, path: str = "/redfish/v1/Systems/s1") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def peer(script: Script) -> AsyncIterator[Peer]:
    p = Peer(script)
    server = await asyncio.start_server(p._serve, "127.0.0.1", 0)
    p.port = server.sockets[0].getsockname()[1]
    try:
        yield p
    finally:
        server.close()
        await server.wait_closed()


def fixed(answer: bytes) -> Script:
    return lambda _head: answer


async def read(url: str, *, limit: int = 1000, timeout: float = 5.0) -> tuple[int, bytes]:
    return await get(url, AUTH, tls=None, timeout=timeout, connect_timeout=2.0, limit=limit)


async def test_a_content_length_answer_and_the_request_sent() -> None:
    async with peer(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")) as p:
        assert await read(p.url("/redfish/v1/Systems/s1?x=1")) == (200, b"hello")
        head = p.requests[0].decode()
        assert head.startswith("GET /redfish/v1/Systems/s1?x=1 HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{p.port}\r\n" in head
        assert "Authorization: Basic c2VjcmV0\r\n" in head
        assert "Connection: close\r\n" in head
        await asyncio.sleep(0.05)
        assert p.open == 0  # closed after the answer


async def test_a_chunked_answer_and_one_ended_by_closing() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    async with peer(fixed(chunked)) as p:
        assert await read(p.url()) == (200, b"abcde")
    async with peer(fixed(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")) as p:
        assert await read(p.url()) == (200, b"until the end")


async def test_an_interim_answer_is_passed_over() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno"
    async with peer(fixed(answer)) as p:
        assert await read(p.url()) == (404, b"no")


async def test_redirects_are_followed_and_credentials_stay_with_the_host() -> None:
    async with peer(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")) as elsewhere:

        def redirect(head: bytes) -> bytes:
            if head.startswith(b"GET /first "):
                return b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /second\r\n\r\n"
            where = elsewhere.url("/third").encode()
            return b"HTTP/1.1 301 Moved\r\nLocation: " + where + b"\r\nContent-Length: 0\r\n\r\n"

        async with peer(redirect) as p:
            assert await read(p.url("/first")) == (200, b"ok")
            assert [r.split(b" ")[1] for r in p.requests] == [b"/first", b"/second"]
            assert all(b"Authorization" in r for r in p.requests)  # the same host
            assert elsewhere.requests[0].startswith(b"GET /third ")
            assert b"Authorization" not in elsewhere.requests[0]  # another port


async def test_a_redirect_loop_ends() -> None:
    async with peer(fixed(b"HTTP/1.1 302 Found\r\nLocation: /again\r\n\r\n")) as p:
        with pytest.raises(NotHttp, match="more than 10 redirects"):
            await read(p.url())
        assert len(p.requests) == 11


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_over_the_limit_is_not_read_on(chunked: bool) -> None:
    body = b"x" * 5000
    if chunked:
        answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        answer += b"".join(b"%x\r\n%s\r\n" % (500, body[i : i + 500]) for i in range(0, 5000, 500))
        answer += b"0\r\n\r\n"
    else:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + body
    async with peer(fixed(answer)) as p:
        with pytest.raises(AnswerTooLarge) as info:
            await read(p.url(), limit=1000)
    assert info.value.declared is not chunked
    assert info.value.size == 5000 if not chunked else 1000 < info.value.size <= 5000


@pytest.mark.parametrize(
    ("answer", "error", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", NotHttp, "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", NotHttp, "not an HTTP answer"),
        (b"", ClosedEarly, "without response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort", ClosedEarly, "mid-answer"),
    ],
    ids=["not-http", "bad-length", "closed-at-once", "closed-mid-body"],
)
async def test_what_is_not_a_whole_answer_fails(
    answer: bytes, error: type[Exception], words: str
) -> None:
    async with peer(fixed(answer)) as p:
        with pytest.raises(error, match=words):
            await read(p.url())


async def test_a_peer_that_never_answers_times_out_and_is_left_closed() -> None:
    async with peer(lambda _head: None) as p:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await read(p.url(), timeout=0.5)
        assert time.monotonic() - started < 2.0
        for _ in range(50):
            if p.open == 0:
                break
            await asyncio.sleep(0.02)
        assert p.open == 0


async def test_closing_the_client_ends_a_read_without_cancelling_its_caller() -> None:
    async with peer(lambda _head: None) as p:
        http = RedfishHttp()
        reading = asyncio.create_task(
            http.get(
                p.url(),
                headers=AUTH,
                tls=False,
                proxy=None,
                timeout=20.0,
                connect_timeout=2.0,
                limit=1000,
            )
        )
        await asyncio.wait_for(p.asked.wait(), 5.0)
        await http.close()
        with pytest.raises(ConnectionAbortedError, match="closed during the read"):
            await asyncio.wait_for(reading, 2.0)
        assert not reading.cancelled()
        with pytest.raises(RuntimeError, match="closed"):
            await http.get(
                p.url(), headers=AUTH, tls=False, proxy=None, timeout=1, connect_timeout=1, limit=1
            )


async def test_through_the_driver_each_failure_is_a_kiln_error_without_the_password() -> None:
    """``power.poll`` on a peer that is not a Redfish service: a Kiln error
    naming the BMC, never the password, for each way the answer fails."""
    json_doc = b'{"@odata.id": "/redfish/v1/Systems/s1", "PowerState": "On"}'
    good = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(json_doc), json_doc)
    cases = [
        (good, None),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "BmcBadResponse"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "BmcError"),
        (b"", "BmcUnreachable"),
    ]
    for answer, kind in cases:
        async with peer(fixed(answer)) as p:
            url = f"redfish+http://127.0.0.1:{p.port}/redfish/v1/Systems/s1"
            async with make_pool(call_timeout=2.0) as pool:
                bmc = pool.get("n1", parse_bmc_url(url), BmcCredentials(USER, PASSWORD))
                if kind is None:
                    assert await bmc.power.poll() is PowerState.ON
                    continue
                with pytest.raises(KilnError) as info:
                    await bmc.power.poll()
                assert type(info.value).__name__ == kind, info.value
                assert f"127.0.0.1:{p.port}" in str(info.value)
                assert PASSWORD not in str(info.value)
                if kind == "BmcUnreachable":
                    assert isinstance(info.value, BmcUnreachable)
                    assert "closed connection without response" in str(info.value)


class CountedNames(Names):
    """The pool's name cache, counting the questions it puts to the resolver."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def _lookup(self, host: str) -> list[str]:
        self.lookups += 1
        return await super()._lookup(host)


async def test_host_names_are_resolved_once_and_again_after_a_failed_connection() -> None:
    names = CountedNames()
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def read_via(url: str) -> tuple[int, bytes]:
        return await get(
            url, AUTH, tls=None, timeout=5.0, connect_timeout=2.0, limit=100, names=names
        )

    async with peer(fixed(ok)) as p:
        # "localhost" may resolve to ::1 first: the peer listens on 127.0.0.1 only,
        # so the next address is tried.
        url = f"http://localhost:{p.port}/redfish/v1/Systems/s1"
        assert await read_via(url) == (200, b"ok")
        assert await read_via(url) == (200, b"ok")
        assert names.lookups == 1
        assert await read_via(p.url()) == (200, b"ok")  # an address is its own answer
        assert names.lookups == 1
        assert f"Host: localhost:{p.port}" in p.requests[0].decode()  # the name, not the address
    with pytest.raises(OSError):
        await read_via(url)  # the peer is gone: every address refuses
    assert names.lookups == 1
    with pytest.raises(OSError):
        await read_via(url)
    assert names.lookups == 2  # the name was forgotten after the failure
