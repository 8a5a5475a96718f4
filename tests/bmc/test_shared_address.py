"""Several systems behind one BMC address (host:port): one Redfish service
for many systems, as the emulator and a chassis or rack manager serve them.

Real peers: the sushy-tools emulator (4 systems) behind a ``FaultProxy`` that
drops connections or answers 500. The address's breaker counts only "nothing
answers there"; each system's own breaker still counts its own bad answers.
"""

from __future__ import annotations

import asyncio

import pytest
from bmc_peers import make_pool

from controller.bmc import Bmc, BmcCredentials, BmcPool, PowerState, RetryPolicy, parse_bmc_url
from controller.bmc.errors import BmcBreakerOpen, BmcServerError
from controller.core.errors import BmcUnreachable
from controller.sim.fault_proxy import FaultProxy
from controller.sim.redfish_emulator import RedfishEmulator

pytestmark = pytest.mark.timeout(60)


def system(proxy: FaultProxy, n: int) -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/node-{n:05d}"


def systems(pool: BmcPool, proxy: FaultProxy, credentials: BmcCredentials, count: int) -> list[Bmc]:
    """Handles for the emulator's first ``count`` systems, all behind ``proxy``."""
    return [pool.get(f"n{n}", parse_bmc_url(system(proxy, n)), credentials) for n in range(count)]


def one_try_pool(cooldown: float = 30.0) -> BmcPool:
    """No retries, and a breaker that opens on the second failure in a row."""
    return make_pool(
        call_timeout=2.0,
        retry=RetryPolicy(attempts=1),
        breaker_threshold=2,
        breaker_cooldown=cooldown,
    )


async def fail_twice(bmcs: list[Bmc]) -> None:
    """The first two systems fail once each: their address twice in a row."""
    for bmc in bmcs[:2]:
        with pytest.raises(BmcUnreachable):
            await bmc.power.state()


async def test_a_dead_address_fails_every_system_behind_it_fast(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), drop_ratio=1.0) as proxy:
        async with one_try_pool() as pool:
            bmcs = systems(pool, proxy, credentials, 3)
            await fail_twice(bmcs)
            assert bmcs[0].health.state == "unreachable"  # its address is
            seen = proxy.requests
            # The third system was never asked, yet it is refused without traffic.
            with pytest.raises(BmcBreakerOpen, match=f"127.0.0.1:{proxy.port}"):
                await bmcs[2].power.state()
            assert proxy.requests == seen
            assert bmcs[2].health.state == "unreachable"
            assert pool.breaker_states()["open"] == 3


async def test_bad_answers_from_one_system_do_not_close_its_address(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), error_ratio=1.0) as proxy:
        async with one_try_pool() as pool:
            first, second = systems(pool, proxy, credentials, 2)
            for _ in range(2):
                with pytest.raises(BmcServerError):
                    await first.power.state()
            assert first.health.state == "unreachable"  # its own breaker opened
            seen = proxy.requests
            with pytest.raises(BmcServerError):  # asked, not refused: the address answers
                await second.power.state()
            assert proxy.requests > seen  # (sushy itself asks twice on a 5xx)
            proxy.error_ratio = 0.0
            assert await second.power.state() is PowerState.OFF
            assert second.health.state == "ok"
            assert first.health.state == "unreachable"


async def test_after_the_cool_down_one_probe_goes_out_for_the_whole_address(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), drop_ratio=1.0) as proxy:
        async with one_try_pool(cooldown=0.5) as pool:
            bmcs = systems(pool, proxy, credentials, 4)
            await fail_twice(bmcs)
            await asyncio.sleep(0.6)
            seen = proxy.requests
            outcomes = await asyncio.gather(
                *(b.power.state() for b in bmcs), return_exceptions=True
            )
            # One probe reached the address; the other three were refused at once.
            assert proxy.requests == seen + 1
            refused = [o for o in outcomes if isinstance(o, BmcBreakerOpen)]
            assert len(refused) == 3, outcomes
            # The address comes back: the next probe closes it for every system.
            proxy.drop_ratio = 0.0
            await asyncio.sleep(0.6)
            assert await bmcs[3].power.state() is PowerState.OFF
            states = await asyncio.gather(*(b.power.state() for b in bmcs))
            assert states == [PowerState.OFF] * 4
            assert pool.breaker_states()["closed"] == 4
