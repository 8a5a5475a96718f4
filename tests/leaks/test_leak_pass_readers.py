"""One leak watcher pass over many nodes: ``concurrency`` readers take the
nodes in turn, their BMC targets unsealed a batch at a time, against the
real sushy-tools emulator (with Kiln's leak detectors) on 127.0.0.1.

A first pass over a fleet once spawned a task per node and unsealed every
password in one read before any BMC was asked: 25,000 tasks and one long
unseal ahead of everything else on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc.gateway import PoolGateway
from controller.core.fleet import Fleet
from controller.core.model import BmcTarget, EnrollSpec, LeakReading
from controller.core.ports import Store
from controller.core.records import NodeRecord
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

NODES = 12
READERS = 3


class CountingGateway(PoolGateway):
    """The real gateway, counting the leak reads it is asked for, how many
    run at once, and how many tasks the event loop holds meanwhile."""

    def __init__(self) -> None:
        super().__init__(make_pool(call_timeout=5.0), power_timeout=20.0)
        self.reads: Counter[str] = Counter()
        self.order: list[str] = []  # every read, in the order begun
        self.started: list[float] = []  # when each began (monotonic)
        self.without: set[str] = set()  # nodes answered as having no detectors
        self.running = 0
        self.most_running = 0
        self.most_tasks = 0

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        self.reads[target.node] += 1
        self.order.append(target.node)
        self.started.append(time.monotonic())
        if target.node in self.without:  # an air-cooled box: its BMC shows none
            return []
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self.most_tasks = max(self.most_tasks, len(asyncio.all_tasks()))
        try:
            return await super().leak_detectors(target)
        finally:
            self.running -= 1


@pytest_asyncio.fixture
async def wide() -> AsyncIterator[RedfishEmulator]:
    systems = make_systems(NODES, power_state="On")
    async with RedfishEmulator(systems, username=USER, password=PASSWORD) as emu:
        yield emu


@pytest_asyncio.fixture
async def counted(
    store: Store, wide: RedfishEmulator
) -> AsyncIterator[tuple[Fleet, CountingGateway]]:
    """A Fleet (loops not started) with the emulator's nodes enrolled, on
    the counting gateway, its watcher at ``READERS`` readers."""
    gateway = CountingGateway()
    fleet = Fleet(store, gateway)
    try:
        await fleet.nodes.loaded()
        for i in range(NODES):
            name = f"node-{i:05d}"
            await fleet.enroll(EnrollSpec(name, wide.system_url(name), USER, PASSWORD, rack="r1"))
        fleet.leaks.concurrency = READERS
        yield fleet, gateway
    finally:
        await fleet.leaks.stop()
        await gateway.close()


async def one_pass(fleet: Fleet) -> None:
    """A pass, waited for to its last read."""
    await fleet.leaks.run_once()
    await fleet.leaks.settle()


EVERY_NODE_ONCE = {f"node-{i:05d}": 1 for i in range(NODES)}


def spy_on_targets(fleet: Fleet) -> list[int]:
    """The size of each batch of targets the watcher has unsealed."""
    batches: list[int] = []
    unseal = fleet.nodes.targets

    async def targets(nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        batches.append(len(nodes))
        return await unseal(nodes)

    fleet.nodes.targets = targets  # type: ignore[method-assign]
    return batches


@pytest.mark.timeout(90)
async def test_a_pass_reads_every_node_once_with_a_few_readers_and_batched_targets(
    counted: tuple[Fleet, CountingGateway],
) -> None:
    fleet, gateway = counted
    batches = spy_on_targets(fleet)
    before = len(asyncio.all_tasks())
    await one_pass(fleet)
    assert gateway.reads == EVERY_NODE_ONCE
    assert 2 <= gateway.most_running <= READERS  # side by side, never more
    # The readers, not a task per node (12 tasks more before).
    assert gateway.most_tasks - before <= READERS
    assert batches == [READERS] * (NODES // READERS)
    # A second pass reads every node again, with the targets kept.
    await one_pass(fleet)
    assert set(gateway.reads.values()) == {2}
    assert batches == [READERS] * (NODES // READERS)


@pytest.mark.timeout(90)
async def test_a_store_that_fails_to_unseal_ends_the_pass_and_the_next_reads_everyone(
    counted: tuple[Fleet, CountingGateway], caplog: pytest.LogCaptureFixture
) -> None:
    fleet, gateway = counted
    unseal = fleet.nodes.targets
    failures = [RuntimeError("the database is gone")]

    async def targets(nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        if failures:
            raise failures.pop()
        return await unseal(nodes)

    fleet.nodes.targets = targets  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR, logger="controller.core.leaks")
    await one_pass(fleet)
    assert not gateway.reads
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == f"leak detector pass: the BMC targets of {NODES} nodes unreadable"
    # Nothing is left marked as being read: the next pass reads them all.
    await one_pass(fleet)
    assert gateway.reads == EVERY_NODE_ONCE


@pytest.mark.timeout(90)
async def test_a_pass_that_outlasts_the_interval_finishes_before_the_next_begins(
    counted: tuple[Fleet, CountingGateway], caplog: pytest.LogCaptureFixture
) -> None:
    """More nodes than the readers get through in an interval: the next pass
    waits for this one to reach every node, so none is read twice first,
    and a warning says so once."""
    fleet, gateway = counted
    fleet.leaks.concurrency = 1
    caplog.set_level(logging.INFO, logger="controller.core.leaks")
    await fleet.leaks.run_once(timeout=0.001)  # one reader, 12 nodes: not done
    await fleet.leaks.run_once(timeout=0.001)
    await fleet.leaks.run_once(timeout=0.001)
    assert sum(gateway.reads.values()) < NODES
    said = [r.getMessage() for r in caplog.records]
    (behind,) = [m for m in said if "still has" in m]
    assert f"of {NODES} nodes to read (interval 5s)" in behind
    await fleet.leaks.settle()
    assert gateway.reads == EVERY_NODE_ONCE
    await fleet.leaks.run_once()  # a new pass, and the last one's length said
    assert set(gateway.reads.values()) == {2}
    (done,) = [r.getMessage() for r in caplog.records if "reached the last" in r.getMessage()]
    assert done.startswith(f"leak detectors: a pass over {NODES} nodes reached the last")


@pytest.mark.timeout(90)
async def test_a_pass_beyond_its_burst_hands_its_reads_out_over_the_interval(
    counted: tuple[Fleet, CountingGateway],
) -> None:
    """400 reads begun at once held the event loop (every agent's report
    waiting) for up to 0.7 s: past its burst, a pass hands its reads out
    evenly over ``spread`` of the interval, none before its turn."""
    fleet, gateway = counted
    fleet.leaks.concurrency = NODES  # nothing but the spread holds a read back
    fleet.leaks.interval, fleet.leaks.spread, fleet.leaks.burst = 1.0, 0.8, 2
    began = time.monotonic()
    await one_pass(fleet)
    assert gateway.reads == EVERY_NODE_ONCE
    starts = sorted(at - began for at in gateway.started)
    # The burst at once; then one every 0.8 s / 10: the k-th not before k/10 of it.
    turns = [0.0, 0.0] + [0.8 * k / (NODES - 2) for k in range(1, NODES - 1)]
    assert all(at >= turn - 0.005 for at, turn in zip(starts, turns, strict=True)), starts
    assert starts[-1] >= 0.795


@pytest.mark.timeout(90)
async def test_nodes_with_detectors_are_read_first_and_in_the_same_order_every_pass(
    counted: tuple[Fleet, CountingGateway],
) -> None:
    """The nodes whose detectors are watched lead every pass, by name; those
    only asked again whether they have any follow them."""
    fleet, gateway = counted
    fleet.leaks.concurrency = 1  # one reader: the reads in the pass's order
    fleet.leaks.rediscover = 0.0  # those without detectors are asked every pass
    gateway.without = {f"node-{i:05d}" for i in range(0, NODES, 2)}
    await one_pass(fleet)
    assert gateway.order == sorted(EVERY_NODE_ONCE)  # nothing known yet: by name
    watched = [f"node-{i:05d}" for i in range(1, NODES, 2)]
    for _ in range(2):
        gateway.order.clear()
        await one_pass(fleet)
        assert gateway.order == watched + sorted(gateway.without)
