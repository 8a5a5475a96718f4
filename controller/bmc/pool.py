"""The entry point of the BMC layer: one pool per controller process.

``BmcPool`` owns one bounded thread pool per protocol (sushy and pyghmi are
blocking; a protocol's pool size comes from its registry entry, so dead IPMI
BMCs can never starve Redfish), one guard (call slots + breaker) per BMC
endpoint and one driver per BMC endpoint -- which matters for pyghmi, which
must never get two ``Command`` objects for the same BMC in one process.
Create one pool per process.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from controller.bmc import registry
from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions
from controller.bmc.handle import Bmc, Driver
from controller.bmc.loop_share import DEFAULT_SLOW_ABOVE
from controller.bmc.redfish_http import RedfishHttp
from controller.bmc.resilience import (
    BmcGuard,
    BreakerState,
    CircuitBreaker,
    Clock,
    RetryPolicy,
    SystemClock,
)
from controller.bmc.workers import WorkerPool, WorkerStats
from controller.core.meter import Meter

LOG = logging.getLogger(__name__)


def _close_quietly(driver: Driver) -> None:
    try:
        driver.close()
    except Exception as e:  # a session already gone: nothing left to close
        LOG.debug("closing a BMC session failed: %s", e)


@dataclass(frozen=True)
class _Key:
    url: str
    username: str
    password_digest: int  # a changed password needs a new session; never logged


class BmcPool:
    """Hands out cached :class:`Bmc` handles.

    Args:
        max_workers: threads for one protocol's blocking calls (a protocol's
            registry entry may cap it lower: IPMI 32).
        call_timeout: seconds for each BMC call (each retry gets its own); a
            hard deadline, whatever the library does.
        retry: backoff policy for transient faults.
        breaker_threshold: consecutive transient failures that open a BMC's breaker.
        breaker_cooldown: seconds an open breaker waits before one probe.
        workers: per-protocol thread counts (``{"ipmi": 16}``), overriding
            ``max_workers`` and the registry's caps.
        max_in_flight: blocking calls at once per BMC endpoint, stuck ones
            included (default: the registry's, Redfish 2, IPMI 1).
        untrusted_share: the share of a protocol's threads that calls to BMCs
            not answering (never heard from, or failing) may hold at once.
        slow_above: how late results may reach the event loop, at the
            median, before the threads are held back (``loop_share``).
        power_resend_after: seconds a power change may stay unapplied before
            the command is sent a second (and last) time.
        close_timeout: seconds ``close`` spends logging out of BMCs.
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
        workers: Mapping[str, int] | None = None,
        max_in_flight: int | None = None,
        untrusted_share: float = 0.5,
        slow_above: float = DEFAULT_SLOW_ABOVE,
        power_resend_after: float = 30.0,
        close_timeout: float = 2.0,
        clock: Clock | None = None,
        seed: int | None = None,
        meter: Meter | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.call_timeout = call_timeout
        self.power_resend_after = power_resend_after
        self.close_timeout = close_timeout
        self._max_workers = max_workers
        self._workers_override = dict(workers or {})
        self._max_in_flight = max_in_flight
        self._untrusted_share = untrusted_share
        self._slow_above = slow_above
        self._retry = retry or RetryPolicy()
        self._breaker_threshold = breaker_threshold
        self._breaker_cooldown = breaker_cooldown
        self._clock = clock or SystemClock()
        self._meter = meter
        self._rng = random.Random(seed)
        self._pools: dict[str, WorkerPool] = {}
        self._handles: dict[tuple[str, _Key], Bmc] = {}
        self._drivers: dict[_Key, Driver] = {}
        self._guards: dict[_Key, BmcGuard] = {}
        # One breaker per BMC address (protocol, host, port), shared by the
        # guards of every system served from it.
        self._endpoints: dict[tuple[str, str, int], CircuitBreaker] = {}
        self._closed = False
        # Redfish reads made on the event loop (``PowerControl.poll``).
        self._http = RedfishHttp()

    def get(
        self,
        node_name: str,
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions | None = None,
        *,
        answered_last: bool = False,
    ) -> Bmc:
        """Return the cached handle for ``node_name`` at ``address`` (no I/O).

        The driver is made by the registry entry for the address's protocol
        (``controller/bmc/registry.py``), once per BMC endpoint and credentials.
        ``answered_last``: the store says this BMC answered its last reading;
        a guard made now starts trusted (``BmcGuard.vouch``).
        """
        if self._closed:
            raise RuntimeError("BmcPool is closed")
        tls = tls or TlsOptions()
        key = _Key(address.url, credentials.username, hash(credentials.password))
        handle = self._handles.get((node_name, key))
        if handle is not None:
            return handle
        entry = registry.entry_for(address)
        driver = self._drivers.get(key)
        if driver is None:
            driver = entry.make_driver(
                address, credentials, tls, request_timeout=self.call_timeout, node=node_name
            )
            self._drivers[key] = driver
        guard = self._guards.get(key)
        if guard is None:
            label = f"{address.host}:{address.port}"
            guard = BmcGuard(
                node_name,
                label,
                executor=self._pool_for(entry),
                call_timeout=self.call_timeout,
                retry=self._retry,
                breaker=self._breaker(label),
                endpoint=self._endpoint(address, label),
                clock=self._clock,
                rng=random.Random(self._rng.random()),
                max_in_flight=self._max_in_flight or entry.max_in_flight,
                protocol=address.protocol,
                meter=self._meter,
            )
            self._guards[key] = guard
            if answered_last:
                guard.vouch()
        handle = Bmc(
            node_name,
            address.protocol,
            driver,
            guard,
            power_resend_after=self.power_resend_after,
            http=self._http,
        )
        self._handles[(node_name, key)] = handle
        LOG.debug("node %s: BMC handle for %s (%s)", node_name, address.url, address.protocol)
        return handle

    def _breaker(self, label: str) -> CircuitBreaker:
        return CircuitBreaker(
            label,
            failure_threshold=self._breaker_threshold,
            cooldown=self._breaker_cooldown,
            # A probe is one attempt; one that ended without an outcome (it
            # never got a thread) lets the next through after that long.
            probe_timeout=self.call_timeout + 1.0,
            clock=self._clock,
        )

    def _endpoint(self, address: BmcAddress, label: str) -> CircuitBreaker:
        """The breaker of ``address``'s host:port, made on first use."""
        key = (address.protocol, address.host, address.port)
        breaker = self._endpoints.get(key)
        if breaker is None:
            breaker = self._endpoints[key] = self._breaker(label)
        return breaker

    def _pool_for(self, entry: registry.SchemeEntry) -> WorkerPool:
        pool = self._pools.get(entry.protocol)
        if pool is None:
            size = self._workers_override.get(entry.protocol)
            if size is None:
                size = min(self._max_workers, entry.max_workers or self._max_workers)
            pool = WorkerPool(
                entry.protocol,
                size,
                untrusted_share=self._untrusted_share,
                slow_above=self._slow_above,
            )
            self._pools[entry.protocol] = pool
        return pool

    def release(self, nodes: Collection[str]) -> int:
        """Drop the handles of ``nodes`` and close the drivers (their
        connections) that no other handle uses; the guards, with their
        breakers, stay. A later ``get`` makes a new handle and driver.
        Returns how many drivers were closed."""
        if self._closed or not nodes:
            return 0
        wanted = set(nodes)
        dropped: dict[_Key, str] = {}  # a driver no longer handed out -> its protocol
        for node_key in [k for k in self._handles if k[0] in wanted]:
            dropped[node_key[1]] = self._handles.pop(node_key).protocol
        for _node, key in self._handles:
            dropped.pop(key, None)  # another node's handle still uses it
        closed = 0
        for key, protocol in dropped.items():
            driver = self._drivers.pop(key, None)
            if driver is not None:
                self._pools[protocol].submit(_close_quietly, driver)
                closed += 1
        return closed

    def worker_stats(self) -> dict[str, WorkerStats]:
        """Per protocol: threads, running and queued calls (for benchmarks, logs)."""
        return {protocol: pool.stats() for protocol, pool in self._pools.items()}

    def breaker_states(self) -> dict[str, int]:
        """How many BMC endpoints' breakers are in each state (for metrics)."""
        counts = dict.fromkeys((s.value for s in BreakerState), 0)
        for guard in self._guards.values():
            counts[guard.state.value] += 1
        return counts

    async def close(self) -> None:
        """Stop the worker pools and log out of BMCs; returns within about
        ``close_timeout`` seconds whatever the BMCs do. Idempotent.

        Queued calls are cancelled (their callers get ``BmcPoolClosed``);
        threads stuck in a library are abandoned (they are daemon threads,
        never joined, so they do not hold up the process's exit).
        """
        if self._closed:
            return
        self._closed = True
        drivers = list(self._drivers.values())
        self._drivers.clear()
        self._handles.clear()
        self._guards.clear()
        self._endpoints.clear()
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        await self._http.close()
        if not drivers:
            return
        closer = WorkerPool("close", min(16, len(drivers)))
        try:
            pending = {asyncio.wrap_future(closer.submit(d.close)) for d in drivers}
            done, pending = await asyncio.wait(pending, timeout=self.close_timeout)
            for future in done:
                if not future.cancelled() and future.exception() is not None:
                    LOG.debug("closing a BMC session failed: %s", future.exception())
            if pending:
                LOG.warning(
                    "closing BMC sessions took over %.1fs; abandoning %d of %d",
                    self.close_timeout,
                    len(pending),
                    len(drivers),
                )
                for future in pending:
                    future.cancel()
        finally:
            closer.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> BmcPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
