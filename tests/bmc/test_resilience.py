"""The retry / breaker state machine, with an injected clock (no network)."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controller.bmc.errors import BmcBreakerOpen, BmcBusy, BmcServerError
from controller.bmc.resilience import BmcGuard, BreakerState, CircuitBreaker, RetryPolicy
from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcTimeout,
    BmcUnreachable,
    NotSupported,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class Script:
    """A blocking 'driver call' that plays a list of outcomes."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return outcome()
        return outcome


def unreachable() -> BmcUnreachable:
    return BmcUnreachable(host="h", reason="connection refused")


def guard_with(
    clock: FakeClock, *, attempts: int = 3, threshold: int = 3, timeout: float = 5.0
) -> tuple[BmcGuard, ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(4)
    guard = BmcGuard(
        "node-1",
        "h",
        executor=executor,
        call_timeout=timeout,
        retry=RetryPolicy(attempts=attempts, base_delay=0.5, max_delay=4.0),
        breaker=CircuitBreaker("h", failure_threshold=threshold, cooldown=30.0, clock=clock),
        clock=clock,
        rng=random.Random(1),
    )
    return guard, executor


async def test_transient_failures_are_retried_with_backoff() -> None:
    clock = FakeClock()
    guard, ex = guard_with(clock, attempts=4, threshold=10)
    call = Script(unreachable(), BmcServerError(host="h", status=503, reason="busy"), "ok")
    assert await guard.call("op", call) == "ok"
    assert call.calls == 3
    assert len(clock.sleeps) == 2
    assert 0 <= clock.sleeps[0] <= 0.5 and 0 <= clock.sleeps[1] <= 1.0
    assert guard.breaker.state is BreakerState.CLOSED
    ex.shutdown()


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(BmcAuthenticationFailed(host="h", username="u"), id="auth"),
        pytest.param(NotSupported("BIOS attributes"), id="not-supported"),
    ],
)
async def test_final_errors_are_not_retried_and_do_not_open_breaker(error: Exception) -> None:
    clock = FakeClock()
    guard, ex = guard_with(clock, threshold=1)
    call = Script(error)
    with pytest.raises(type(error)):
        await guard.call("op", call)
    assert call.calls == 1
    assert clock.sleeps == []
    assert guard.breaker.state is BreakerState.CLOSED
    ex.shutdown()


async def test_breaker_opens_fails_fast_then_half_opens_and_closes() -> None:
    clock = FakeClock()
    guard, ex = guard_with(clock, attempts=1, threshold=3)
    failing = Script(unreachable())
    for _ in range(3):
        with pytest.raises(BmcUnreachable):
            await guard.call("op", failing)
    assert guard.breaker.state is BreakerState.OPEN
    assert guard.breaker.health.state == "unreachable"
    # Fails fast without calling the driver.
    with pytest.raises(BmcBreakerOpen):
        await guard.call("op", failing)
    assert failing.calls == 3
    # After the cool-down one probe goes through; a failure re-opens.
    clock.now += 31
    with pytest.raises(BmcUnreachable):
        await guard.call("op", failing)
    assert failing.calls == 4
    assert guard.breaker.state is BreakerState.OPEN
    # Next probe answers: closed again.
    clock.now += 31
    assert await guard.call("op", Script("answer")) == "answer"
    assert guard.breaker.state is BreakerState.CLOSED
    assert guard.breaker.health.state == "ok"
    ex.shutdown()


async def test_degraded_health_after_one_failure() -> None:
    clock = FakeClock()
    guard, ex = guard_with(clock, attempts=1, threshold=3)
    with pytest.raises(BmcUnreachable):
        await guard.call("op", Script(unreachable()))
    health = guard.breaker.health
    assert health.state == "degraded"
    assert health.consecutive_failures == 1
    assert "connection refused" in (health.last_error or "")
    ex.shutdown()


async def test_slow_call_times_out() -> None:
    import threading

    clock = FakeClock()
    guard, ex = guard_with(clock, attempts=1, timeout=0.2)
    release = threading.Event()
    with pytest.raises(BmcTimeout):
        await guard.call("power state", Script(lambda: release.wait(5)))
    release.set()
    ex.shutdown()


async def test_deadline_bounds_retries() -> None:
    clock = FakeClock()
    guard, ex = guard_with(clock, attempts=50, threshold=100)
    call = Script(unreachable())
    with pytest.raises(BmcUnreachable):
        await guard.call("op", call, deadline=clock.now + 3.0)
    assert clock.now <= 1003.0 + 1e-6
    assert call.calls < 50
    ex.shutdown()


def test_retry_delay_is_capped_full_jitter() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.5, max_delay=2.0)
    rng = random.Random(3)
    delays: list[Callable[[], float]] = [lambda n=n: policy.delay(n, rng) for n in range(8)]
    values = [d() for d in delays]
    assert all(0 <= v <= 2.0 for v in values)
    assert max(values) > 0.5  # grows past the base


async def test_a_call_that_started_too_late_to_finish_is_busy_not_the_bmcs_fault() -> None:
    """The controller's own queue (its one worker thread busy elsewhere) ate
    most of the deadline: the BMC had less than half its time, so the
    timeout is not counted against it (nor its address)."""
    import threading

    clock = FakeClock()
    executor = ThreadPoolExecutor(1)
    guard = BmcGuard(
        "node-1",
        "h",
        executor=executor,
        call_timeout=0.5,
        retry=RetryPolicy(attempts=1),
        breaker=CircuitBreaker("h", failure_threshold=1, cooldown=30.0, clock=clock),
        clock=clock,
    )
    release = threading.Event()
    try:
        executor.submit(time.sleep, 0.35)  # the thread is taken for most of the deadline
        with pytest.raises(BmcBusy) as caught:
            await guard.call("power state", Script(lambda: release.wait(5)))
        message = str(caught.value)
        waited = re.search(r"waited ([0-9.]+)s for a free BMC worker thread", message)
        assert waited is not None, message
        # At least the 0.35 s the thread was taken; a loaded machine adds its own lag.
        assert 0.3 <= float(waited.group(1)) < 0.5, message
        assert "of its 0.5s to answer" in message
        assert guard.breaker.state is BreakerState.CLOSED  # one failure would have opened it
        release.set()
        # Started at once and still silent at its deadline: the BMC's timeout.
        release.clear()
        await asyncio.sleep(0.1)
        with pytest.raises(BmcTimeout) as timed_out:
            await guard.call("power state", Script(lambda: release.wait(5)))
        assert type(timed_out.value) is BmcTimeout
        assert guard.breaker.state is BreakerState.OPEN
    finally:
        release.set()
        executor.shutdown()
