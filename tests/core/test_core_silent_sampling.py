"""Nodes whose agents fell silent are watched through their BMCs' thermal
sensors: after a grace from the controller's start, their BMCs read
together (not one after another), an unreadable one logged once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import Racks
from core_fakes import FakeBmc

from controller.core.fleet import Fleet
from controller.core.model import BmcTarget

pytestmark = pytest.mark.timeout(60)

NODES = [f"h{i}" for i in range(1, 7)]


class SlowThermalBmc(FakeBmc):
    """A fake BMC whose thermal reads take 50 ms, counted while in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_at_once = 0
        self.thermal_reads: list[str] = []

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            self.thermal_reads.append(target.node)
            return await super().thermal_c(target)
        finally:
            self.in_flight -= 1


@pytest.fixture
def bmc() -> FakeBmc:
    return SlowThermalBmc()


@pytest.fixture
async def silent_fleet(
    make_fleet: Callable[..., Fleet], bmc: SlowThermalBmc
) -> AsyncIterator[Fleet]:
    """Six ready H200 boxes, powered on, whose agents have all gone."""
    fleet = make_fleet()
    async with contextlib.AsyncExitStack() as stack:
        racks = Racks(fleet, stack)
        for name in NODES:
            await racks.add([name], rack=f"r-{name}", gpu_count=8, model="NVIDIA H200")
        for name in NODES:
            fleet.agents.drop(name)
        policies = fleet.policies
        policies.silent_after = 0.6
        policies.bmc_sample_interval = 30.0  # one read each in this test
        policies.tick_interval = 0.05
        yield fleet
        await fleet.stop()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_silent_nodes_are_read_together_after_a_grace_from_start(
    silent_fleet: Fleet, bmc: SlowThermalBmc
) -> None:
    policies = silent_fleet.policies
    loop = asyncio.get_running_loop()
    started = loop.time()
    runner = asyncio.create_task(policies.run())
    try:
        # The stored last reports are old, but a controller just started
        # gives agents silent_after to come back first.
        await asyncio.sleep(0.3)
        assert bmc.thermal_reads == []
        await until(lambda: len(bmc.thermal_reads) == len(NODES))
        assert loop.time() - started >= 0.6
        assert sorted(bmc.thermal_reads) == NODES
        assert bmc.most_at_once == len(NODES)  # together, not one after another
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_an_unreadable_bmc_is_logged_once_not_every_scan(
    silent_fleet: Fleet, bmc: SlowThermalBmc, caplog: pytest.LogCaptureFixture
) -> None:
    policies = silent_fleet.policies
    policies.bmc_sample_interval = 0.1  # read again every scan
    bmc.unreachable.add("h1")
    caplog.set_level(logging.INFO, logger="controller.core.health_policy")
    runner = asyncio.create_task(policies.run())
    try:
        await until(lambda: bmc.calls.count(("h1", "thermal")) >= 3)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    unreadable = [
        r for r in caplog.records if "h1: BMC thermal (agent silent) unreadable" in r.message
    ]
    assert len(unreadable) == 1, [r.message for r in unreadable]
    assert bmc.thermal_reads.count("h2") >= 2  # the others kept being read


async def test_the_silent_nodes_follow_agents_that_come_and_go_and_power_that_changes(
    silent_fleet: Fleet, bmc: SlowThermalBmc
) -> None:
    """The silent nodes are kept by change (``KeptNames``), not found by a
    look at every node: an agent back, an agent gone and a node powered off
    behind Kiln's back each change which BMCs are read from the next scan."""
    policies = silent_fleet.policies
    policies.bmc_sample_interval = 0.1  # read again every scan
    for name in NODES[3:]:
        silent_fleet.agents.attach(name)  # h4-h6 have their agents
    runner = asyncio.create_task(policies.run())

    async def read_next() -> set[str]:
        """The nodes the scans read, once every one read is read again."""
        await until(lambda: bool(bmc.thermal_reads))
        bmc.thermal_reads.clear()
        await asyncio.sleep(0.5)  # several scans
        return set(bmc.thermal_reads)

    try:
        assert await read_next() == {"h1", "h2", "h3"}
        silent_fleet.agents.attach("h1")  # back
        silent_fleet.agents.drop("h4")  # gone
        bmc.power.update({name: "on" for name in NODES})
        bmc.power["h2"] = "off"  # behind Kiln's back: power sync writes it
        silent_fleet.power_sync.vouched_every = 1
        await silent_fleet.power_sync.run_once()
        assert (await silent_fleet.get_node("h2")).power.value == "off"
        assert await read_next() == {"h3", "h4"}
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
