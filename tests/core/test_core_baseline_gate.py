"""Health between preparations: a ready node whose latest report fails the
fleet's baseline gate takes no new work (the reason shows with its state),
and takes work again as soon as a passing report comes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import Racks

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import AllocationSpec
from controller.core.states import AllocationState

pytestmark = pytest.mark.timeout(60)


def report(*, nvlink_down: tuple[int, ...] = (), dbe: int = 0) -> HealthReport:
    gpus = tuple(
        GpuHealth(
            index=i, temp_c=40.0, nvlink_down=nvlink_down if i == 0 else (), ecc_dbe_volatile=dbe
        )
        for i in range(4)
    )
    return HealthReport(sampled_at=1.0, gpus=gpus)


@contextlib.asynccontextmanager
async def fleet_of(make: Callable[..., Fleet], **options: object) -> AsyncIterator[Fleet]:
    fleet = make(**options)
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(["n1"], rack="r1", domain="n1")
        yield fleet
        await fleet.stop()


async def test_a_failing_report_holds_a_ready_node_back_until_a_passing_one(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet) as f:
        await f.agent_health("n1", report(nvlink_down=(2,)))
        node = await f.get_node("n1")
        assert node.state.value == "ready" and not node.schedulable
        assert "takes no new work: GPU 0 NVLink(s) down: [2]" in node.state_reason
        alloc = await f.create_allocation("k", AllocationSpec(nodes=1))
        assert alloc.state == AllocationState.PENDING
        assert "failing the health baseline" in alloc.reason
        await f.agent_health("n1", report())  # the link is back
        for _ in range(50):  # the pass it asks for runs in the background
            if (await f.allocations.get(alloc.id)).state == AllocationState.READY:
                break
            await asyncio.sleep(0.02)
        assert (await f.allocations.get(alloc.id)).state == AllocationState.READY
        assert "takes no new work" not in (await f.get_node("n1")).state_reason


async def test_uncorrectable_ecc_holds_back_and_no_gate_means_no_hold(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet) as f:
        await f.agent_health("n1", report(dbe=1))
        assert "uncorrectable ECC" in (await f.get_node("n1")).state_reason
        assert not (await f.get_node("n1")).schedulable
    async with fleet_of(make_fleet, baseline_gate=None) as f:
        await f.agent_health("n1", report(dbe=1))
        assert (await f.get_node("n1")).schedulable


async def test_a_report_marks_its_node_for_the_scheduler_only_when_the_verdict_changes(
    make_fleet: Callable[..., Fleet],
) -> None:
    """Thousands of reports a second each used to make the next scheduling
    pass work out the reporting node's spec again; only a changed verdict
    can change what the scheduler sees."""
    async with fleet_of(make_fleet) as f:
        specs = f.allocations.specs
        marked: list[str] = []
        touch = specs.touch
        specs.touch = lambda name: (marked.append(name), touch(name))[1]  # type: ignore[method-assign]
        await f.agent_health("n1", report())
        first = list(marked)
        for _ in range(5):
            await f.agent_health("n1", report())  # passing, as before: nothing to look at
        assert marked == first
        await f.agent_health("n1", report(dbe=2))
        assert marked == [*first, "n1"]
        await f.agent_health("n1", report(dbe=3))  # fails again, for another reason
        assert marked == [*first, "n1", "n1"]
        await f.agent_health("n1", report(dbe=3))  # the same verdict
        assert marked == [*first, "n1", "n1"]
        await f.agent_health("n1", report())
        assert marked == [*first, "n1", "n1", "n1"]
        assert (await f.get_node("n1")).schedulable


async def test_a_report_is_judged_once_however_often_it_is_read(
    make_fleet: Callable[..., Fleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's verdict is kept with the report's version: reads (GetNode,
    the scheduler's specs, ListNodes) of the same report do not judge it
    again; a new report is judged once."""
    from controller.core import nodes as nodes_module

    judged: list[int] = []
    real = nodes_module.gate_problems

    def counting(gate: object, health: HealthReport) -> list[str]:
        judged.append(len(health.gpus))
        return real(gate, health)  # type: ignore[arg-type]

    monkeypatch.setattr(nodes_module, "gate_problems", counting)
    async with fleet_of(make_fleet) as f:
        await f.agent_health("n1", report(nvlink_down=(2,)))
        assert len(judged) == 1
        for _ in range(5):
            assert not (await f.get_node("n1")).schedulable
            await f.list_nodes()
        assert len(judged) == 1
        await f.agent_health("n1", report())
        assert len(judged) == 2
        assert (await f.get_node("n1")).schedulable
        assert len(judged) == 2
