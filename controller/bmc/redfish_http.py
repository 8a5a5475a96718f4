"""Redfish reads on the event loop: one aiohttp session for a BMC pool.

sushy is blocking (requests), so the pool runs it in worker threads. For
the reads made of every BMC over and over, the periodic power reading
(``PowerControl.poll``: power sync, through ``PoolGateway.poll_power``)
and the leak watcher's (``LeakDetectionReader.poll``), that costs about
1 ms of CPU a GET on this code's 2-core machine, half of it handing the
call to a thread and back and the threads contending for the
interpreter; the same GET on an asyncio HTTP client costs about 0.2 ms
(``bench/bmc_pass_spread.py``). ``RedfishDriver.power_state_async`` and
``leak_detectors_async`` send them here; everything else, and every
change, stays on sushy.

What a read here shares with the driver's sushy session: the URL, Basic
auth, the environment's proxy and CA bundle (read once per BMC,
``redfish._environment``), the cap on an answer's size
(``MAX_RESPONSE_BYTES``, a ``Content-Length`` over it refused unread, a
longer body dropped as it passes it) and the checks on its JSON. Errors are
raised as aiohttp's own; the driver turns them into Kiln errors.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

_READ_CHUNK = 64 * 1024


class AnswerTooLarge(Exception):
    """An answer over the cap; ``declared`` when its Content-Length said so."""

    def __init__(self, size: int, declared: bool) -> None:
        super().__init__(size)
        self.size = size
        self.declared = declared


class RedfishHttp:
    """The pool's aiohttp session, made on first use in the running event
    loop (a pool serves one loop) and closed with the pool."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}
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

        Raises:
            AnswerTooLarge: the body is longer than ``limit`` (not read past it).
            aiohttp.ClientError, TimeoutError: as aiohttp raises them.
        """
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

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
            await asyncio.sleep(0)  # let the connector's transports close
