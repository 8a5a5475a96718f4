"""Timeouts, retries with backoff, per-BMC call slots and circuit breaking.

Every BMC call goes through a :class:`BmcGuard`:

1. the breaker may refuse it at once (``BmcBreakerOpen``, a ``BmcUnreachable``)
   without touching the network;
2. it takes one of the BMC's few call slots (``max_in_flight``), waiting its
   turn within its deadline (``BmcBusy`` when the turn never comes). A slot
   is held until the blocking call really returns, so a call stuck in a
   library keeps its slot; when every slot is held by a call stuck (running
   longer than ``call_timeout``, which every driver's own timeouts stay
   within) the breaker trips open at once instead of sending more;
3. the blocking driver call runs in the protocol's worker pool under a hard
   deadline: the caller stops waiting at the deadline whatever the library
   does (``BmcTimeout``), and a call still queued at its deadline is dropped
   (``BmcBusy``);
4. transient faults (no answer, 5xx, timeout) are retried with exponential
   backoff and full jitter; authentication failures, 4xx and NotSupported
   never are;
5. each outcome feeds the breaker: N consecutive transient failures open it;
   after a cool-down one probe is let through (half-open); an answer closes it.

Callers that need several calls to be one step (power action, then polling)
hold ``guard.exclusive()`` -- one state-changing operation per BMC at a time,
like Ironic's node lock. Reads do not take it. The clock and the random
source are injectable for tests; call slots and deadlines of running threads
are measured in real time (``time.monotonic``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Protocol, TypeVar

from controller.bmc.errors import (
    BmcBreakerOpen,
    BmcBusy,
    BmcPoolClosed,
    counts_against_breaker,
    is_transient,
    says_endpoint_down,
)
from controller.bmc.types import BmcHealth
from controller.bmc.workers import WorkerPoolClosed
from controller.core.deadline import seconds_left as caller_seconds_left
from controller.core.errors import BmcError, BmcTimeout, KilnError
from controller.core.meter import Meter, NullMeter

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
    first answer (or open again on a failed probe).

    Half-open lets one probe through at a time: other calls fail fast until
    the probe's outcome is recorded, or for at most ``probe_timeout`` seconds
    (a probe that ended without one, e.g. never got a worker thread). Without
    that, every caller waiting out the cool-down would go to a dead BMC at
    once when it ends."""

    def __init__(
        self,
        host: str,
        *,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        probe_timeout: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        self.host = host
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self._clock = clock or SystemClock()
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._opened_at = 0.0
        self._probe_at: float | None = None  # monotonic: when the half-open probe went out

    def before_call(self) -> None:
        """Raise ``BmcBreakerOpen`` when calls must fail fast."""
        if self.state is BreakerState.CLOSED:
            return
        now = self._clock.monotonic()
        if self.state is BreakerState.OPEN:
            waited = now - self._opened_at
            if waited < self.cooldown:
                raise self._refusal(self.cooldown - waited)
            self.state = BreakerState.HALF_OPEN
            self._probe_at = None
        if self._probe_at is not None and now - self._probe_at < self.probe_timeout:
            raise self._refusal(self.probe_timeout - (now - self._probe_at))
        self._probe_at = now

    def release_probe(self) -> None:
        """The call let through as the probe was not made: let the next one be."""
        self._probe_at = None

    def _refusal(self, retry_in: float) -> BmcBreakerOpen:
        return BmcBreakerOpen(
            host=self.host,
            failures=self.consecutive_failures,
            reason=self.last_error or "unknown",
            retry_in=retry_in,
        )

    def record_success(self) -> None:
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self._probe_at = None

    def trip(self, reason: str) -> BmcBreakerOpen:
        """Open now (calls are stuck in the library: sending more would only
        pile up threads), counting it as one more failure. Returns the error
        the refused call raises."""
        self.consecutive_failures += 1
        self.last_error = reason
        self.state = BreakerState.OPEN
        self._opened_at = self._clock.monotonic()
        self._probe_at = None
        return BmcBreakerOpen(
            host=self.host,
            failures=self.consecutive_failures,
            reason=reason,
            retry_in=self.cooldown,
        )

    def record_failure(self, error: BaseException) -> None:
        self.consecutive_failures += 1
        self.last_error = str(error)
        if (
            self.state is BreakerState.HALF_OPEN
            or self.consecutive_failures >= self.failure_threshold
        ):
            self.state = BreakerState.OPEN
            self._opened_at = self._clock.monotonic()
            self._probe_at = None

    @property
    def trusted(self) -> bool:
        """Closed with no failure since the last answer."""
        return self.state is BreakerState.CLOSED and self.consecutive_failures == 0

    @property
    def health(self) -> BmcHealth:
        if self.state is BreakerState.OPEN:
            state = "unreachable"
        elif self.state is BreakerState.HALF_OPEN or self.consecutive_failures:
            state = "degraded"
        else:
            state = "ok"
        return BmcHealth(state, self.last_error, self.consecutive_failures)


class _Slot:
    """One call in flight: when a thread started running it (real time)."""

    __slots__ = ("started_at",)

    def __init__(self) -> None:
        self.started_at: float | None = None

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def stuck(self, now: float, limit: float) -> bool:
        """Running for longer than ``limit`` seconds. (A queued call is never
        stuck: it is dropped at its caller's deadline.)"""
        return self.started_at is not None and now - self.started_at > limit


class BmcGuard:
    """Runs one BMC endpoint's blocking calls with call slots, a hard deadline,
    retries and the breaker.

    Args:
        executor: runs the blocking calls; a ``WorkerPool`` gets each call in
            its trusted lane only while this BMC answers.
        max_in_flight: blocking calls to this BMC at once, counting calls whose
            caller gave up but whose thread has not returned.
        stuck_grace: seconds a call waits for a slot held only by stuck calls
            (running longer than ``call_timeout``) before the breaker trips.
        endpoint: the breaker of the BMC's address (host:port), shared by
            every guard of a system served from it. It counts only failures
            that say nothing answers there (``says_endpoint_down``) and is
            asked first: a dead address shared by many systems costs a few
            calls, not a few per system.
    """

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
        max_in_flight: int = 2,
        stuck_grace: float = 0.5,
        protocol: str = "",
        meter: Meter | None = None,
        endpoint: CircuitBreaker | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.node = node
        self.host = host
        self.protocol = protocol
        self._meter: Meter = meter or NullMeter()
        self.call_timeout = call_timeout
        self.retry = retry or RetryPolicy()
        self.clock = clock or SystemClock()
        self.breaker = breaker or CircuitBreaker(host, clock=self.clock)
        self.endpoint = endpoint
        self.max_in_flight = max_in_flight
        self.stuck_grace = stuck_grace
        self._executor = executor
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()
        self._slots: set[_Slot] = set()
        self._slot_waiters: list[asyncio.Future[None]] = []
        self._answered = False

    def exclusive(self) -> asyncio.Lock:
        """The per-BMC operation lock; hold it for a multi-call state change."""
        return self._lock

    @contextlib.asynccontextmanager
    async def exclusive_until(self, deadline: float | None, operation: str) -> AsyncIterator[None]:
        """Hold the operation lock, waiting for it no later than ``deadline``
        (clock.monotonic() value) or the current request's deadline.

        Raises:
            BmcBusy: another state change kept the lock until then.
        """
        deadline = self.within_caller(deadline)
        if deadline is None:
            async with self._lock:
                yield
            return
        wait = max(0.0, deadline - self.clock.monotonic())
        try:
            async with asyncio.timeout(wait):
                await self._lock.acquire()
        except TimeoutError:
            raise BmcBusy(
                host=self.host,
                operation=operation,
                seconds=wait,
                waiting_for="another state change of this BMC to finish",
            ) from None
        try:
            yield
        finally:
            self._lock.release()

    @property
    def state(self) -> BreakerState:
        """The stricter of this BMC's breaker and its address's."""
        states = [self.breaker.state]
        if self.endpoint is not None:
            states.append(self.endpoint.state)
        for state in (BreakerState.OPEN, BreakerState.HALF_OPEN):
            if state in states:
                return state
        return BreakerState.CLOSED

    @property
    def health(self) -> BmcHealth:
        """This BMC's health; "unreachable" while its address's breaker is open."""
        if self.endpoint is not None and self.endpoint.state is BreakerState.OPEN:
            return self.endpoint.health
        return self.breaker.health

    @property
    def trusted(self) -> bool:
        """Answered before, with neither breaker counting a failure since."""
        return (
            self._answered
            and self.breaker.trusted
            and (self.endpoint is None or self.endpoint.trusted)
        )

    def vouch(self) -> None:
        """Count this BMC as one that answered, on the store's word (it
        answered the last reading before this process began): its calls go
        in the trusted lane until one fails, as if it had answered here."""
        self._answered = True

    @property
    def in_flight(self) -> int:
        """Blocking calls to this BMC not yet returned (stuck ones included)."""
        return len(self._slots)

    async def call(
        self, operation: str, fn: Callable[[], T], *, deadline: float | None = None
    ) -> T:
        """As ``_call`` (see there), measured: its time and whether it failed."""
        return await self._measured(
            operation, lambda timeout: self._attempt(operation, fn, timeout), deadline
        )

    async def call_async(
        self, operation: str, read: Callable[[], Awaitable[T]], *, deadline: float | None = None
    ) -> T:
        """As ``call``, for a driver's read that runs on the event loop
        (``read`` makes the coroutine, once per attempt): the same call
        slots, retries, breakers and deadlines, with no worker thread."""
        return await self._measured(
            operation, lambda timeout: self._attempt_async(operation, read, timeout), deadline
        )

    async def _measured(
        self, operation: str, attempt: Callable[[float], Awaitable[T]], deadline: float | None
    ) -> T:
        started = time.monotonic()
        ok = False
        try:
            result = await self._call(operation, attempt, deadline=deadline)
            ok = True
            return result
        finally:
            self._meter.bmc_call(self.protocol, operation, time.monotonic() - started, ok)

    async def _call(
        self,
        operation: str,
        attempt: Callable[[float], Awaitable[T]],
        *,
        deadline: float | None = None,
    ) -> T:
        """Make ``attempt``s (each given its timeout in seconds) with a hard
        deadline and retries.

        ``deadline`` (clock.monotonic() value) bounds the whole call including
        retries, and so does the deadline of the request being served
        (``controller.core.deadline``): a retry that would outlast either is not
        made, so the caller hears the BMC's own error in time. Raises the last
        error once retries are exhausted; the breaker error when open (also
        when every slot is held by a stuck call).
        """
        deadline = self.within_caller(deadline)
        retry = 0
        while True:
            if self.endpoint is not None:
                self.endpoint.before_call()
                try:
                    self.breaker.before_call()
                except BmcBreakerOpen:
                    self.endpoint.release_probe()  # this call will not be its probe
                    raise
            else:
                self.breaker.before_call()
            timeout = self.call_timeout
            if deadline is not None:
                timeout = max(0.01, min(timeout, deadline - self.clock.monotonic()))
            try:
                result = await attempt(timeout)
            except BmcBreakerOpen:
                raise
            except TimeoutError as e:  # a driver's own timeout surfacing raw
                error: KilnError = BmcTimeout(host=self.host, operation=operation, seconds=timeout)
                error.__cause__ = e
            except KilnError as e:
                error = e
            except Exception as e:  # a driver bug must not escape as a library error
                error = BmcError(host=self.host, reason=f"{operation}: {e!r}")
                error.__cause__ = e
            else:
                self._answered = True
                self._record(success=True, error=None)
                return result
            if counts_against_breaker(error):
                self._record(success=False, error=error)
            elif not isinstance(error, BmcBusy | BmcPoolClosed):
                self._answered = True
                self._record(success=True, error=None)  # the BMC answered, even if "no"
            retry += 1
            if not is_transient(error) or retry >= self.retry.attempts:
                raise error
            pause = self.retry.delay(retry - 1, self._rng)
            if deadline is not None and self.clock.monotonic() + pause >= deadline:
                raise error
            LOG.debug(
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

    def _record(self, *, success: bool, error: BaseException | None) -> None:
        """Feed one outcome to this BMC's breaker and its address's."""
        if success or error is None:
            self.breaker.record_success()
        else:
            self.breaker.record_failure(error)
        if self.endpoint is None:
            return
        if error is not None and says_endpoint_down(error):
            self.endpoint.record_failure(error)
        else:
            self.endpoint.record_success()  # something at the address answered

    def within_caller(self, deadline: float | None) -> float | None:
        """``deadline`` (clock.monotonic() value), brought forward to the
        current request's deadline when that comes first."""
        left = caller_seconds_left()
        if left is None:
            return deadline
        caller = self.clock.monotonic() + left
        return caller if deadline is None else min(deadline, caller)

    async def _attempt(self, operation: str, fn: Callable[[], T], timeout: float) -> T:
        """One try: a slot, then the blocking call under a hard deadline."""
        deadline = time.monotonic() + timeout
        await self._take_slot(operation, deadline, timeout)
        slot = _Slot()
        self._slots.add(slot)
        try:
            future = self._submit(slot, fn)
        except RuntimeError as e:  # the worker pool is shut down
            self._free(slot)
            raise BmcPoolClosed(host=self.host, operation=operation) from e
        loop = asyncio.get_running_loop()

        def returned(_: Future[T]) -> None:
            # Runs in the worker thread (or here, when cancelled while queued).
            try:
                loop.call_soon_threadsafe(self._returned, slot, time.monotonic())
            except RuntimeError:  # the event loop is closed: nobody is waiting
                pass

        future.add_done_callback(returned)
        waiter = asyncio.wrap_future(future)
        try:
            await asyncio.wait({waiter}, timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.CancelledError:
            waiter.cancel()  # dropped if still queued; a running thread keeps its slot
            raise
        if waiter.done():
            if future.cancelled():  # the pool was shut down under the call
                raise BmcPoolClosed(host=self.host, operation=operation)
            error = waiter.exception()
            if isinstance(error, WorkerPoolClosed):
                raise BmcPoolClosed(host=self.host, operation=operation) from error
            return waiter.result()
        waiter.cancel()
        pool = getattr(self._executor, "name", "BMC")
        if slot.started_at is None:
            raise BmcBusy(
                host=self.host,
                operation=operation,
                seconds=timeout,
                waiting_for=f"a free {pool} worker thread",
            )
        waited = slot.started_at - (deadline - timeout)
        if waited > timeout / 2:
            # The BMC had less than half its time: the controller's own queue
            # (threads cut to keep the loop on time, an interpreter at one
            # core) ran the deadline down, and that says nothing of the BMC.
            raise BmcBusy(
                host=self.host,
                operation=operation,
                seconds=round(waited, 2),
                waiting_for=f"a free {pool} worker thread, which left it "
                f"{max(0.0, deadline - slot.started_at):.2f}s of its {timeout:g}s to answer",
            )
        raise BmcTimeout(host=self.host, operation=operation, seconds=round(timeout, 2))

    async def _attempt_async(
        self, operation: str, read: Callable[[], Awaitable[T]], timeout: float
    ) -> T:
        """One try of a read on the event loop: a slot, then the read under a
        hard deadline (a ``TimeoutError`` past it; the read is cancelled, so
        nothing is left holding the slot)."""
        await self._take_slot(operation, time.monotonic() + timeout, timeout)
        slot = _Slot()
        slot.started_at = time.monotonic()
        self._slots.add(slot)
        try:
            async with asyncio.timeout(timeout):
                return await read()
        finally:
            self._free(slot)

    def _submit(self, slot: _Slot, fn: Callable[[], T]) -> Future[T]:
        def run() -> T:
            slot.started_at = time.monotonic()
            return fn()

        submit_call = getattr(self._executor, "submit_call", None)
        if submit_call is not None:
            trusted = self.trusted
            future: Future[T] = submit_call(run, trusted=trusted)
            return future
        return self._executor.submit(run)

    async def _take_slot(self, operation: str, deadline: float, timeout: float) -> None:
        """Wait for a free call slot until ``deadline``; trip the breaker when
        every slot is held by a stuck call."""
        loop = asyncio.get_running_loop()
        while len(self._slots) >= self.max_in_flight:
            now = time.monotonic()
            stuck = self._all_stuck(now)
            until = min(deadline, now + self.stuck_grace) if stuck else deadline
            waiter: asyncio.Future[None] = loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                await asyncio.wait({waiter}, timeout=max(0.0, until - now))
            finally:
                if waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
            if waiter.done() and len(self._slots) < self.max_in_flight:
                return
            now = time.monotonic()
            if stuck and self._all_stuck(now):
                reason = (
                    f"{len(self._slots)} call(s) stuck past the {self.call_timeout:g}s "
                    f"call timeout; not sending {operation} until they return"
                )
                LOG.warning("node %s: BMC %s %s", self.node, self.host, reason)
                raise self.breaker.trip(reason)
            if now >= deadline:
                raise BmcBusy(
                    host=self.host,
                    operation=operation,
                    seconds=timeout,
                    waiting_for=f"one of its {self.max_in_flight} call slot(s)",
                )

    def _all_stuck(self, now: float) -> bool:
        return all(s.stuck(now, self.call_timeout) for s in self._slots)

    def _returned(self, slot: _Slot, finished_at: float) -> None:
        """On the loop: a call's thread returned at ``finished_at``; how late
        the loop took that up tells the pool how many threads it may run."""
        observe = getattr(self._executor, "observe_lateness", None)
        if observe is not None and slot.started:
            observe(time.monotonic() - finished_at)
        self._free(slot)

    def _free(self, slot: _Slot) -> None:
        self._slots.discard(slot)
        waiters, self._slot_waiters = self._slot_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
