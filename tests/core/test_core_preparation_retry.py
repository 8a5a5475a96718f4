"""A preparation that cannot succeed ends: a permanent failure (the BMC has
no firmware inventory) quarantines at once, a transient one (the BMC is
unreachable) is retried with exponential backoff per node and quarantines
after a bounded number of attempts, one warning per attempt — on both stores."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import gpus, reconcile, spec
from core_fakes import FakeBmc, answering

from controller.core.errors import BmcUnreachable, NotSupported
from controller.core.fleet import Fleet
from controller.core.lifecycle import RetryPolicy
from controller.core.model import AllocationSpec
from controller.core.profiles import ProfileCatalog, parse_profile
from controller.core.states import AllocationState, NodeState

FW = parse_profile(
    {
        "version": "v1",
        "name": "fw",
        "firmware": [{"component": "BMC", "version": "1.0", "image": "http://img/bmc-1.0.bin"}],
    },
    "test",
)
INVENTORY = {"BMC": "1.0"}  # already at the baseline: nothing to update


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Bed:
    """A fleet whose nodes are prepared to profile ``fw`` through ``FakeBmc``."""

    def __init__(self, fleet: Fleet, bmc: FakeBmc, stack: contextlib.AsyncExitStack) -> None:
        self.fleet, self.bmc, self._stack = fleet, bmc, stack
        self.clock = Clock()
        fleet.lifecycle.clock = self.clock
        fleet.lifecycle.retry = RetryPolicy(first_delay_s=1.0, max_delay_s=4.0, max_attempts=5)
        bmc.firmware = dict(INVENTORY)

    async def add(self, names: list[str], profile: str = "fw") -> None:
        for name in names:
            await self.fleet.enroll(spec(name, "r1", profile=profile))
        await reconcile(self.fleet)
        for name in names:
            session = await self.fleet.agent_connected(name, gpus(4, "NVIDIA GB200", "r1"), "")
            await self._stack.enter_async_context(answering(self.fleet.agents, session))

    def firmware_reads(self, name: str) -> int:
        return sum(1 for node, op in self.bmc.calls if (node, op) == (name, "firmware"))

    async def state(self, name: str) -> tuple[NodeState, str]:
        node = await self.fleet.get_node(name)
        return node.state, node.state_reason


@pytest.fixture
async def bed(make_fleet: Callable[..., Fleet], bmc: FakeBmc) -> AsyncIterator[Bed]:
    fleet = make_fleet(ProfileCatalog({"fw": FW}))
    async with contextlib.AsyncExitStack() as stack:
        yield Bed(fleet, bmc, stack)
        await fleet.stop()


@pytest.mark.timeout(60)
async def test_a_bmc_without_firmware_inventory_quarantines_at_once(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    bed.bmc.firmware_errors["n1"] = NotSupported("firmware inventory")
    caplog.set_level(logging.WARNING, logger="controller.core.lifecycle")
    await bed.add(["n1", "n2"])
    await reconcile(bed.fleet, passes=6)
    state, reason = await bed.state("n1")
    assert state == NodeState.QUARANTINED
    assert reason == "cannot reach profile fw: firmware inventory is not supported by this BMC"
    assert bed.firmware_reads("n1") == 1  # no retry: nothing would change
    assert (await bed.state("n2"))[0] == NodeState.READY  # its neighbour is unaffected
    warnings = [r.getMessage() for r in caplog.records if "n1" in r.getMessage()]
    assert warnings == [f"node n1: quarantined: {reason}"]


@pytest.mark.timeout(60)
async def test_an_unreachable_bmc_backs_off_exponentially_then_quarantines(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    bed.bmc.firmware_errors["n1"] = BmcUnreachable(host="fake://n1", reason="no route")
    caplog.set_level(logging.WARNING, logger="controller.core.lifecycle")
    await bed.add(["n1"])
    attempts_at: list[float] = []
    for _ in range(40):  # 40 passes, 0.5 s apart on the lifecycle's clock
        before = bed.firmware_reads("n1")
        await reconcile(bed.fleet, passes=1)
        if bed.firmware_reads("n1") > before:
            attempts_at.append(bed.clock.now)
        if (await bed.state("n1"))[0] != NodeState.PREPARING:
            break
        bed.clock.now += 0.5
    start = attempts_at[0]
    assert [t - start for t in attempts_at] == [0, 1, 3, 7, 11]  # waits 1, 2, 4, 4 (capped)
    state, reason = await bed.state("n1")
    assert state == NodeState.QUARANTINED
    assert reason == (
        "cannot reach profile fw: BMC fake://n1 is unreachable: no route (after 5 attempts)"
    )
    messages = [r.getMessage() for r in caplog.records if "n1" in r.getMessage()]
    assert len(messages) == 5  # one per attempt, not one per pass
    assert messages[0] == (
        "node n1: preparation attempt 1 of 5 failed, next in 1s: "
        "BMC fake://n1 is unreachable: no route"
    )
    assert messages[-1] == f"node n1: quarantined: {reason}"


@pytest.mark.timeout(60)
async def test_a_transient_failure_that_clears_ends_ready_and_says_why_it_waited(
    bed: Bed,
) -> None:
    bed.bmc.firmware_errors["n1"] = BmcUnreachable(host="fake://n1", reason="no route")
    await bed.add(["n1"])
    await reconcile(bed.fleet, passes=3)
    state, reason = await bed.state("n1")
    assert state == NodeState.PREPARING
    assert reason.startswith("preparation attempt 1 of 5 failed, next in 1s: BMC fake://n1")
    del bed.bmc.firmware_errors["n1"]  # the BMC is back
    bed.clock.now += 1
    await reconcile(bed.fleet, passes=2)
    assert await bed.state("n1") == (NodeState.READY, "prepared to fw")


@pytest.mark.timeout(60)
async def test_a_node_failing_its_allocations_preparation_is_replaced(bed: Bed) -> None:
    await bed.add(["n1", "n2", "n3"], profile="")
    await reconcile(bed.fleet)
    alloc = await bed.fleet.create_allocation("job", AllocationSpec(nodes=1, profile="fw"))
    assert alloc.state == AllocationState.PREPARING
    (first,) = alloc.nodes
    bed.bmc.firmware_errors[first] = NotSupported("firmware inventory")
    await reconcile(bed.fleet, passes=6)
    after = await bed.fleet.get_allocation(alloc.id)
    assert first not in after.nodes and len(after.nodes) == 1
    assert after.state == AllocationState.READY
    assert (await bed.state(first))[0] == NodeState.QUARANTINED
