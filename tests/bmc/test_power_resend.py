"""A power command the BMC accepts and never carries out is sent once more,
reads answer while it is pending, and the failure names what happened.

The BMC is sushy-tools' emulator behind FaultProxy, which answers the reset
action ``204 No Content`` itself and never forwards it (``swallow``).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from bmc_peers import PASSWORD, USER, make_pool, redfishtool_power

from controller.bmc import BmcCredentials, PowerAction, PowerState, RetryPolicy, parse_bmc_url
from controller.bmc.errors import BmcPowerNotHonoured
from controller.bmc.gateway import PoolGateway
from controller.core.errors import BmcTimeout
from controller.core.model import BmcTarget
from controller.sim.fault_proxy import FaultProxy
from controller.sim.redfish_emulator import RedfishEmulator

RESET = "/Actions/ComputerSystem.Reset"


def via(proxy: FaultProxy, system: str) -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{system}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("action", "start", "command"),
    [
        pytest.param("on", "off", "power-on", id="power-on"),
        pytest.param("off", "on", "power-off", id="power-off"),
    ],
)
async def test_an_ignored_power_command_is_sent_twice_then_named(
    emulator: RedfishEmulator,
    credentials: BmcCredentials,
    action: str,
    start: str,
    command: str,
) -> None:
    system = emulator.systems[0]
    direct = BmcTarget("node-1", emulator.system_url(system.uuid), USER, PASSWORD)
    async with FaultProxy(("127.0.0.1", emulator.port), swallow=RESET) as proxy:
        pool = make_pool(call_timeout=3.0, retry=RetryPolicy(attempts=1))
        gateway = PoolGateway(pool, power_timeout=3.0, power_resend_after=1.0)
        try:
            if start == "on":
                assert await gateway.set_power(direct, "on") == "on"  # not through the proxy
                gateway.forget("node-1")
            target = BmcTarget("node-1", via(proxy, system.uuid), USER, PASSWORD)
            change = asyncio.create_task(gateway.set_power(target, action))
            await asyncio.sleep(0.3)
            # A status call while the change is pending answers at once.
            started = time.monotonic()
            assert await gateway.power_state(target) == start
            assert time.monotonic() - started < 0.5
            assert not change.done()
            with pytest.raises(BmcPowerNotHonoured) as caught:
                await change
        finally:
            await gateway.close()
    assert proxy.swallowed == 2  # the command, and the one re-send
    assert f"{command} not honoured after 2 attempts" in str(caught.value)
    assert f"still {start} after 3s" in str(caught.value)
    assert isinstance(caught.value, BmcTimeout)  # callers treating timeouts still do
    assert await redfishtool_power(emulator, system.name, USER, PASSWORD) == start


@pytest.mark.timeout(60)
async def test_a_lost_power_on_lands_when_sent_again(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    system = emulator.systems[1]
    async with FaultProxy(("127.0.0.1", emulator.port), swallow=RESET, swallow_limit=1) as proxy:
        async with make_pool(call_timeout=3.0, power_resend_after=1.0) as pool:
            bmc = pool.get("node-2", parse_bmc_url(via(proxy, system.uuid)), credentials)
            started = time.monotonic()
            assert await bmc.power.set(PowerAction.ON, timeout=10.0) is PowerState.ON
            took = time.monotonic() - started
    assert proxy.swallowed == 1
    assert 1.0 <= took < 10.0  # waited the re-send delay, not the whole timeout
    assert await redfishtool_power(emulator, system.name, USER, PASSWORD) == "on"


@pytest.mark.timeout(60)
async def test_a_power_change_shorter_than_the_resend_delay_is_sent_once(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    system = emulator.systems[2]
    async with FaultProxy(("127.0.0.1", emulator.port), swallow=RESET) as proxy:
        async with make_pool(call_timeout=3.0, retry=RetryPolicy(attempts=1)) as pool:
            bmc = pool.get("node-3", parse_bmc_url(via(proxy, system.uuid)), credentials)
            with pytest.raises(BmcPowerNotHonoured, match="power-on not honoured after 1 attempt "):
                await bmc.power.set(PowerAction.ON, timeout=1.5)  # default re-send: 30 s
    assert proxy.swallowed == 1
