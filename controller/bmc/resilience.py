"""Timeouts, retries with backoff, per-BMC serialization and circuit breaking.

Every BMC call goes through a :class:`BmcGuard`:

1. the breaker may refuse it at once (``BmcBreakerOpen``, a ``BmcUnreachable``)
   without touching the network;
2. the blocking driver call runs in the pool's executor under a timeout
   (``BmcTimeout`` when it does not answer in time);
3. transient faults (no answer, 5xx, timeout) are retried with exponential
   backoff and full jitter; authentication failures, 4xx and NotSupported
   never are;
4. each outcome feeds the breaker: N consecutive transient failures open it;
   after a cool-down one probe is let through (half-open); an answer closes it.

Callers that need several calls to be one step (power action, then polling)
hold ``guard.exclusive()`` -- one operation per BMC at a time, like Ironic's
node lock. The clock and the random source are injectable for tests.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from controller.bmc.errors import BmcBreakerOpen, counts_against_breaker, is_transient
from controller.bmc.types import BmcHealth
from controller.core.errors import BmcError, BmcTimeout, KilnError

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient faults only.

    ``attempts`` counts the first try. The n-th retry waits a random time in
    ``[0, min(max_delay, base_delay * 2**n)]`` ("full jitter"), which spreads
    a fleet's retries instead of synchronizing them.
    """

    attempts: int = 3
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delay(self, retry: int, rng: random.Random) -> float:
        cap = min(self.max_delay, self.base_delay * (2**retry))
        return rng.uniform(0, cap)


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Per-BMC breaker: closed -> open after ``failure_threshold`` consecutive
    transient failures -> half-open after ``cooldown`` seconds -> closed on the
    first answer (or open again on a failed probe)."""

    def __init__(
        self,
        host: str,
        *,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        self.host = host
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self._clock = clock or SystemClock()
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._opened_at = 0.0

    def before_call(self) -> None:
        """Raise ``BmcBreakerOpen`` when calls must fail fast."""
        if self.state is not BreakerState.OPEN:
            return
        waited = self._clock.monotonic() - self._opened_at
        if waited >= self.cooldown:
            self.state = BreakerState.HALF_OPEN
            return
        raise BmcBreakerOpen(
            host=self.host,
            failures=self.consecutive_failures,
            reason=self.last_error or "unknown",
            retry_in=self.cooldown - waited,
        )

    def record_success(self) -> None:
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0

    def record_failure(self, error: BaseException) -> None:
        self.consecutive_failures += 1
        self.last_error = str(error)
        if (
            self.state is BreakerState.HALF_OPEN
            or self.consecutive_failures >= self.failure_threshold
        ):
            self.state = BreakerState.OPEN
            self._opened_at = self._clock.monotonic()

    @property
    def health(self) -> BmcHealth:
        if self.state is BreakerState.OPEN:
            state = "unreachable"
        elif self.state is BreakerState.HALF_OPEN or self.consecutive_failures:
            state = "degraded"
        else:
            state = "ok"
        return BmcHealth(state, self.last_error, self.consecutive_failures)


class BmcGuard:
    """Runs one BMC's blocking calls with timeout, retries and breaker."""

    def __init__(
        self,
        node: str,
        host: str,
        *,
        executor: Executor,
        call_timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.node = node
        self.host = host
        self.call_timeout = call_timeout
        self.retry = retry or RetryPolicy()
        self.clock = clock or SystemClock()
        self.breaker = breaker or CircuitBreaker(host, clock=self.clock)
        self._executor = executor
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()

    def exclusive(self) -> asyncio.Lock:
        """The per-BMC lock; hold it for a multi-call operation."""
        return self._lock

    async def call(
        self, operation: str, fn: Callable[[], T], *, deadline: float | None = None
    ) -> T:
        """Run ``fn`` (blocking) in the executor with timeout and retries.

        ``deadline`` (clock.monotonic() value) bounds the whole call including
        retries. Raises the last error once retries are exhausted; the breaker
        error when open.
        """
        loop = asyncio.get_running_loop()
        retry = 0
        while True:
            self.breaker.before_call()
            timeout = self.call_timeout
            if deadline is not None:
                timeout = max(0.01, min(timeout, deadline - self.clock.monotonic()))
            try:
                result = await asyncio.wait_for(loop.run_in_executor(self._executor, fn), timeout)
            except TimeoutError as e:
                error: KilnError = BmcTimeout(host=self.host, operation=operation, seconds=timeout)
                error.__cause__ = e
            except KilnError as e:
                error = e
            except Exception as e:  # a driver bug must not escape as a library error
                error = BmcError(host=self.host, reason=f"{operation}: {e!r}")
                error.__cause__ = e
            else:
                self.breaker.record_success()
                return result
            if counts_against_breaker(error):
                self.breaker.record_failure(error)
            elif not isinstance(error, BmcBreakerOpen):
                self.breaker.record_success()  # the BMC answered, even if "no"
            retry += 1
            if not is_transient(error) or retry >= self.retry.attempts:
                raise error
            pause = self.retry.delay(retry - 1, self._rng)
            if deadline is not None and self.clock.monotonic() + pause >= deadline:
                raise error
            LOG.info(
                "node %s: BMC %s %s failed (%s); retry %d/%d in %.2fs",
                self.node,
                self.host,
                operation,
                error,
                retry,
                self.retry.attempts - 1,
                pause,
            )
            await self.clock.sleep(pause)
