"""The leak policy in the core, on both stores, against the real emulator:
a Critical leak powers the tray off at once and blocks its power-on until
cleared; two leaking trays drain the rack; a sensor fault is flagged, never
acted on; IPMI nodes are skipped quietly."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from bmc_peers import PASSWORD, USER, make_pool
from conftest import Rig, make_rig

from controller.bmc.gateway import PoolGateway
from controller.core.backoff import StepBackoff
from controller.core.errors import FailedPrecondition
from controller.core.fleet import Fleet
from controller.core.kinds import EventKind
from controller.core.model import BmcTarget, EnrollSpec, LeakReading
from controller.core.ports import Store, Tx
from controller.core.states import NodeState, PowerState
from controller.core.transitions import load_node
from controller.sim.fault_proxy import FaultProxy
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, make_systems
from controller.store.engine import default_sqlite_url, open_engine
from controller.store.secrets import SecretBox
from controller.store.sql_store import SqlStore

TRAY = "node-00001"


@contextlib.asynccontextmanager
async def _bare_and_leaking(
    bare: int,
) -> AsyncIterator[tuple[RedfishEmulator, RedfishEmulator]]:
    """An emulator of ``bare`` systems whose chassis have no leak detectors
    (bare-00000, ...) and one of two trays with them (node-00000, node-00001)."""
    async with (
        RedfishEmulator(
            make_systems(bare, prefix="bare-", power_state="On"),
            username=USER,
            password=PASSWORD,
            leak_detection=False,
        ) as no_leaks,
        RedfishEmulator(
            make_systems(2, power_state="On"), username=USER, password=PASSWORD
        ) as with_leaks,
    ):
        yield no_leaks, with_leaks


@pytest.mark.timeout(90)
async def test_critical_leak_powers_the_tray_off_at_once_and_blocks_power_on(rig: Rig) -> None:
    for name in ("node-00000", TRAY, "node-00002"):
        await rig.enroll(name)
    await rig.passes()
    assert await rig.events(EventKind.NODE_LEAK) == [], "dry detectors record nothing"

    await rig.emulator.set_leak_detector(TRAY, "ColdPlate", DetectorState="Critical")
    started = time.time()
    await rig.passes()
    assert await rig.emulator.system_power(TRAY) == "Off"
    assert time.time() - started < 10
    for other in ("node-00000", "node-00002"):
        assert await rig.emulator.system_power(other) == "On"

    node = await rig.record(TRAY)
    assert node.power_block.startswith("coolant leak: detector Cold plate leak detector")
    assert "/LeakDetectors/ColdPlate" in node.power_block
    assert node.state == NodeState.POWERED_OFF and node.drained
    assert node.power == PowerState.OFF
    (leak,) = await rig.events(EventKind.NODE_LEAK)
    assert leak.node == TRAY
    assert leak.data["state"] == "critical" and leak.data["detector_state"] == "Critical"
    assert leak.data["detector"] == rig.emulator.leak_detector_path(TRAY, "ColdPlate")
    assert leak.data["action"] == "power_off" and leak.data["rack"] == "r1"
    assert leak.data["read_at"] <= leak.at
    assert any(
        e.node == TRAY and e.data.get("action") == "force_off"
        for e in await rig.events(EventKind.NODE_POWER)
    )

    # Blocked: every way of powering it on is refused, naming the leak and the way out.
    for action in ("on", "cycle", "restart"):
        with pytest.raises(FailedPrecondition, match="kiln nodes clear-leak node-00001"):
            await rig.fleet.power(TRAY, action)
    target = (await rig.fleet.nodes.targets([await rig.record(TRAY)]))[0]
    with pytest.raises(FailedPrecondition, match="coolant leak"):
        await rig.fleet.bmc.set_power(target, "cycle")  # the preparation's reboot
    with pytest.raises(FailedPrecondition, match="clear-leak"):
        await rig.fleet.undrain(TRAY)
    assert (await rig.fleet.power(TRAY, "status")).power == PowerState.OFF
    assert await rig.emulator.system_power(TRAY) == "Off"

    # Still leaking: clearing is refused. A second pass records nothing new.
    with pytest.raises(FailedPrecondition, match="still reports Critical"):
        await rig.fleet.clear_leak(TRAY, "ticket 7")
    await rig.passes()
    assert len(await rig.events(EventKind.NODE_LEAK)) == 1

    # Dry again: recorded; the block stays until an operator clears it.
    await rig.emulator.set_leak_detector(TRAY, "ColdPlate", DetectorState="OK")
    await rig.passes()
    dry = (await rig.events(EventKind.NODE_LEAK))[-1]
    assert dry.data["state"] == "ok" and "stays blocked" in dry.reason
    assert (await rig.record(TRAY)).power_block
    with pytest.raises(FailedPrecondition):
        await rig.fleet.power(TRAY, "on")

    info = await rig.fleet.clear_leak(TRAY, "ticket 7: cold plate replaced")
    assert info.power_block == ""
    (cleared,) = await rig.events(EventKind.NODE_LEAK_CLEARED)
    assert cleared.reason == "ticket 7: cold plate replaced"
    assert cleared.data["cleared"] == node.power_block and cleared.data["rack"] == "r1"
    again = await rig.fleet.clear_leak(TRAY)  # idempotent: nothing more recorded
    assert again.power_block == "" and len(await rig.events(EventKind.NODE_LEAK_CLEARED)) == 1
    assert (await rig.fleet.power(TRAY, "on")).power == PowerState.ON
    assert await rig.emulator.system_power(TRAY) == "On"


@pytest.mark.timeout(90)
async def test_the_power_block_outlives_the_controller(
    emulator: RedfishEmulator, tmp_path: Path
) -> None:
    url = default_sqlite_url(tmp_path)
    key = SecretBox.from_key_file(tmp_path / "secret.key")  # the controller's, kept on disk
    first = SqlStore(open_engine(url), secrets=key)
    rig, gateway = await make_rig(first, emulator)
    for name in (TRAY, "node-00002", "node-00003"):
        await rig.enroll(name)
    await emulator.set_leak_detector(TRAY, "Manifold", DetectorState="Critical")
    await emulator.set_leak_detector("node-00002", "Manifold", DetectorState="Critical")
    await rig.passes()
    assert (await rig.record(TRAY)).power_block
    assert len(await rig.events(EventKind.RACK_ISOLATION_REQUESTED)) == 1
    await gateway.close()
    first.close()

    second = SqlStore(open_engine(url), secrets=SecretBox.from_key_file(tmp_path / "secret.key"))
    restarted, gateway = await make_rig(second, emulator)
    try:
        assert "Coolant manifold leak detector" in (await restarted.record(TRAY)).power_block
        with pytest.raises(FailedPrecondition, match="may not be powered on"):
            await restarted.fleet.power(TRAY, "on")
        assert await emulator.system_power(TRAY) == "Off"
        # The restarted watcher finds the leaks again (and says so), keeps the
        # trays off, and does not ask for the rack's isolation a second time.
        await restarted.passes(2)
        leaks = await restarted.events(EventKind.NODE_LEAK)
        assert sorted(e.node for e in leaks) == [TRAY, TRAY, "node-00002", "node-00002"]
        assert len(await restarted.events(EventKind.RACK_ISOLATION_REQUESTED)) == 1
        assert await emulator.system_power(TRAY) == "Off"
        assert (await restarted.record("node-00003")).drained
    finally:
        await gateway.close()
        second.close()


@pytest.mark.timeout(90)
async def test_two_leaking_trays_drain_the_rack_and_request_its_isolation_once(rig: Rig) -> None:
    rack = ["node-00000", "node-00001", "node-00002", "node-00003"]
    for name in rack:
        await rig.enroll(name, rack="r1")
    await rig.enroll("node-00004", rack="r2")

    await rig.emulator.set_leak_detector("node-00000", DetectorState="Critical")
    await rig.passes()
    assert await rig.events(EventKind.RACK_ISOLATION_REQUESTED) == [], "one tray is not a rack"
    assert not (await rig.record("node-00002")).drained

    await rig.emulator.set_leak_detector("node-00003", "Manifold", DetectorState="Critical")
    await rig.passes(2)
    for name in ("node-00000", "node-00003"):
        assert await rig.emulator.system_power(name) == "Off"
    (isolation,) = await rig.events(EventKind.RACK_ISOLATION_REQUESTED)
    assert isolation.data["rack"] == "r1"
    assert isolation.data["leaking"] == ["node-00000", "node-00003"]
    assert sorted(isolation.data["drained"]) == ["node-00001", "node-00002"]
    for name in ("node-00001", "node-00002"):
        node = await rig.record(name)
        assert node.drained and node.state == NodeState.DRAINING
        assert "rack r1 isolated: coolant leaks on 2 trays" in node.state_reason
        assert await rig.emulator.system_power(name) == "On", "drained, not powered off"
    other = await rig.record("node-00004")
    assert not other.drained and other.state != NodeState.DRAINING

    # Once per episode: more passes ask nothing more ...
    await rig.passes()
    assert len(await rig.events(EventKind.RACK_ISOLATION_REQUESTED)) == 1
    # ... until a leak of the rack is cleared and a pair leaks again.
    await rig.emulator.set_leak_detector("node-00000", DetectorState="OK")
    await rig.passes()
    await rig.fleet.clear_leak("node-00000", "repaired")
    await rig.emulator.set_leak_detector("node-00000", DetectorState="Critical")
    await rig.passes()
    assert len(await rig.events(EventKind.RACK_ISOLATION_REQUESTED)) == 2


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("fields", "why"),
    [
        pytest.param(
            {"DetectorState": "Critical", "Status": {"State": "UnavailableOffline"}},
            "Status.State is UnavailableOffline",
            id="offline-reading-critical",
        ),
        pytest.param({"DetectorState": None}, "no DetectorState", id="no-detector-state"),
        pytest.param(
            {"DetectorState": "OK", "Status": {"Health": "Critical"}},
            "Status.Health Critical",
            id="ok-but-health-critical",
        ),
    ],
)
async def test_a_sensor_fault_powers_nothing_off(rig: Rig, fields: dict, why: str) -> None:
    await rig.enroll(TRAY)
    await rig.emulator.set_leak_detector(TRAY, "ColdPlate", **fields)
    await rig.passes(2)
    assert await rig.emulator.system_power(TRAY) == "On"
    node = await rig.record(TRAY)
    assert node.power_block == "" and not node.drained
    (fault,) = await rig.events(EventKind.NODE_LEAK)
    assert fault.data["state"] == "fault" and fault.data["repair"] is True
    assert fault.data["action"] == "none"
    assert why in fault.reason and "flagged for repair" in fault.reason
    assert [e for e in await rig.events(EventKind.NODE_POWER) if e.node == TRAY] == []


@pytest.mark.timeout(60)
async def test_a_leak_warning_is_recorded_without_power_action(rig: Rig) -> None:
    await rig.enroll(TRAY)
    await rig.emulator.set_leak_detector(TRAY, "Manifold", DetectorState="Warning")
    await rig.passes()
    assert await rig.emulator.system_power(TRAY) == "On"
    (warning,) = await rig.events(EventKind.NODE_LEAK)
    assert warning.data["state"] == "warning" and "no power action" in warning.reason
    assert (await rig.record(TRAY)).power_block == ""


@pytest.mark.timeout(90)
async def test_a_leaking_tray_powered_on_behind_kilns_back_is_powered_off_again(
    rig: Rig,
) -> None:
    await rig.enroll(TRAY)
    await rig.emulator.set_leak_detector(TRAY, DetectorState="Critical")
    await rig.passes()
    assert await rig.emulator.system_power(TRAY) == "Off"
    # Someone powers it on at the BMC itself (not through Kiln).
    target = (await rig.fleet.nodes.targets([await rig.record(TRAY)]))[0]
    await rig.gateway.set_power(target, "on")
    assert await rig.emulator.system_power(TRAY) == "On"
    await rig.passes()
    assert await rig.emulator.system_power(TRAY) == "Off"
    assert len(await rig.events(EventKind.NODE_LEAK)) == 1, "the same leak, told once"


@pytest.mark.timeout(60)
async def test_ipmi_nodes_are_skipped_without_a_call_or_noise(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """An IPMI BMC where nothing answers: any call would time out, fail and
    be logged; none is made, so the passes are quick and silent."""
    await rig.fleet.enroll(
        EnrollSpec(
            name="ipmi-1",
            bmc_url=f"ipmi://127.0.0.1:{free_port()}",
            username=USER,
            password=PASSWORD,
            rack="r1",
        )
    )
    await rig.enroll(TRAY)
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="controller"):
        await rig.passes(3)
    assert time.monotonic() - started < 5
    about_ipmi = [r for r in caplog.records if "ipmi-1" in r.getMessage()]
    assert all(r.levelno == logging.DEBUG for r in about_ipmi), "nothing above debug"
    watcher = [r for r in about_ipmi if r.name == "controller.core.leaks"]
    assert len(watcher) == 1, "one debug line, then skipped"
    assert rig.gateway.health("ipmi-1") == "ok", "never failed: never asked"
    assert await rig.events(EventKind.NODE_LEAK) == []
    # The Redfish node beside it is watched all the same.
    await rig.emulator.set_leak_detector(TRAY, DetectorState="Critical")
    await rig.passes()
    assert await rig.emulator.system_power(TRAY) == "Off"


@pytest.mark.timeout(90)
async def test_clearing_with_unreadable_detectors_goes_ahead_and_a_later_critical_is_a_new_leak(
    rig: Rig,
) -> None:
    async with FaultProxy(("127.0.0.1", rig.emulator.port)) as proxy:
        url = f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{TRAY}"
        await rig.fleet.enroll(EnrollSpec(TRAY, url, USER, PASSWORD, rack="r1"))
        await rig.emulator.set_leak_detector(TRAY, DetectorState="Critical")
        await rig.passes()
        assert await rig.emulator.system_power(TRAY) == "Off"

        proxy.error_ratio = 1.0  # the BMC answers nothing but 500s
        info = await rig.fleet.clear_leak(TRAY, "inspected on site")
        assert info.power_block == ""
        (cleared,) = await rig.events(EventKind.NODE_LEAK_CLEARED)
        assert "500" in cleared.data["detectors_unread"] and PASSWORD not in str(cleared.data)

        proxy.error_ratio = 0.0  # it answers again, and the detector still reads Critical
        await rig.passes()
        assert (await rig.record(TRAY)).power_block, "blocked again"
        assert len(await rig.events(EventKind.NODE_LEAK)) == 2
        assert await rig.emulator.system_power(TRAY) == "Off"


class _CountingGateway(PoolGateway):
    """The real gateway, counting the leak detector reads asked of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leak_reads: Counter[str] = Counter()

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        self.leak_reads[target.node] += 1
        return await super().leak_detectors(target)


@pytest.mark.timeout(90)
async def test_a_bmc_without_leak_detectors_is_asked_again_only_after_rediscover(
    store: Store,
) -> None:
    """A Redfish chassis without detectors costs one read per ``rediscover``
    (not one per pass); a node beside it with detectors is read every pass,
    and its leak is acted on all the same."""
    async with _bare_and_leaking(2) as (no_leaks, with_leaks):
        gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
        fleet = Fleet(store, gateway)
        try:
            await fleet.nodes.loaded()
            for name, emulator in (("bare-00000", no_leaks), ("node-00001", with_leaks)):
                await fleet.enroll(
                    EnrollSpec(
                        name=name,
                        bmc_url=emulator.system_url(name),
                        username=USER,
                        password=PASSWORD,
                        rack="r1",
                    )
                )

            async def passes(count: int) -> None:
                for _ in range(count):
                    await fleet.leaks.run_once()
                    await fleet.leaks.settle()

            await passes(3)
            assert gateway.leak_reads == {"bare-00000": 1, "node-00001": 3}

            await with_leaks.set_leak_detector("node-00001", DetectorState="Critical")
            await passes(1)
            assert await with_leaks.system_power("node-00001") == "Off"
            assert gateway.leak_reads["bare-00000"] == 1, "still not asked again"

            fleet.leaks.rediscover = 0.0  # the next read of it comes due at once
            await passes(1)
            await passes(1)
            assert gateway.leak_reads["bare-00000"] == 3, "asked on each pass once due"
            events = [
                e for e in await fleet.events.since(0, limit=1000) if e.kind == EventKind.NODE_LEAK
            ]
            assert [e.node for e in events] == ["node-00001"]
        finally:
            await fleet.leaks.stop()
            await gateway.close()


@pytest.mark.timeout(120)
async def test_a_pass_looks_only_at_the_nodes_that_may_be_due(store: Store) -> None:
    """After the first pass, a pass looks at the nodes read every pass (with
    detectors), those saved since (a node enrolled is read by the very next
    pass) and those whose wait has ended, not at the whole fleet: 30 nodes
    without detectors cost nothing between their rediscovery reads."""
    async with _bare_and_leaking(30) as (no_leaks, with_leaks):
        gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
        fleet = Fleet(store, gateway)
        now = [1000.0]
        fleet.leaks.clock = lambda: now[0]
        fleet.leaks.rediscover, fleet.leaks.rediscover_max = 10.0, 10.0
        fleet.leaks.rediscover_jitter = 0.0
        watcher = fleet.leaks

        async def one_pass() -> int:
            before = watcher.looked
            await watcher.run_once()
            await watcher.settle()
            return watcher.looked - before

        try:
            await fleet.nodes.loaded()
            for i in range(30):
                name = f"bare-{i:05d}"
                await fleet.enroll(EnrollSpec(name, no_leaks.system_url(name), USER, PASSWORD))
            await fleet.enroll(
                EnrollSpec(TRAY, with_leaks.system_url(TRAY), USER, PASSWORD, rack="r1")
            )
            assert await one_pass() == 31  # the first: every node
            # The next looks at each node whose read ended (a node without
            # detectors then waits on a timer), then only at the one watched.
            looked = [await one_pass() for _ in range(3)]
            assert looked == [31, 1, 1], "only the node whose detectors are watched"
            assert gateway.leak_reads[TRAY] == 4
            assert all(gateway.leak_reads[f"bare-{i:05d}"] == 1 for i in range(30))

            late = "node-00000"
            await fleet.enroll(EnrollSpec(late, with_leaks.system_url(late), USER, PASSWORD))
            assert await one_pass() == 2 and gateway.leak_reads[late] == 1, "read at once"
            await with_leaks.set_leak_detector(late, DetectorState="Critical")
            assert await one_pass() >= 2
            assert await with_leaks.system_power(late) == "Off", "its leak acted on"

            now[0] += 10.0  # the bare nodes' wait is over: each is asked again, once
            assert await one_pass() >= 30
            assert all(gateway.leak_reads[f"bare-{i:05d}"] == 2 for i in range(30))
            assert await one_pass() >= 30  # their reads' ends
            assert await one_pass() <= 2
            assert all(gateway.leak_reads[f"bare-{i:05d}"] == 2 for i in range(30))
        finally:
            await fleet.leaks.stop()
            await gateway.close()


@pytest.mark.timeout(120)
async def test_a_restarted_watcher_goes_on_with_the_waits_of_bmcs_that_showed_none(
    store: Store,
) -> None:
    """The reads that showed no detectors are kept in the store: a watcher
    started anew (a restarted controller) asks those BMCs again when the one
    before would have, not at once; a BMC with detectors is read at once, a
    node whose BMC URL changed while it was down is read afresh, and a BMC
    that grew detectors has its kept look forgotten."""
    async with _bare_and_leaking(3) as (no_leaks, with_leaks):
        wall = [50_000.0]
        mono = [1000.0]

        def watcher_of(fleet: Fleet) -> None:
            fleet.leaks.clock = lambda: mono[0]
            fleet.leaks.wall = lambda: wall[0]
            fleet.leaks.rediscover, fleet.leaks.rediscover_max = 600.0, 3600.0
            fleet.leaks.rediscover_jitter = 0.0

        async def one_pass(fleet: Fleet) -> None:
            await fleet.leaks.run_once()
            await fleet.leaks.settle()

        gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
        before = Fleet(store, gateway)
        watcher_of(before)
        try:
            await before.nodes.loaded()
            for i in range(3):
                name = f"bare-{i:05d}"
                await before.enroll(EnrollSpec(name, no_leaks.system_url(name), USER, PASSWORD))
            await before.enroll(EnrollSpec(TRAY, with_leaks.system_url(TRAY), USER, PASSWORD))
            await one_pass(before)
            mono[0] += 600.0
            wall[0] += 600.0
            await one_pass(before)  # the bare BMCs' second read: the wait doubles to 1,200 s
            assert all(gateway.leak_reads[f"bare-{i:05d}"] == 2 for i in range(3))
        finally:
            await before.leaks.stop()
            await gateway.close()

        # Down for 300 s; a new process's monotonic clock starts elsewhere.
        wall[0] += 300.0
        mono[0] = 7.0
        gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
        after = Fleet(store, gateway)
        watcher_of(after)
        try:
            await after.nodes.loaded()
            moved = "bare-00002"  # re-pointed at the other BMC while the controller was down

            def repoint(tx: Tx) -> None:
                node = load_node(tx, moved)
                node.bmc_url = with_leaks.system_url("node-00000")
                tx.nodes.save(node)

            await store.tx(repoint)
            await one_pass(after)
            assert gateway.leak_reads[TRAY] == 1, "a BMC with detectors is read at once"
            assert gateway.leak_reads[moved] == 1, "a new BMC URL: read afresh"
            assert gateway.leak_reads["bare-00000"] == gateway.leak_reads["bare-00001"] == 0

            mono[0] += 899.0
            wall[0] += 899.0  # 1,199 s after their last read: not yet
            await one_pass(after)
            assert gateway.leak_reads["bare-00000"] == 0
            mono[0] += 2.0
            wall[0] += 2.0
            await one_pass(after)
            assert gateway.leak_reads["bare-00000"] == gateway.leak_reads["bare-00001"] == 1
            looks = await store.read(lambda tx: tx.nodes.leak_looks())
            assert looks["bare-00000"].none_streak == 3 and looks["bare-00000"].none_at == wall[0]
            assert moved not in looks and TRAY not in looks
        finally:
            await after.leaks.stop()
            await gateway.close()


@pytest.mark.timeout(90)
async def test_a_bmc_that_keeps_showing_no_detectors_is_asked_ever_less_often(
    store: Store,
) -> None:
    """Each read in a row that finds no detectors doubles the wait before the
    next, from ``rediscover`` up to ``rediscover_max``: 25,000 air-cooled
    boxes asked every 10 minutes would be 42 reads a second for ever."""
    bare = make_systems(1, prefix="bare-", power_state="On")
    async with RedfishEmulator(
        bare, username=USER, password=PASSWORD, leak_detection=False
    ) as no_leaks:
        gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
        fleet = Fleet(store, gateway)
        now = [1000.0]
        fleet.leaks.clock = lambda: now[0]
        fleet.leaks.rediscover, fleet.leaks.rediscover_max = 10.0, 40.0
        fleet.leaks.rediscover_jitter = 0.0
        try:
            await fleet.nodes.loaded()
            await fleet.enroll(
                EnrollSpec(
                    name="bare-00000",
                    bmc_url=no_leaks.system_url("bare-00000"),
                    username=USER,
                    password=PASSWORD,
                )
            )
            read_at = []
            for second in range(160):
                now[0] = 1000.0 + second
                before = gateway.leak_reads["bare-00000"]
                await fleet.leaks.run_once()
                await fleet.leaks.settle()
                if gateway.leak_reads["bare-00000"] > before:
                    read_at.append(second)
            gaps = [b - a for a, b in itertools.pairwise(read_at)]
            assert gaps[:3] == [10, 20, 40], read_at
            assert gaps[3:] and all(g == 40 for g in gaps[3:]), read_at  # the cap
        finally:
            await fleet.leaks.stop()
            await gateway.close()


@pytest.mark.timeout(90)
async def test_a_bmc_that_cannot_be_read_is_read_again_after_growing_delays(
    store: Store, emulator: RedfishEmulator
) -> None:
    """An unreachable BMC is read again after a doubling delay, not every
    pass (a fleet of dead BMCs held a restarted controller's core); a node
    beside it is read every pass all the same."""
    gateway = _CountingGateway(make_pool(call_timeout=5.0), power_timeout=20.0)
    fleet = Fleet(store, gateway)
    try:
        await fleet.nodes.loaded()
        dead = f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/dead-00000"
        await fleet.enroll(EnrollSpec("dead-00000", dead, USER, PASSWORD, rack="r1"))
        await fleet.enroll(EnrollSpec(TRAY, emulator.system_url(TRAY), USER, PASSWORD, rack="r1"))
        fleet.leaks.backoff = StepBackoff(first_delay_s=0.25, max_delay_s=1.0, jitter=0)
        passes = 0
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            await fleet.leaks.run_once()
            await fleet.leaks.settle()
            passes += 1
            await asyncio.sleep(0.02)
        # Read at 0, then after 0.25, 0.5, 1 and 1 s: five reads in 3 s (give
        # or take one for the time the reads themselves take).
        assert 4 <= gateway.leak_reads["dead-00000"] <= 6, (gateway.leak_reads, passes)
        assert gateway.leak_reads[TRAY] == passes > 20
    finally:
        await fleet.stop()


@pytest.mark.timeout(90)
async def test_bmcs_that_become_unreadable_are_said_in_one_line_a_pass(
    store: Store, emulator: RedfishEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A BMC network down makes every BMC unreadable at once: one line names
    how many and the first few, not one line each; a pass that finds no new
    one says nothing, and a single new one keeps its own line."""
    fleet = Fleet(store, PoolGateway(make_pool(call_timeout=5.0), power_timeout=20.0))
    caplog.set_level(logging.INFO, logger="controller.core.leaks")
    try:
        await fleet.nodes.loaded()
        await fleet.enroll(EnrollSpec(TRAY, emulator.system_url(TRAY), USER, PASSWORD, rack="r1"))
        dead = [f"dead-{i:05d}" for i in range(3)]
        for name in dead:
            url = f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/{name}"
            await fleet.enroll(EnrollSpec(name, url, USER, PASSWORD, rack="r2"))

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]

        await fleet.leaks.run_once()
        (line,) = said()
        assert line.startswith("leak detectors of 3 nodes newly unreadable")
        assert all(name in line for name in dead) and TRAY not in line
        caplog.clear()
        await fleet.leaks.run_once()  # still unreadable (and backing off): nothing new
        assert said() == []
        late = "dead-00009"
        url = f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/{late}"
        await fleet.enroll(EnrollSpec(late, url, USER, PASSWORD, rack="r2"))
        await fleet.leaks.run_once()
        (line,) = said()
        assert line.startswith(f"node {late}: leak detectors unreadable: ")
    finally:
        await fleet.stop()
