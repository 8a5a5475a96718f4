"""IPMI-only behaviour against OpenIPMI's ipmi_sim."""

from __future__ import annotations

import asyncio
import logging

import pytest
from bmc_peers import PASSWORD, USER, ipmitool, make_pool

from controller.bmc import BmcCredentials, BootDevice, Health, PowerAction, parse_bmc_url
from controller.core.errors import BmcAuthenticationFailed, NotSupported
from controller.sim.ipmi_sim import IpmiSim


async def test_heat_shows_in_sensors_and_sel(
    ipmi_sim: IpmiSim, credentials: BmcCredentials
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("node-1", parse_bmc_url(ipmi_sim.address), credentials)
        cool = await bmc.sensors.readings()
        assert cool.health is Health.OK
        assert cool.power_watts == 700
        ipmi_sim.set_temperature(99)  # above upper critical (95)
        for _ in range(40):  # the simulator polls the file every second
            hot = await bmc.sensors.readings()
            if hot.temperatures[0].value == 99:
                break
            await asyncio.sleep(0.1)
        assert hot.temperatures[0].value == 99
        assert hot.temperatures[0].health is Health.CRITICAL
        assert hot.health is Health.CRITICAL
        entries = await bmc.log.entries()
        messages = [e.message for e in entries]
        assert "GPU Temp: Upper critical" in messages
        critical = [e for e in entries if e.message == "GPU Temp: Upper critical"]
        assert critical[0].severity is Health.CRITICAL


async def test_boot_device_matches_ipmitool(ipmi_sim: IpmiSim, credentials: BmcCredentials) -> None:
    async with make_pool() as pool:
        bmc = pool.get("node-1", parse_bmc_url(ipmi_sim.address), credentials)
        await bmc.boot.set(BootDevice.CD)
        assert ipmi_sim.boot_device() == "cdrom"
        out = await ipmitool(ipmi_sim, USER, PASSWORD, "chassis", "bootparam", "get", "5")
        assert "Force Boot from CD/DVD" in out
        assert (await bmc.boot.get()).device is BootDevice.CD
        with pytest.raises(NotSupported, match="boot from uefi_http"):
            await bmc.boot.set(BootDevice.UEFI_HTTP)


@pytest.mark.parametrize("capability", ["vmedia", "bios", "firmware"])
async def test_ipmi_has_no_vmedia_bios_firmware(
    ipmi_sim: IpmiSim, credentials: BmcCredentials, capability: str
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("node-1", parse_bmc_url(ipmi_sim.address), credentials)
        calls = {
            "vmedia": lambda: bmc.vmedia.insert("http://127.0.0.1:1/x.iso"),
            "bios": lambda: bmc.bios.set({"ProcTurboMode": "Enabled"}),
            "firmware": lambda: bmc.firmware.update("http://127.0.0.1:1/fw.bin"),
        }
        with pytest.raises(NotSupported, match="is not supported by this BMC"):
            await calls[capability]()


async def test_wrong_password_is_auth_failure_without_leak(
    ipmi_sim: IpmiSim, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Not-The-Ipmi-Pw-42"
    caplog.set_level(logging.DEBUG)
    async with make_pool() as pool:
        bmc = pool.get("node-1", parse_bmc_url(ipmi_sim.address), BmcCredentials(USER, wrong))
        with pytest.raises(BmcAuthenticationFailed) as info:
            await bmc.power.state()
        assert wrong not in str(info.value)
        assert bmc.health.state == "ok"
    assert wrong not in caplog.text
    assert "retry" not in caplog.text


@pytest.mark.parametrize("earlier_pool_closed", [True, False])
async def test_a_bmc_restarted_on_an_address_answers_a_new_driver_at_once(
    credentials: BmcCredentials, earlier_pool_closed: bool
) -> None:
    """pyghmi caches sessions per BMC address and user, and hands a cached one
    to the next ``Command``. A BMC restarted at the same address (here: a new
    ipmi_sim on the port of a stopped one) knows none of the old sessions;
    the new driver must log in afresh, not inherit the dead session (the
    earlier pool's logout got no answer, or it was never closed)."""
    first = IpmiSim("bmc-before", USER, PASSWORD)
    await first.start()
    earlier = make_pool()
    await earlier.__aenter__()
    try:
        old = earlier.get("node-1", parse_bmc_url(first.address), credentials)
        assert (await old.power.state()).value == "off"
        await first.stop()
        if earlier_pool_closed:
            await earlier.close()
        again = IpmiSim("bmc-after", USER, PASSWORD, port=first.port)
        await again.start()
        try:
            async with make_pool() as pool:
                bmc = pool.get("node-1", parse_bmc_url(again.address), credentials)
                assert (await bmc.power.set(PowerAction.ON, timeout=20)).value == "on"
                assert bmc.health.state == "ok"
            assert again.power_state() == "on"
        finally:
            await again.stop()
    finally:
        await earlier.close()
