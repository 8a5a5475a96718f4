"""BIOS and firmware against sushy-tools' libvirt driver on libvirt's
in-process test driver (RedfishEmulator(backend="libvirt-test")).

Needs the ``libvirt-python`` package (build dependency: Debian ``libvirt-dev``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, make_pool, redfishtool_system

from controller.bmc import Bmc, BmcCredentials, PowerAction, PowerState, parse_bmc_url
from controller.core.errors import BmcError
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

SYSTEM = "node-00001"


@pytest_asyncio.fixture
async def libvirt_emulator() -> AsyncIterator[RedfishEmulator]:
    if importlib.util.find_spec("libvirt") is None:
        pytest.fail(
            "libvirt-python is required for the BIOS/firmware tests (pip install libvirt-python)"
        )
    async with RedfishEmulator(
        make_systems(2), backend="libvirt-test", username=USER, password=PASSWORD
    ) as emu:
        yield emu


@pytest_asyncio.fixture
async def bmc(libvirt_emulator: RedfishEmulator, credentials: BmcCredentials) -> AsyncIterator[Bmc]:
    async with make_pool() as pool:
        yield pool.get("node-1", parse_bmc_url(libvirt_emulator.system_url(SYSTEM)), credentials)


async def test_bios_attributes_set_and_read_back(bmc: Bmc) -> None:
    before = await bmc.bios.attributes()
    assert before["ProcTurboMode"] == "Enabled"
    await bmc.bios.set({"ProcTurboMode": "Disabled"})
    assert (await bmc.bios.pending())["ProcTurboMode"] == "Disabled"
    # Applied at the next reboot on real BMCs; the emulator applies at once.
    assert await bmc.power.set(PowerAction.CYCLE, timeout=20) is PowerState.ON
    after = await bmc.bios.attributes()
    assert after["ProcTurboMode"] == "Disabled"
    assert {k: v for k, v in after.items() if k != "ProcTurboMode"} == {
        k: v for k, v in before.items() if k != "ProcTurboMode"
    }


async def test_firmware_update_is_followed_and_verified(
    bmc: Bmc, libvirt_emulator: RedfishEmulator
) -> None:
    assert [(c.id, c.version) for c in await bmc.firmware.inventory()] == [("BIOS", "1.0.0")]
    peer = await redfishtool_system(libvirt_emulator, SYSTEM, USER, PASSWORD)
    target = peer["@odata.id"]
    after = await bmc.firmware.update(
        "http://127.0.0.1:9/bios-1.1.0.bin", [target], timeout=60, expected_version="1.1.0"
    )
    assert [(c.id, c.version) for c in after] == [("BIOS", "1.1.0")]
    peer = await redfishtool_system(libvirt_emulator, SYSTEM, USER, PASSWORD)
    assert peer["BiosVersion"] == "1.1.0"
    with pytest.raises(BmcError, match=r"no component reports 9\.9\.9"):
        await bmc.firmware.update("http://127.0.0.1:9/x.bin", [target], expected_version="9.9.9")


async def test_inventory_has_cpus_and_memory(bmc: Bmc) -> None:
    inventory = await bmc.inventory.get()
    assert inventory.cpu_count == 2
    assert inventory.memory_gib == 1.0
    assert [n.mac for n in inventory.nics] == ["52:54:00:00:00:01"]
