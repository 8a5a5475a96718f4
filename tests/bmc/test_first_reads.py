"""A BMC's first reads after a restart: one round trip, and the store's word
for whether it answered before.

A restarted controller (or a new BMC reader process) meets every BMC anew.
Two things keep that first pass close to a steady one: a power read goes
straight to the system's document (no service root first), and a BMC whose
stored health says it answered its last reading gets the trusted lane of
the worker threads at once, instead of the half kept for BMCs never heard
from. The requests are counted by FaultProxy in front of sushy-tools'
emulator; the lanes by the worker pool's own figures.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from bmc_peers import PASSWORD, USER

from controller.bmc import RetryPolicy
from controller.bmc.errors import BmcBadResponse
from controller.bmc.gateway import PoolGateway
from controller.bmc.pool import BmcPool
from controller.bmc.reader import wire
from controller.bmc.workers import WorkerStats
from controller.core.model import BmcTarget
from controller.core.records import NodeRecord
from controller.sim.fault_proxy import FaultProxy, PayloadFault
from controller.sim.redfish_emulator import RedfishEmulator

pytestmark = pytest.mark.timeout(60)


def _via(proxy: FaultProxy, system: str) -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{system}"


def _pool(threads: int) -> BmcPool:
    return BmcPool(
        max_workers=threads,
        call_timeout=8.0,
        seed=7,
        retry=RetryPolicy(attempts=1),
        breaker_threshold=5,
        breaker_cooldown=30.0,
    )


async def test_a_first_power_read_is_one_request_and_a_power_action_still_works(
    emulator: RedfishEmulator,
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port)) as proxy:
        gateway = PoolGateway(_pool(4))
        try:
            # By its UUID: sushy-tools redirects a system's name to it.
            name = emulator.systems[0].uuid
            target = BmcTarget(name, _via(proxy, name), USER, PASSWORD)
            assert await gateway.power_state(target) == "off"
            assert proxy.requests == 1, "a first power read is the system's document only"
            assert await gateway.power_state(target) == "off"
            assert proxy.requests == 2
            # A power action goes through sushy's model, which reads the
            # service root first: it still works on the same session.
            assert await gateway.set_power(target, "on") == "on"
            assert proxy.requests > 3
            assert (await gateway.poll_power([target], 1))[name] == ("on", "ok")
        finally:
            await gateway.close()


async def test_a_read_does_not_wait_behind_a_service_root_being_read(
    emulator: RedfishEmulator,
) -> None:
    """A power action reads the service root, here from a BMC that takes 3 s
    to answer it (with garbage); a power read of the same BMC meanwhile
    answers at once, on the session it already has."""
    slow_root = PayloadFault(r"^/redfish/v1/?$", b"garbage", delay=3.0)
    async with FaultProxy(("127.0.0.1", emulator.port), payload_faults=[slow_root]) as proxy:
        gateway = PoolGateway(_pool(4))
        try:
            name = emulator.systems[0].uuid
            target = BmcTarget(name, _via(proxy, name), USER, PASSWORD)
            assert await gateway.power_state(target) == "off"  # the session exists
            action = asyncio.create_task(gateway.set_power(target, "on"))
            while proxy.replaced == 0:  # noqa: ASYNC110 (the action is reading the root)
                await asyncio.sleep(0.02)
            assert await gateway.power_state(target) == "off"
            assert not action.done(), "the read waited for the root"
            with pytest.raises(BmcBadResponse, match="not JSON"):
                await action
        finally:
            await gateway.close()


async def _lanes_while_in_flight(
    gateway: PoolGateway, pool: BmcPool, targets: list[BmcTarget]
) -> WorkerStats:
    """Start reads of ``targets`` through the worker threads (each answer
    held back by the proxy; power sync's and the leak watcher's own Redfish
    reads do not use the threads, ``test_power_poll.py`` and
    ``test_leak_driver.py``, but every other read does) and return the
    worker pool's figures once every call is running or queued and no more
    start; then let the reads finish."""

    async def read_all() -> dict[str, tuple[str, str]]:
        states = await asyncio.gather(*(gateway.power_state(t) for t in targets))
        return {
            t.node: (state, gateway.health(t.node))
            for t, state in zip(targets, states, strict=True)
        }

    reading = asyncio.create_task(read_all())
    seen: WorkerStats | None = None
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        stats = pool.worker_stats()["redfish"]
        if stats.running + stats.queued_trusted + stats.queued_untrusted == len(targets):
            seen = stats
            if stats.running == len(targets):
                break
    polled = await reading
    assert all(health == "ok" for _, health in polled.values()), polled
    assert seen is not None, "the calls never all reached the worker pool"
    return seen


async def test_bmcs_that_answered_before_the_restart_get_every_thread(
    emulator: RedfishEmulator,
) -> None:
    """Two threads: one for BMCs never heard from. Two BMCs the store says
    answered run at once; two the store knows nothing of run one at a time."""
    async with FaultProxy(("127.0.0.1", emulator.port), delay_s=3.0) as proxy:
        names = [s.uuid for s in emulator.systems[:2]]
        known = [BmcTarget(n, _via(proxy, n), USER, PASSWORD, answered_last=True) for n in names]
        pool = _pool(2)
        gateway = PoolGateway(pool)
        try:
            stats = await _lanes_while_in_flight(gateway, pool, known)
            assert (stats.running, stats.untrusted_running) == (2, 0), stats
        finally:
            await gateway.close()

        unknown = [BmcTarget(n, _via(proxy, n), USER, PASSWORD) for n in names]
        pool = _pool(2)
        gateway = PoolGateway(pool)
        try:
            stats = await _lanes_while_in_flight(gateway, pool, unknown)
            assert (stats.running, stats.untrusted_running, stats.queued_untrusted) == (1, 1, 1)
        finally:
            await gateway.close()


async def test_a_vouched_bmc_that_fails_is_untrusted_like_any_other(closed_port: int) -> None:
    gateway = PoolGateway(_pool(4))
    try:
        dead = f"redfish+http://127.0.0.1:{closed_port}/redfish/v1/Systems/x"
        vouched = BmcTarget("dead", dead, USER, PASSWORD, answered_last=True)
        assert gateway._bmc(vouched)._guard.trusted, "no call yet: the store's word"
        assert (await gateway.poll_power([vouched], 1))["dead"] == (None, "degraded")
        assert not gateway._bmc(vouched)._guard.trusted
        unknown = BmcTarget("other", dead.replace("/x", "/y"), USER, PASSWORD)
        assert not gateway._bmc(unknown)._guard.trusted
    finally:
        await gateway.close()


def test_a_target_says_whether_its_bmc_answered_the_last_stored_reading() -> None:
    node = NodeRecord(name="n1", bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/n1")
    for health, answered in (("ok", True), ("degraded", False), ("unreachable", False)):
        node.bmc_health = health
        target = node.bmc_target("pw")
        assert target.answered_last is answered
        assert "pw" not in repr(target)
        # The reader processes get the same target over their link.
        assert wire.target_from(wire.target_tuple(target)) == target
    assert NodeRecord(name="n2", bmc_url="redfish://x").bmc_target("").answered_last is False
