"""Adapter: the core's ``ImageVerifier`` port over HTTP (aiohttp).

A BMC does not check what it boots, so the controller checks an image before
a BMC is told its URL, from the same URL the BMC will fetch:

* ``mode="fetch"`` (the default): download the image and hash it (SHA-256,
  streamed in 1 MiB chunks, never held in memory);
* ``mode="sidecar"``: read the image server's published digest,
  ``URL + ".sha256"`` (``sha256sum`` output: the first 64 hex digits count),
  and compare it with the catalogue's pin — for images too large to fetch at
  every request. It trusts the image server's own hashing.

Either way a digest that differs from the pin is ``FailedPrecondition``, and
an image (or digest) the controller cannot read is ``Unavailable``:
provisioning is refused, never done unverified. Successful checks are kept
for ``ttl_s`` seconds per (URL, digest), so a burst of requests for one image
fetches it once. Errors name the URL, never credentials (catalogue URLs carry
none).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable

import aiohttp

from controller.core.errors import FailedPrecondition, InvalidArgument, Unavailable

MODES = ("fetch", "sidecar")
CHUNK = 1 << 20
_HEX64 = re.compile(r"\b([0-9a-fA-F]{64})\b")


class HttpImageVerifier:
    """Implements ``controller.core.ports.ImageVerifier``."""

    def __init__(
        self,
        *,
        mode: str = "fetch",
        timeout_s: float = 600.0,
        ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in MODES:
            raise InvalidArgument(f"image verification mode must be one of {', '.join(MODES)}")
        self.mode = mode
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10.0)
        self._ttl = ttl_s
        self._clock = clock
        self._verified: dict[tuple[str, str], float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def verify(self, url: str, sha256: str) -> None:
        key = (url, sha256)
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:  # one download per image, however many ask at once
            at = self._verified.get(key)
            if at is not None and self._clock() - at < self._ttl:
                return
            actual = await (self._sidecar(url) if self.mode == "sidecar" else self._fetch(url))
            if actual != sha256:
                what = "the image server publishes" if self.mode == "sidecar" else "is"
                raise FailedPrecondition(
                    f"image {url}: its sha256 {what} {actual}, the catalogue pins {sha256}; "
                    "refused before any node was touched"
                )
            self._verified[key] = self._clock()

    async def _fetch(self, url: str) -> str:
        digest = hashlib.sha256()
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.get(url) as rsp,
            ):
                if rsp.status != 200:
                    raise Unavailable(f"cannot verify image {url}: HTTP {rsp.status}")
                async for chunk in rsp.content.iter_chunked(CHUNK):
                    digest.update(chunk)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"cannot verify image {url}: {_why(e)}") from e
        return digest.hexdigest()

    async def _sidecar(self, url: str) -> str:
        where = url + ".sha256"
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.get(where) as rsp,
            ):
                if rsp.status != 200:
                    raise Unavailable(f"cannot verify image {url}: {where}: HTTP {rsp.status}")
                text = (await rsp.content.read(4096)).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"cannot verify image {url}: {where}: {_why(e)}") from e
        found = _HEX64.search(text)
        if found is None:
            raise Unavailable(f"cannot verify image {url}: {where} holds no SHA-256 digest")
        return found.group(1).lower()


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timed out"
    return str(e) or type(e).__name__
