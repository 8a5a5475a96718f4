"""Resilience against injected faults (FaultProxy in front of the emulator)."""

from __future__ import annotations

import asyncio
import time

import pytest
from bmc_peers import make_pool

from controller.bmc import BmcCredentials, PowerAction, PowerState, RetryPolicy, parse_bmc_url
from controller.bmc.errors import BmcBreakerOpen
from controller.core.errors import Unavailable
from controller.sim.fault_proxy import FaultProxy
from controller.sim.redfish_emulator import RedfishEmulator


def via(proxy: FaultProxy, system: str = "node-00001") -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{system}"


@pytest.mark.parametrize(
    ("faults", "counter"),
    [
        pytest.param({"delay_s": 0.15}, "forwarded", id="latency"),
        pytest.param({"error_ratio": 0.4}, "errors", id="http-500"),
        pytest.param({"drop_ratio": 0.4}, "dropped", id="dropped-connections"),
    ],
)
async def test_transient_faults_are_retried_to_success(
    emulator: RedfishEmulator, credentials: BmcCredentials, faults: dict[str, float], counter: str
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), seed=3, **faults) as proxy:
        async with make_pool(
            call_timeout=3.0,
            retry=RetryPolicy(attempts=8, base_delay=0.02, max_delay=0.1),
            breaker_threshold=50,
        ) as pool:
            bmc = pool.get("node-1", parse_bmc_url(via(proxy)), credentials)
            for _ in range(4):
                assert await bmc.power.state() is PowerState.OFF
            assert await bmc.power.set(PowerAction.ON, timeout=20) is PowerState.ON
        assert getattr(proxy, counter) > 0, f"no {counter} injected: {vars(proxy)}"
        assert proxy.forwarded > 0


async def test_latency_beyond_timeout_fails_within_budget(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), delay_s=5.0) as proxy:
        async with make_pool(
            call_timeout=0.5, retry=RetryPolicy(attempts=2, base_delay=0.05)
        ) as pool:
            bmc = pool.get("node-1", parse_bmc_url(via(proxy)), credentials)
            started = time.monotonic()
            with pytest.raises(Unavailable):  # BmcTimeout or BmcUnreachable
                await bmc.power.state()
            assert time.monotonic() - started < 2 * 0.5 + 1.0


async def test_breaker_opens_fails_fast_and_recovers(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with FaultProxy(("127.0.0.1", emulator.port), error_ratio=1.0) as proxy:
        async with make_pool(
            call_timeout=2.0,
            retry=RetryPolicy(attempts=1),
            breaker_threshold=2,
            breaker_cooldown=0.5,
        ) as pool:
            bmc = pool.get("node-1", parse_bmc_url(via(proxy)), credentials)
            for _ in range(2):
                with pytest.raises(Unavailable):
                    await bmc.power.state()
            assert bmc.health.state == "unreachable"
            assert "500" in (bmc.health.last_error or "")
            seen = proxy.requests
            with pytest.raises(BmcBreakerOpen):
                await bmc.power.state()
            assert proxy.requests == seen  # failed fast: no traffic
            proxy.error_ratio = 0.0  # the BMC recovers
            await asyncio.sleep(0.6)
            assert await bmc.power.state() is PowerState.OFF  # half-open probe succeeds
            assert bmc.health.state == "ok"
