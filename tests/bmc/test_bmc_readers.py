"""The BMC readers (``--bmc-readers``): the periodic BMC reads done by child
processes, against the real sushy-tools emulator (with Kiln's leak
detectors) and ports where nothing answers, all on 127.0.0.1.

A read through a reader must give what the controller's own pool gives:
the same values, the same Kiln error (class and message), no password;
a reader that dies fails its calls at once, its nodes are read by the
controller meanwhile, and it is started again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc.gateway import PoolGateway
from controller.bmc.reader import wire
from controller.bmc.reader.gateway import ReaderGateway
from controller.bmc.reader.readers import BmcReaders
from controller.core.errors import KilnError, NotSupported, Unavailable
from controller.core.gateway_layer import GatewayLayer
from controller.core.model import BmcTarget, DetectorHealth, LeakReading
from controller.core.power_sync import DEFAULT_POWER_SYNC_RATE
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

NODES = [f"node-{i:05d}" for i in range(4)]


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[RedfishEmulator]:
    async with RedfishEmulator(
        make_systems(len(NODES), power_state="On"), username=USER, password=PASSWORD
    ) as emu:
        yield emu


@pytest_asyncio.fixture
async def readers() -> AsyncIterator[BmcReaders]:
    started = BmcReaders(2, workers=8, call_timeout=3.0)
    started.start()
    try:
        assert await started.wait_ready(30.0), "the BMC readers did not start"
        yield started
    finally:
        await started.stop()


@pytest_asyncio.fixture
async def direct() -> AsyncIterator[PoolGateway]:
    gateway = PoolGateway(make_pool(call_timeout=3.0), power_timeout=20.0)
    try:
        yield gateway
    finally:
        await gateway.close()


class SpreadsSeen(GatewayLayer):
    """The controller's own gateway, noting the spread of each power pass."""

    def __init__(self, inner: PoolGateway) -> None:
        super().__init__(inner)
        self.spreads: list[float] = []

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        self.spreads.append(spread)
        return await self._inner.poll_power(targets, concurrency, spread=spread)


def target(emulator: RedfishEmulator, node: str) -> BmcTarget:
    return BmcTarget(node, emulator.system_url(node), USER, PASSWORD)


def unread(readings: list[LeakReading]) -> list[LeakReading]:
    """The readings without their read time (two reads differ there)."""
    return [dataclasses.replace(r, read_at=0.0) for r in readings]


def system_at(port: int) -> str:
    return f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1"


def stalled_port() -> tuple[socket.socket, int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


@pytest.mark.timeout(90)
async def test_reads_through_the_readers_are_the_controllers_own(
    emulator: RedfishEmulator, readers: BmcReaders, direct: PoolGateway
) -> None:
    gateway = ReaderGateway(PoolGateway(make_pool(call_timeout=3.0)), readers)
    targets = [target(emulator, n) for n in NODES]
    assert await direct.set_power(targets[1], "force_off") == "off"
    await emulator.set_leak_detector(NODES[2], "Manifold", DetectorState="Critical")
    try:
        assert {readers.slot(n) for n in NODES} == {0, 1}, "the nodes are spread over both"
        polled = await gateway.poll_power(targets, 4)
        assert polled == await direct.poll_power(targets, 4)
        assert polled[NODES[1]] == ("off", "ok") and polled[NODES[0]] == ("on", "ok")

        leaks = await gateway.leak_detectors(targets[2])
        assert unread(leaks) == unread(await direct.leak_detectors(targets[2]))
        assert any(r.detector_state == DetectorHealth.CRITICAL for r in leaks)
        assert all(r.read_at > 0 for r in leaks)

        temps = await gateway.thermal_c(targets[0])
        assert temps and temps == await direct.thermal_c(targets[0])
        assert readers.calls == 2 + 1 + 1  # a power pass per reader, the leak and thermal reads
        for pid in readers.pids():  # each reader's loop is uvloop's (its library is loaded)
            assert "uvloop" in Path(f"/proc/{pid}/maps").read_text(), pid
    finally:
        await gateway.close()  # stops the readers too
    assert readers.figures()["readers"] == 0


@pytest.mark.timeout(90)
async def test_a_readers_error_is_the_same_kiln_error_without_the_password(
    readers: BmcReaders, direct: PoolGateway
) -> None:
    gateway = ReaderGateway(PoolGateway(make_pool(call_timeout=3.0)), readers)
    ipmi = BmcTarget("i1", f"ipmi://127.0.0.1:{free_port()}", USER, PASSWORD)
    with pytest.raises(NotSupported) as through:
        await gateway.leak_detectors(ipmi)
    with pytest.raises(NotSupported) as here:
        await direct.leak_detectors(ipmi)
    assert str(through.value) == str(here.value)

    dead = BmcTarget("d1", system_at(free_port()), USER, PASSWORD)
    with pytest.raises(KilnError) as through_dead:
        await gateway.leak_detectors(dead)
    with pytest.raises(KilnError) as here_dead:
        await direct.leak_detectors(dead)
    assert type(through_dead.value) is type(here_dead.value)
    assert isinstance(through_dead.value, Unavailable)
    assert f"127.0.0.1:{dead.url.split(':')[2].split('/')[0]}" in str(through_dead.value)
    assert PASSWORD not in str(through_dead.value)

    polled = await gateway.poll_power([dead], 1)
    assert polled["d1"][0] is None and polled["d1"][1] != "ok"


def test_errors_cross_the_link_as_their_own_class() -> None:
    frame = wire.error_frame(7, NotSupported("leak detection", "IPMI BMC"))
    assert frame == (wire.ERROR, 7, "NotSupported", str(NotSupported("leak detection", "IPMI BMC")))
    rebuilt = wire.error_from(frame[2], frame[3])
    assert type(rebuilt) is NotSupported and str(rebuilt) == frame[3]
    # Anything not Kiln's own is Unavailable, naming only its type: its text may carry anything.
    other = wire.error_frame(8, RuntimeError(f"password={PASSWORD}"))
    assert other[2] == "Unavailable" and PASSWORD not in other[3] and "RuntimeError" in other[3]
    assert type(wire.error_from("NoSuchClass", "x")) is Unavailable


@pytest.mark.timeout(120)
async def test_a_reader_that_dies_fails_its_calls_and_is_started_again(
    emulator: RedfishEmulator,
) -> None:
    readers = BmcReaders(1, workers=8, call_timeout=20.0)
    readers.start()
    inner = SpreadsSeen(PoolGateway(make_pool(call_timeout=3.0)))
    gateway = ReaderGateway(inner, readers)
    sock, port = stalled_port()
    try:
        assert await readers.wait_ready(30.0)
        stalled = BmcTarget("s1", system_at(port), USER, PASSWORD)
        waiting = asyncio.create_task(gateway.leak_detectors(stalled))
        await asyncio.sleep(1.0)  # sent, and waiting for the BMC (20 s before a timeout)
        assert readers.figures()["in_flight"] == 1
        (pid,) = readers.pids()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Unavailable, match="BMC reader 0 ended before it answered"):
            await asyncio.wait_for(waiting, 10.0)

        # Until it is back (a pause of 1 s first), the controller reads its
        # nodes, a pass begun at once held to the controller's own rate.
        assert readers.figures()["readers"] == 0
        sent = readers.calls
        assert await gateway.poll_power([target(emulator, NODES[0])], 1) == {NODES[0]: ("on", "ok")}
        assert readers.calls == sent
        assert inner.spreads == [1 / DEFAULT_POWER_SYNC_RATE]

        assert await readers.wait_ready(30.0), "the reader was not started again"
        assert readers.restarts == 1 and readers.pids() != [pid]
        assert await gateway.poll_power([target(emulator, NODES[0])], 1) == {NODES[0]: ("on", "ok")}
        assert readers.calls == sent + 1
    finally:
        sock.close()
        await gateway.close()


@pytest.mark.timeout(60)
async def test_idle_handles_are_closed_and_made_anew_keeping_their_breakers(
    emulator: RedfishEmulator,
) -> None:
    """With readers, the controller's own handles serve only power changes
    and operators: ones idle long enough are closed (``release_idle``)."""
    pool = make_pool(call_timeout=2.0, breaker_threshold=1)
    gateway = PoolGateway(pool)
    dead = BmcTarget("d1", system_at(free_port()), USER, PASSWORD)
    try:
        targets = [target(emulator, n) for n in NODES[:2]]
        for t in targets:
            assert await gateway.power_state(t) == "on"
        with pytest.raises(Unavailable):
            await gateway.power_state(dead)
        assert gateway.health("d1") == "unreachable"

        assert gateway.release_idle(3600.0) == 0, "nothing has been idle an hour"
        later = time.monotonic() + 10.0
        assert gateway.release_idle(5.0, now=later) == 3
        assert [gateway.health(t.node) for t in targets] == ["unknown", "unknown"]

        # Made anew on the next call; the dead BMC's breaker was kept: it fails fast.
        assert await gateway.power_state(targets[0]) == "on"
        with pytest.raises(Unavailable, match="circuit breaker open"):
            await gateway.power_state(dead)
    finally:
        await gateway.close()


@pytest.mark.timeout(60)
async def test_releasing_closes_only_the_drivers_no_other_handle_uses(
    emulator: RedfishEmulator,
) -> None:
    pool = make_pool(call_timeout=2.0)
    gateway = PoolGateway(pool)
    try:
        shared = target(emulator, NODES[0])
        alias = dataclasses.replace(shared, node="alias-of-node-0")  # the same BMC and user
        other = target(emulator, NODES[1])
        for t in (shared, alias, other):
            assert await gateway.power_state(t) == "on"
        assert pool.release([alias.node]) == 0, "its driver still serves node-00000"
        assert pool.release([shared.node, other.node]) == 2
        assert pool.release([shared.node]) == 0, "already released"
    finally:
        await gateway.close()
