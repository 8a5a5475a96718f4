"""One contract suite per capability, run against every implementation:
Redfish (sushy-tools emulator) and IPMI (OpenIPMI ipmi_sim). After each
power action an independent client (redfishtool / ipmitool) must read the
same state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, ipmitool_power, make_pool, redfishtool_power

from controller.bmc import (
    Bmc,
    BmcCredentials,
    BootDevice,
    Health,
    PowerAction,
    PowerState,
    parse_bmc_url,
)
from controller.core.errors import NotSupported
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator, make_systems


@dataclass
class Subject:
    kind: str
    bmc: Bmc
    peer_power: Callable[[], Awaitable[str]]


@pytest_asyncio.fixture(params=["redfish", "ipmi"])
async def subject(
    request: pytest.FixtureRequest, credentials: BmcCredentials
) -> AsyncIterator[Subject]:
    # The pool is closed (sessions logged out) before the peer stops.
    if request.param == "redfish":
        async with RedfishEmulator(make_systems(2), username=USER, password=PASSWORD) as emu:
            async with make_pool() as pool:
                address = parse_bmc_url(emu.system_url("node-00001"))
                yield Subject(
                    "redfish",
                    pool.get("node-1", address, credentials),
                    lambda: redfishtool_power(emu, "node-00001", USER, PASSWORD),
                )
    else:
        async with IpmiSim("bmc0", USER, PASSWORD) as sim:
            async with make_pool() as pool:
                yield Subject(
                    "ipmi",
                    pool.get("node-1", parse_bmc_url(sim.address), credentials),
                    lambda: ipmitool_power(sim, USER, PASSWORD),
                )


async def test_power_cycle_of_states_agrees_with_independent_client(subject: Subject) -> None:
    power = subject.bmc.power
    assert await power.state() is PowerState.OFF
    assert await power.set(PowerAction.ON, timeout=20) is PowerState.ON
    assert await subject.peer_power() == "on"
    assert await power.set(PowerAction.CYCLE, timeout=20) is PowerState.ON
    assert await power.set(PowerAction.FORCE_OFF, timeout=20) is PowerState.OFF
    assert await subject.peer_power() == "off"
    assert await power.set(PowerAction.ON, timeout=20) is PowerState.ON
    assert await power.set(PowerAction.OFF, timeout=20) is PowerState.OFF
    assert await subject.peer_power() == "off"
    assert subject.bmc.health.state == "ok"


async def test_power_already_there_is_success(subject: Subject) -> None:
    assert await subject.bmc.power.set(PowerAction.OFF, timeout=5) is PowerState.OFF
    assert await subject.bmc.power.set(PowerAction.FORCE_OFF, timeout=5) is PowerState.OFF
    assert await subject.peer_power() == "off"


async def test_restart_from_off_powers_on(subject: Subject) -> None:
    assert await subject.bmc.power.set(PowerAction.RESTART, timeout=20) is PowerState.ON
    assert await subject.peer_power() == "on"


async def test_boot_override_pxe_then_disk(subject: Subject) -> None:
    await subject.bmc.boot.set(BootDevice.PXE)
    assert (await subject.bmc.boot.get()).device is BootDevice.PXE
    await subject.bmc.boot.set(BootDevice.DISK, persistent=True)
    assert (await subject.bmc.boot.get()).device is BootDevice.DISK


async def test_sensors_report_temperatures_and_health(subject: Subject) -> None:
    readings = await subject.bmc.sensors.readings()
    assert readings.temperatures, "no temperature sensor"
    for t in readings.temperatures:
        assert t.units == "C"
        assert t.value is not None and 0 < t.value < 120
    assert readings.health is Health.OK


async def test_inventory_answers(subject: Subject) -> None:
    inventory = await subject.bmc.inventory.get()
    if subject.kind == "redfish":
        assert inventory.manufacturer == "Sushy Emulator"
        assert [n.mac for n in inventory.nics] == ["52:54:00:00:00:01"]
    else:
        assert inventory.manufacturer is None  # ipmi_sim has no FRU data: None, not an error


async def test_event_log_is_a_list_or_not_supported(subject: Subject) -> None:
    if subject.kind == "redfish":
        # sushy-tools' fake driver has no LogServices.
        with pytest.raises(NotSupported, match="event log is not supported"):
            await subject.bmc.log.entries()
    else:
        assert await subject.bmc.log.entries() == []


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda b: b.bios.attributes(), id="bios"),
        pytest.param(lambda b: b.firmware.inventory(), id="firmware"),
    ],
)
async def test_bios_and_firmware_not_supported_here(
    subject: Subject, call: Callable[[Bmc], Awaitable[object]]
) -> None:
    # Neither the fake driver nor IPMI implement these (libvirt mode would).
    with pytest.raises(NotSupported, match="is not supported by this BMC"):
        await call(subject.bmc)
    assert subject.bmc.health.state == "ok"  # an answer, not a fault
