"""The entry point of the BMC layer: one pool per controller process.

``BmcPool`` owns a bounded thread pool (sushy and pyghmi are blocking), one
guard (lock + breaker) per BMC endpoint and one driver per BMC endpoint --
which matters for pyghmi, which must never get two ``Command`` objects for the
same BMC in one process. Create one pool per process.
"""

from __future__ import annotations

import asyncio
import logging
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from controller.bmc import registry
from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions
from controller.bmc.handle import Bmc, Driver
from controller.bmc.resilience import BmcGuard, CircuitBreaker, Clock, RetryPolicy, SystemClock

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Key:
    url: str
    username: str
    password_digest: int  # a changed password needs a new session; never logged


class BmcPool:
    """Hands out cached :class:`Bmc` handles.

    Args:
        max_workers: threads for blocking BMC calls (bounds fleet concurrency).
        call_timeout: seconds for each BMC call (each retry gets its own).
        retry: backoff policy for transient faults.
        breaker_threshold: consecutive transient failures that open a BMC's breaker.
        breaker_cooldown: seconds an open breaker waits before one probe.
        clock: injectable clock (tests).
    """

    def __init__(
        self,
        max_workers: int = 256,
        call_timeout: float = 10.0,
        *,
        retry: RetryPolicy | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        clock: Clock | None = None,
        seed: int | None = None,
    ) -> None:
        self.call_timeout = call_timeout
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kiln-bmc")
        self._retry = retry or RetryPolicy()
        self._breaker_threshold = breaker_threshold
        self._breaker_cooldown = breaker_cooldown
        self._clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._handles: dict[tuple[str, _Key], Bmc] = {}
        self._drivers: dict[_Key, Driver] = {}
        self._guards: dict[_Key, BmcGuard] = {}
        self._closed = False

    def get(
        self,
        node_name: str,
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions | None = None,
    ) -> Bmc:
        """Return the cached handle for ``node_name`` at ``address`` (no I/O).

        The driver is made by the registry entry for the address's protocol
        (``controller/bmc/registry.py``), once per BMC endpoint and credentials.
        """
        if self._closed:
            raise RuntimeError("BmcPool is closed")
        tls = tls or TlsOptions()
        key = _Key(address.url, credentials.username, hash(credentials.password))
        handle = self._handles.get((node_name, key))
        if handle is not None:
            return handle
        driver = self._drivers.get(key)
        if driver is None:
            driver = registry.entry_for(address).make_driver(
                address, credentials, tls, request_timeout=self.call_timeout, node=node_name
            )
            self._drivers[key] = driver
        guard = self._guards.get(key)
        if guard is None:
            label = f"{address.host}:{address.port}"
            guard = BmcGuard(
                node_name,
                label,
                executor=self._executor,
                call_timeout=self.call_timeout,
                retry=self._retry,
                breaker=CircuitBreaker(
                    label,
                    failure_threshold=self._breaker_threshold,
                    cooldown=self._breaker_cooldown,
                    clock=self._clock,
                ),
                clock=self._clock,
                rng=random.Random(self._rng.random()),
            )
            self._guards[key] = guard
        handle = Bmc(node_name, address.protocol, driver, guard)
        self._handles[(node_name, key)] = handle
        LOG.debug("node %s: BMC handle for %s (%s)", node_name, address.url, address.protocol)
        return handle

    async def close(self) -> None:
        """Close sessions and stop the worker threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        drivers = list(self._drivers.values())
        self._drivers.clear()
        self._handles.clear()
        self._guards.clear()

        def _close_all() -> None:
            for driver in drivers:
                driver.close()

        loop = asyncio.get_running_loop()
        try:
            # A dead BMC must not hold up shutdown for long.
            await asyncio.wait_for(loop.run_in_executor(self._executor, _close_all), 5.0)
        except TimeoutError:
            LOG.warning("closing BMC sessions took over 5s; abandoning the rest")
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> BmcPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
