"""Dead BMCs cannot starve the rest: hard deadlines, per-protocol thread
pools, call slots, a breaker that trips on stuck calls, and a shutdown that
never waits for them.

A dead IPMI BMC here is a loopback UDP socket that takes packets and never
answers (pyghmi keeps its thread for ~5 s per attempt); a dead Redfish BMC is
a loopback TCP listener that never accepts (the connection opens, no answer
comes). Healthy BMCs are the sushy-tools emulator.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc import Bmc, BmcCredentials, PowerState, RetryPolicy, parse_bmc_url
from controller.bmc.errors import BmcBreakerOpen, BmcPoolClosed
from controller.bmc.gateway import PoolGateway
from controller.core.errors import BmcError, BmcTimeout, BmcUnreachable
from controller.core.model import BmcTarget
from controller.sim.redfish_emulator import RedfishEmulator

ONE_TRY = RetryPolicy(attempts=1)


def handles(pool: object, urls: list[str], credentials: BmcCredentials, prefix: str) -> list[Bmc]:
    return [
        pool.get(f"{prefix}-{i}", parse_bmc_url(url), credentials)  # type: ignore[attr-defined]
        for i, url in enumerate(urls)
    ]


async def timed_reads(bmcs: list[Bmc], rounds: int) -> list[float]:
    latencies = []
    for _ in range(rounds):
        for bmc in bmcs:
            started = time.monotonic()
            assert await bmc.power.state() is PowerState.OFF
            latencies.append(time.monotonic() - started)
    return latencies


@pytest.mark.timeout(30)
async def test_a_dead_ipmi_call_ends_at_its_deadline_while_pyghmi_still_waits(
    dead_ipmi: Callable[[int], list[str]], credentials: BmcCredentials
) -> None:
    [url] = dead_ipmi(1)
    async with make_pool(call_timeout=0.5, retry=ONE_TRY) as pool:
        bmc = pool.get("dead-0", parse_bmc_url(url), credentials)
        started = time.monotonic()
        with pytest.raises(BmcTimeout) as caught:
            await bmc.power.state()
        took = time.monotonic() - started
        assert type(caught.value) is BmcTimeout
        assert "did not finish power state within 0.5s" in str(caught.value)
        assert 0.5 <= took < 0.5 + 0.3
        # The library still holds its thread: the deadline did not wait for it.
        assert pool.worker_stats()["ipmi"].running == 1
        assert bmc.health.state == "degraded"


@pytest.mark.timeout(60)
async def test_healthy_redfish_answers_promptly_beside_many_hung_ipmi_bmcs(
    emulator: RedfishEmulator, dead_ipmi: Callable[[int], list[str]], credentials: BmcCredentials
) -> None:
    deadline = 3.0
    async with make_pool(call_timeout=deadline, retry=ONE_TRY, workers={"ipmi": 8}) as pool:
        healthy = [
            pool.get(s.name, parse_bmc_url(emulator.system_url(s.name)), credentials)
            for s in emulator.systems
        ]
        dead = handles(pool, dead_ipmi(100), credentials, "dead")
        hung = [asyncio.create_task(bmc.power.state()) for bmc in dead]
        await asyncio.sleep(0.3)
        ipmi = pool.worker_stats()["ipmi"]
        # Never-answered BMCs get half of the IPMI threads; the rest queue.
        assert ipmi.running == ipmi.untrusted_running == 4
        assert ipmi.queued_untrusted == 96  # IPMI is saturated...
        latencies = await timed_reads(healthy, rounds=5)  # ...and Redfish does not notice
        assert not any(task.done() for task in hung), "healthy reads waited for dead BMCs"
        assert max(latencies) < deadline / 4, latencies
        outcomes = Counter(
            type(e).__name__ for e in await asyncio.gather(*hung, return_exceptions=True)
        )
    # Running ones hit their deadline inside pyghmi; queued ones never ran.
    assert set(outcomes) == {"BmcTimeout", "BmcBusy"}, outcomes


@pytest.mark.timeout(60)
async def test_dead_redfish_bmcs_leave_threads_to_the_answering_ones(
    emulator: RedfishEmulator,
    dead_redfish: Callable[[int], list[str]],
    credentials: BmcCredentials,
) -> None:
    deadline = 3.0
    async with make_pool(call_timeout=deadline, retry=ONE_TRY, workers={"redfish": 8}) as pool:
        healthy = [
            pool.get(s.name, parse_bmc_url(emulator.system_url(s.name)), credentials)
            for s in emulator.systems
        ]
        await timed_reads(healthy, rounds=1)  # they have answered: trusted from now on
        dead = handles(pool, dead_redfish(40), credentials, "dead")
        hung = [asyncio.create_task(bmc.power.state()) for bmc in dead]
        await asyncio.sleep(0.3)
        redfish = pool.worker_stats()["redfish"]
        assert redfish.untrusted_running == 4  # half of the 8 threads, no more
        assert redfish.queued_untrusted == 36
        latencies = await timed_reads(healthy, rounds=5)
        assert not any(task.done() for task in hung), "healthy reads waited for dead BMCs"
        assert max(latencies) < deadline / 4, latencies
        errors = await asyncio.gather(*hung, return_exceptions=True)
    assert all(isinstance(e, BmcTimeout) for e in errors), errors


@pytest.mark.timeout(30)
async def test_breaker_trips_on_a_stuck_call_and_then_fails_fast(
    dead_ipmi: Callable[[int], list[str]], credentials: BmcCredentials
) -> None:
    [url] = dead_ipmi(1)
    retry = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)
    async with make_pool(call_timeout=0.5, retry=retry, breaker_threshold=5) as pool:
        bmc = pool.get("dead-0", parse_bmc_url(url), credentials)
        started = time.monotonic()
        with pytest.raises(BmcBreakerOpen) as caught:
            await bmc.power.state()
        # One deadline, then the retry finds the BMC's only slot held by the
        # stuck call: a short grace, and the breaker opens long before the
        # 5 consecutive failures (5 call timeouts) it would otherwise need.
        assert time.monotonic() - started < 5 * 0.5
        assert "1 call(s) stuck past the 0.5s call timeout" in str(caught.value)
        assert bmc.health.state == "unreachable"
        assert pool.worker_stats()["ipmi"].threads == 1
        for _ in range(20):
            started = time.monotonic()
            with pytest.raises(BmcBreakerOpen):
                await bmc.power.state()
            assert time.monotonic() - started < 0.05  # fails fast
        assert pool.worker_stats()["ipmi"].threads == 1  # and sends nothing more


@pytest.mark.timeout(60)
async def test_many_dead_ipmi_bmcs_at_once_do_not_hang_pyghmi(
    dead_ipmi: Callable[[int], list[str]], credentials: BmcCredentials
) -> None:
    """100 sessions at once, so pyghmi opens a second shared socket. Unpatched
    (``controller/bmc/pyghmi_compat.py``), its I/O thread blocks for good and
    every call ends at Kiln's deadline instead of pyghmi's own ~5 s."""
    async with make_pool(
        call_timeout=15.0, retry=ONE_TRY, workers={"ipmi": 100}, untrusted_share=1.0
    ) as pool:
        dead = handles(pool, dead_ipmi(100), credentials, "dead")
        started = time.monotonic()
        errors = await asyncio.gather(*(b.power.state() for b in dead), return_exceptions=True)
        took = time.monotonic() - started
    outcomes = Counter(f"{type(e).__name__}: {str(e).split(' is ')[-1]}" for e in errors)
    # Every call fails as a BMC error; on a loaded machine one of a hundred
    # sessions may end otherwise than "no answer", but none may hang.
    assert all(isinstance(e, BmcError) for e in errors), outcomes
    assert sum(type(e) is BmcUnreachable for e in errors) >= 95, outcomes
    assert took < 15.0 - 3.0, f"pyghmi did not give up by itself ({took:.1f}s): {outcomes}"


_FD_SCRIPT = """
import asyncio, os, sys
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # sockets now get fds >= 1024
from controller.bmc import BmcCredentials, BmcPool, RetryPolicy, parse_bmc_url

async def main(url):
    async with BmcPool(call_timeout=12.0, retry=RetryPolicy(attempts=1)) as pool:
        try:
            await pool.get("n", parse_bmc_url(url), BmcCredentials("u", "p")).power.state()
        except Exception as e:
            print(type(e).__name__, flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.timeout(40)
def test_ipmi_works_in_a_process_with_over_1024_descriptors(
    dead_ipmi: Callable[[int], list[str]],
) -> None:
    """pyghmi's I/O thread waits in select(), which fails for descriptors
    >= 1024 (a controller with a thousand Redfish connections has them): the
    thread dies and the call would end only at Kiln's 12 s deadline."""
    [url] = dead_ipmi(1)
    done = subprocess.run(
        [sys.executable, "-c", _FD_SCRIPT, url],
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ.copy(),
    )
    assert done.stdout.strip() == "BmcUnreachable", done.stdout + done.stderr
    assert "filedescriptor out of range" not in done.stderr


@pytest.mark.timeout(30)
async def test_closing_with_calls_stuck_returns_within_seconds(
    emulator: RedfishEmulator,
    dead_ipmi: Callable[[int], list[str]],
    dead_redfish: Callable[[int], list[str]],
) -> None:
    pool = make_pool(call_timeout=20.0, retry=ONE_TRY)
    gateway = PoolGateway(pool)
    urls = dead_ipmi(30) + dead_redfish(10)
    targets = [BmcTarget(f"dead-{i}", url, USER, PASSWORD) for i, url in enumerate(urls)]
    targets.append(BmcTarget("healthy", emulator.system_url("node-00000"), USER, PASSWORD))
    polling = asyncio.create_task(gateway.poll_power(targets, concurrency=64))
    await asyncio.sleep(1.0)  # every dead call is inside its library now
    assert pool.worker_stats()["ipmi"].running > 0
    started = time.monotonic()
    await gateway.close()
    assert time.monotonic() - started < 3.0
    # The callers are released at once, not at their 20 s deadline.
    polled = await asyncio.wait_for(polling, 2.0)
    assert polled["healthy"][0] == "off"
    assert all(polled[t.node][0] is None for t in targets[:-1])
    kiln_threads = [t for t in threading.enumerate() if t.name.startswith("kiln-bmc-")]
    assert kiln_threads and all(t.daemon for t in kiln_threads)


_EXIT_SCRIPT = """
import asyncio, sys
from controller.bmc import BmcCredentials, BmcPool, RetryPolicy, parse_bmc_url

async def main(urls):
    pool = BmcPool(call_timeout=60.0, retry=RetryPolicy(attempts=1))
    creds = BmcCredentials("u", "p")
    calls = [
        asyncio.create_task(pool.get(f"n{i}", parse_bmc_url(url), creds).power.state())
        for i, url in enumerate(urls)
    ]
    await asyncio.sleep(1.0)
    await pool.close()
    await asyncio.gather(*calls, return_exceptions=True)
    print("closed", flush=True)

asyncio.run(main(sys.argv[1:]))
"""


@pytest.mark.timeout(30)
def test_a_process_with_calls_stuck_exits_at_once(dead_ipmi: Callable[[int], list[str]]) -> None:
    """No thread is joined at interpreter exit (concurrent.futures' atexit
    hook would join a ThreadPoolExecutor's threads stuck in pyghmi)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXIT_SCRIPT, *dead_ipmi(20)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        closed = time.monotonic()
        assert line.strip() == "closed", line + proc.stdout.read()
        rest, _ = proc.communicate(timeout=10)
        assert time.monotonic() - closed < 2.0, "the process waited for stuck threads"
        assert proc.returncode == 0, rest
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(30)
async def test_a_closed_pool_releases_a_queued_caller_with_a_clear_error(
    dead_ipmi: Callable[[int], list[str]], credentials: BmcCredentials
) -> None:
    async with make_pool(call_timeout=20.0, retry=ONE_TRY, workers={"ipmi": 1}) as pool:
        first, second = handles(pool, dead_ipmi(2), credentials, "dead")
        running = asyncio.create_task(first.power.state())
        queued = asyncio.create_task(second.power.state())
        await asyncio.sleep(0.3)
        await pool.close()
        for task in (running, queued):
            with pytest.raises(BmcPoolClosed, match="the BMC pool is closed"):
                await asyncio.wait_for(task, 1.0)
