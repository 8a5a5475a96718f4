"""Redfish reads on the event loop: a BMC pool's HTTP client.

sushy is blocking (requests), so the pool runs it in worker threads. For
the reads made of every BMC over and over, the periodic power reading
(``PowerControl.poll``: power sync, through ``PoolGateway.poll_power``)
and the leak watcher's (``LeakDetectionReader.poll``), that costs about
1 ms of CPU a GET on this code's 2-core machine, half of it handing the
call to a thread and back and the threads contending for the
interpreter; the same GET on an asyncio HTTP client costs about 0.2 ms
(``bench/bmc_pass_spread.py``), and a GET of its own on a bare
connection, its answer read by httptools (``http_get``), about 0.15 ms
(``bench/bmc_read_cost.py``). ``RedfishDriver.power_state_async`` and
``leak_detectors_async`` send them here; everything else, and every
change, stays on sushy. A read straight to its BMC goes through
``http_get``; one through a proxy (the environment's) through the pool's
aiohttp session, made on its first such read.

What a read here shares with the driver's sushy session: the URL, Basic
auth, the environment's proxy and CA bundle (read once per BMC,
``redfish._environment``), the cap on an answer's size
(``MAX_RESPONSE_BYTES``, a ``Content-Length`` over it refused unread, a
longer body dropped as it passes it) and the checks on its JSON. Errors are
raised as ``http_get``'s or aiohttp's own; the driver turns them into Kiln
errors.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from controller.bmc import http_get
from controller.bmc.http_get import AnswerTooLarge

__all__ = ["AnswerTooLarge", "RedfishHttp"]

_READ_CHUNK = 64 * 1024


class RedfishHttp:
    """The pool's HTTP client: reads straight to a BMC through ``http_get``,
    reads through a proxy on an aiohttp session made on the first such read
    in the running event loop (a pool serves one loop); closed with the
    pool, which ends the reads still under way."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}
        # The contexts for reads straight to a BMC (``http_get``) when
        # ``verify`` is True (the system's CAs) or False (nothing checked).
        self._plain_contexts: dict[bool, ssl.SSLContext] = {}
        self._names = http_get.Names()  # the BMCs' host names, resolved for a while
        # The tasks in a read through ``http_get`` now, and those of them
        # that closing the pool cancelled.
        self._reading: set[asyncio.Task[object]] = set()
        self._ended: set[asyncio.Task[object]] = set()
        self._closed = False

    def _here(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the BMC pool's HTTP session is closed")
        session = self._session
        if session is None:
            # No limit of its own: the callers bound their reads (run_bulk's
            # concurrency, each BMC's call slots). A connection is closed
            # after its answer: a BMC is read again a pass later (a minute
            # or more), past any keep-alive, and idle connections to
            # thousands of BMCs would only hold file descriptors. Nothing
            # from the environment: the driver passes what it read once.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
            session = self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return session

    def tls(self, verify: bool | str) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl`` for requests' ``verify``: False (not checked),
        True (the system's CAs) or a CA bundle's path (a context, made once)."""
        if verify is False:
            return False
        if verify is True:
            return True
        context = self._contexts.get(verify)
        if context is None:
            context = self._contexts[verify] = ssl.create_default_context(cafile=verify)
        return context

    async def get(
        self,
        url: str,
        *,
        headers: dict[str, str],
        tls: ssl.SSLContext | bool,
        proxy: str | None,
        timeout: float,
        connect_timeout: float,
        limit: int,
    ) -> tuple[int, bytes]:
        """GET ``url``: its status and at most ``limit`` bytes of its body.
        Straight to the BMC (no ``proxy``) on a connection of its own
        (``http_get``); through a proxy with aiohttp.

        Raises:
            AnswerTooLarge: the body is longer than ``limit`` (not read past it).
            TimeoutError, ssl.SSLError, OSError, http_get.ClosedEarly,
            http_get.NotHttp: a read straight to the BMC, as ``http_get``
                raises them.
            aiohttp.ClientError, TimeoutError: a read through a proxy, as
                aiohttp raises them.
        """
        if proxy is None:
            return await self._straight(url, headers, tls, timeout, connect_timeout, limit)
        session = self._here()
        timeouts = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout)
        async with session.get(
            url, headers=headers, ssl=tls, proxy=proxy, timeout=timeouts
        ) as response:
            declared = response.content_length
            if declared is not None and declared > limit:
                response.close()  # the body is never read
                raise AnswerTooLarge(declared, declared=True)
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_chunked(_READ_CHUNK):
                size += len(chunk)
                if size > limit:
                    response.close()  # drops the connection: the rest is never read
                    raise AnswerTooLarge(size, declared=False)
                chunks.append(chunk)
            return response.status, b"".join(chunks)

    async def _straight(
        self,
        url: str,
        headers: dict[str, str],
        tls: ssl.SSLContext | bool,
        timeout: float,
        connect_timeout: float,
        limit: int,
    ) -> tuple[int, bytes]:
        """A read through ``http_get``. Closing the pool ends it at once, as
        closing the aiohttp session ends that session's reads: the task
        reading is cancelled and the read fails as a closed connection."""
        if self._closed:
            raise RuntimeError("the BMC pool's HTTP session is closed")
        task = asyncio.current_task()
        assert task is not None
        self._reading.add(task)
        try:
            return await http_get.get(
                url,
                headers,
                # An http URL needs no context (none is made for it).
                tls=self._context(tls) if url.startswith("https:") else None,
                timeout=timeout,
                connect_timeout=connect_timeout,
                limit=limit,
                names=self._names,
            )
        except asyncio.CancelledError:
            if task not in self._ended:
                raise
            self._ended.discard(task)
            task.uncancel()
            raise ConnectionAbortedError("the BMC pool was closed during the read") from None
        finally:
            self._reading.discard(task)

    def _context(self, tls: ssl.SSLContext | bool) -> ssl.SSLContext:
        """``tls`` as a context of its own for ``http_get``: True, the
        system's CAs, host names checked; False, nothing checked (as
        aiohttp's ``ssl=False``)."""
        if isinstance(tls, ssl.SSLContext):
            return tls
        context = self._plain_contexts.get(tls)
        if context is None:
            context = ssl.create_default_context()
            if not tls:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._plain_contexts[tls] = context
        return context

    async def close(self) -> None:
        self._closed = True
        for task in self._reading:
            self._ended.add(task)
            task.cancel()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
            await asyncio.sleep(0)  # let the connector's transports close
