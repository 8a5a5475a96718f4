"""Reading DMTF leak detectors through the BMC layer: the Redfish driver on
sushy-tools' emulator (with Kiln's leak detectors), broken answers through
a fault proxy, and IPMI, which has none. Both ways of reading them: in the
pool's threads through sushy (``leaks.readings``) and on the event loop
through the pool's aiohttp session (``leaks.poll``, the leak watcher's)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc import BmcCredentials, Health, parse_bmc_url
from controller.bmc.errors import BmcBadResponse
from controller.bmc.gateway import PoolGateway, leak_reading
from controller.core.errors import NotSupported
from controller.core.model import BmcTarget, DetectorHealth
from controller.sim.fault_proxy import FaultProxy, PayloadFault
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

CREDS = BmcCredentials(USER, PASSWORD)
COLLECTION = r"/LeakDetection/LeakDetectors$"
COLD_PLATE = r"/LeakDetectors/ColdPlate$"


def _via(proxy: FaultProxy, system: str = "node-00001") -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{system}"


@pytest.fixture(params=["readings", "poll"])
def way(request: pytest.FixtureRequest) -> str:
    """``readings`` (sushy, threads) or ``poll`` (aiohttp, the event loop)."""
    return str(request.param)


async def read(bmc: Any, way: str) -> list[Any]:
    return list(await getattr(bmc.leaks, way)())


@pytest.mark.timeout(60)
async def test_detectors_are_read_through_the_systems_own_chassis(
    emulator: RedfishEmulator, way: str
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("n1", parse_bmc_url(emulator.system_url("node-00001")), CREDS)
        readings = await read(bmc, way)
        tray = emulator.tray_chassis("node-00001")
        assert [r.id for r in readings] == ["ColdPlate", "Manifold"]
        assert readings[0].path == (
            f"/redfish/v1/Chassis/{tray}/ThermalSubsystem/LeakDetection/LeakDetectors/ColdPlate"
        )
        assert readings[0].name == "Cold plate leak detector"
        assert readings[0].detector_type == "Moisture"
        assert readings[0].physical_context == "GPUSubsystem"
        assert all(r.detector_state is Health.OK and r.status_state == "Enabled" for r in readings)
        assert all(r.problem == "" and abs(r.read_at - time.time()) < 30 for r in readings)

        await emulator.set_leak_detector("node-00001", "Manifold", DetectorState="Critical")
        manifold = (await read(bmc, way))[1]
        assert manifold.detector_state is Health.CRITICAL
        assert manifold.status_health is Health.CRITICAL  # the emulator keeps them in step
        # Another system's tray is another chassis: its detectors are dry.
        other = pool.get("n2", parse_bmc_url(emulator.system_url("node-00002")), CREDS)
        assert {r.detector_state for r in await read(other, way)} == {Health.OK}


@pytest.mark.timeout(60)
async def test_the_emulator_links_the_tray_as_the_dmtf_schema_does(
    emulator: RedfishEmulator,
) -> None:
    """System → Links.Chassis (the shared chassis first, then its tray) →
    Chassis.ThermalSubsystem → LeakDetection → LeakDetectors; the rest is
    sushy-tools' own (the shared chassis has no leak detection)."""
    tray = emulator.tray_chassis("node-00003")
    system = await _get(emulator, "/redfish/v1/Systems/node-00003")
    chassis = [link["@odata.id"] for link in system["Links"]["Chassis"]]
    assert chassis[-1] == f"/redfish/v1/Chassis/{tray}" and len(chassis) == 2
    doc = await _get(emulator, f"/redfish/v1/Chassis/{tray}")
    assert doc["ThermalSubsystem"] == {"@odata.id": f"/redfish/v1/Chassis/{tray}/ThermalSubsystem"}
    assert doc["Links"]["ComputerSystems"] == [{"@odata.id": system["@odata.id"]}]
    thermal = await _get(emulator, doc["ThermalSubsystem"]["@odata.id"])
    detection = await _get(emulator, thermal["LeakDetection"]["@odata.id"])
    collection = await _get(emulator, detection["LeakDetectors"]["@odata.id"])
    assert collection["Members@odata.count"] == 2
    shared = await _get(emulator, chassis[0])
    assert "ThermalSubsystem" not in shared
    with pytest.raises(RuntimeError, match="HTTP 404"):
        await _get(emulator, f"{chassis[0]}/ThermalSubsystem")
    # The simulation's setter refuses what a detector cannot report.
    with pytest.raises(RuntimeError, match="HTTP 400"):
        await emulator.set_leak_detector("node-00003", DetectorState="Wet")
    with pytest.raises(RuntimeError, match="HTTP 400"):
        await emulator.set_leak_detector("node-00003", Location="floor")


async def _get(emulator: RedfishEmulator, path: str) -> dict[str, Any]:
    return await asyncio.to_thread(emulator.request, "GET", path)


@pytest.mark.timeout(60)
async def test_a_bmc_without_leak_detection_answers_no_detectors(way: str) -> None:
    systems = make_systems(1, power_state="On")
    async with (
        RedfishEmulator(systems, username=USER, password=PASSWORD, leak_detection=False) as emu,
        make_pool() as pool,
    ):
        bmc = pool.get("n0", parse_bmc_url(emu.system_url("node-00000")), CREDS)
        assert await read(bmc, way) == []
        assert bmc.health.state == "ok"


@pytest.mark.timeout(30)
async def test_ipmi_has_no_leak_detectors_and_asks_nothing() -> None:
    """NotSupported at once: the BMC (a port where nothing answers) is never asked."""
    async with make_pool(call_timeout=3.0) as pool:
        gateway = PoolGateway(pool)
        target = BmcTarget(
            node="i1", url=f"ipmi://127.0.0.1:{free_port()}", username=USER, password=PASSWORD
        )
        started = time.monotonic()
        with pytest.raises(NotSupported, match="leak detection is not supported"):
            await gateway.leak_detectors(target)
        assert time.monotonic() - started < 0.5
        assert gateway.health("i1") == "ok"  # nothing failed: no call was made


@pytest.mark.timeout(60)
async def test_a_broken_detector_is_reported_the_others_still_count(
    emulator: RedfishEmulator, way: str
) -> None:
    await emulator.set_leak_detector("node-00001", "Manifold", DetectorState="Critical")
    faults = [PayloadFault.json(COLD_PLATE, {"Id": "ColdPlate", "DetectorState": 42})]
    async with (
        FaultProxy(("127.0.0.1", emulator.port), payload_faults=faults) as proxy,
        make_pool() as pool,
    ):
        bmc = pool.get("n1", parse_bmc_url(_via(proxy)), CREDS)
        cold, manifold = await read(bmc, way)
        assert cold.detector_state is None
        assert "DetectorState is the number 42, expected a string" in cold.problem
        assert manifold.detector_state is Health.CRITICAL and manifold.problem == ""

        proxy.payload_faults[:] = [
            PayloadFault.json(COLD_PLATE, {"Id": "ColdPlate", "DetectorState": "Wet"})
        ]
        cold, _ = await read(bmc, way)
        assert "'Wet' is not one of OK, Warning, Critical" in cold.problem
        proxy.payload_faults[:] = [
            PayloadFault(COLD_PLATE, b"<html>oops</html>", content_type="text/html")
        ]
        cold, _ = await read(bmc, way)
        assert "not JSON" in cold.problem
        assert PASSWORD not in cold.problem
        assert bmc.health.state == "ok"  # the BMC answered


@pytest.mark.timeout(60)
async def test_a_broken_collection_is_a_bad_answer_naming_it(
    emulator: RedfishEmulator, way: str
) -> None:
    faults = [PayloadFault.json(COLLECTION, {"Name": "Leak Detector Collection"})]
    async with (
        FaultProxy(("127.0.0.1", emulator.port), payload_faults=faults) as proxy,
        make_pool() as pool,
    ):
        bmc = pool.get("n1", parse_bmc_url(_via(proxy)), CREDS)
        with pytest.raises(BmcBadResponse) as info:
            await read(bmc, way)
        message = str(info.value)
        assert message.startswith(f"BMC 127.0.0.1:{proxy.port} sent a bad answer to leak detectors")
        assert "/ThermalSubsystem/LeakDetection/" in message and "Members is missing" in message
        assert PASSWORD not in message
        assert bmc.health.state == "degraded"


@pytest.mark.timeout(60)
async def test_a_leak_pass_reads_redfish_on_the_loop_as_the_threads_read_it(
    emulator: RedfishEmulator,
) -> None:
    """The leak watcher's reads (``PoolGateway.leak_detectors``) go through
    the event loop, no call reaching the pool's Redfish threads, and read
    what sushy reads in them."""
    await emulator.set_leak_detector("node-00002", "ColdPlate", DetectorState="Warning")
    async with make_pool() as pool:
        gateway = PoolGateway(pool)
        targets = [
            BmcTarget(f"n{i}", emulator.system_url(f"node-0000{i}"), USER, PASSWORD)
            for i in range(4)
        ]
        polled = await asyncio.gather(*(gateway.leak_detectors(t) for t in targets))
        assert pool.worker_stats()["redfish"].threads == 0  # no read went to a thread
        assert [r.detector_state for r in polled[2]] == [
            DetectorHealth.WARNING,
            DetectorHealth.OK,
        ]
        for target, readings in zip(targets, polled, strict=True):
            bmc = pool.get(target.node, parse_bmc_url(target.url), CREDS)
            threaded = [leak_reading(r) for r in await bmc.leaks.readings()]
            assert [replace(r, read_at=0.0) for r in threaded] == [
                replace(r, read_at=0.0) for r in readings
            ]
        assert pool.worker_stats()["redfish"].threads >= 1


@pytest.mark.timeout(60)
async def test_a_bmc_without_detectors_is_asked_afresh_one_with_them_keeps_its_collections(
    emulator: RedfishEmulator, way: str
) -> None:
    """The leak watcher asks a BMC that showed no detectors again only when
    it means to look afresh: that read must reach the BMC (the chassis chain
    walked again), not a remembered "none". Collections found are kept: a
    BMC with detectors, read every pass, is asked the collection and its
    members only."""
    systems = make_systems(1, prefix="bare-", power_state="On")
    async with (
        RedfishEmulator(systems, username=USER, password=PASSWORD, leak_detection=False) as bare,
        FaultProxy(("127.0.0.1", bare.port)) as bare_proxy,
        FaultProxy(("127.0.0.1", emulator.port)) as wet_proxy,
        make_pool() as pool,
    ):
        url = f"redfish+http://127.0.0.1:{bare_proxy.port}/redfish/v1/Systems/bare-00000"
        none = pool.get("b0", parse_bmc_url(url), CREDS)
        assert await read(none, way) == []
        first = bare_proxy.requests
        assert first >= 1
        assert await read(none, way) == []
        assert bare_proxy.requests == 2 * first, "the second look walked the chain again"

        wet = pool.get("n1", parse_bmc_url(_via(wet_proxy)), CREDS)
        assert len(await read(wet, way)) == 2
        walked = wet_proxy.requests
        assert len(await read(wet, way)) == 2
        # the collection and its two detectors, not the chassis chain again
        assert wet_proxy.requests - walked == 3
