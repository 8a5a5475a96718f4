"""The core's BmcGateway port over a real pool: the bulk power read the core's
power sync makes each interval, against a Redfish emulator and ipmi_sim."""

from __future__ import annotations

import pytest
from bmc_peers import PASSWORD, USER, ipmitool, make_pool

from controller.bmc import BmcCredentials, PowerAction, PowerState, RetryPolicy, parse_bmc_url
from controller.bmc.gateway import PoolGateway
from controller.core.errors import BmcAuthenticationFailed
from controller.core.model import BmcTarget
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator, make_systems


async def test_poll_power_reads_every_bmc_and_sees_changes_outside_kiln(
    credentials: BmcCredentials, closed_port: int
) -> None:
    async with RedfishEmulator(make_systems(3), username=USER, password=PASSWORD) as emu:
        async with IpmiSim("bmc-ipmi", USER, PASSWORD, power_on=True) as sim:
            # The simulator answers real IPMI before the gateway's first read.
            assert "Chassis Power is on" in await ipmitool(sim, USER, PASSWORD, "power", "status")
            # 10 s: a first IPMI session with a just-started ipmi_sim on a busy
            # machine can take more than 2. A second attempt covers a lost UDP
            # datagram in that first session (the ghost is refused at once either way).
            pool = make_pool(
                call_timeout=10.0, retry=RetryPolicy(attempts=2, base_delay=0.05, max_delay=0.1)
            )
            gateway = PoolGateway(pool)
            try:
                targets = [
                    BmcTarget(s.name, emu.system_url(s.name), USER, PASSWORD) for s in emu.systems
                ]
                targets.append(BmcTarget("ipmi-node", sim.address, USER, PASSWORD))
                ghost = f"redfish+http://127.0.0.1:{closed_port}/redfish/v1/Systems/x"
                targets.append(BmcTarget("ghost", ghost, USER, PASSWORD))
                assert gateway.health("ghost") == "unknown"  # never contacted
                await gateway.set_power(targets[0], "on")

                first = await gateway.poll_power(targets, concurrency=8)
                assert first == {
                    "node-00000": ("on", "ok"),
                    "node-00001": ("off", "ok"),
                    "node-00002": ("off", "ok"),
                    "ipmi-node": ("on", "ok"),
                    "ghost": (None, "degraded"),
                }
                # Powered off outside Kiln: through ipmitool, by the simulated chassis.
                await ipmitool(sim, USER, PASSWORD, "power", "off")
                second = await gateway.poll_power(targets, concurrency=8)
                assert second["ipmi-node"] == ("off", "ok")
                assert second["node-00000"] == ("on", "ok")
                # The gateway's handles are the pool's: one driver per BMC.
                handle = pool.get("ipmi-node", parse_bmc_url(sim.address), credentials)
                assert await handle.power.set(PowerAction.ON, timeout=20) is PowerState.ON
                assert (await gateway.poll_power(targets[3:4], 1))["ipmi-node"] == ("on", "ok")
            finally:
                await gateway.close()


async def test_a_changed_password_reaches_the_bmc_with_the_new_one() -> None:
    """The gateway keeps each node's handle while its target stays the same;
    a rotated password (or a new URL) is a new target, and the old handle is
    not used for it."""
    async with RedfishEmulator(make_systems(1), username=USER, password=PASSWORD) as emu:
        gateway = PoolGateway(make_pool(retry=RetryPolicy(attempts=1)))
        try:
            url = emu.system_url("node-00000")
            wrong = BmcTarget("node-00000", url, USER, "not-the-password")
            right = BmcTarget("node-00000", url, USER, PASSWORD)
            assert await gateway.power_state(right) == "off"
            assert await gateway.power_state(right) == "off"  # the same handle again
            with pytest.raises(BmcAuthenticationFailed):  # not the old password's handle
                await gateway.power_state(wrong)
            assert await gateway.power_state(right) == "off"
        finally:
            await gateway.close()
