"""A health report per job: what an allocation's GPUs went through while it
held them, written when it is released and read back by id.

Through a Fleet on both stores, with each node's GPUs played by the NVML
fake and sampled as the agent samples them (``agent.health.HealthSampler``);
faults are injected the way ``kiln sim fault`` injects them. The tally's
arithmetic (gaps, counter resets, the XID cap) is table-tested on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from core_builders import Racks

from agent.health import HealthSampler
from agent.nvml import FakeNvml, open_backend
from controller.core.errors import FailedPrecondition, NotFound
from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.job_health import (
    MAX_GAP_S,
    XIDS_KEPT,
    AllocationReport,
    GpuJobHealth,
    JobHealth,
    report_data,
    report_from_event,
)
from controller.core.kinds import EventKind
from controller.core.live import LiveHealth
from controller.core.model import AllocationSpec, EventInfo
from controller.core.ports import Store
from controller.core.states import AllocationState

T0 = 1_700_000_000.0  # the agents' clock in these tests (sampled_at)
GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuHealth))


class Gpus:
    """One node's GPUs: a fake GB200 tray (4 GPUs), sampled as its agent does."""

    def __init__(self, node: str) -> None:
        nvml = open_backend("fake:gb200", node_name=node)
        assert isinstance(nvml, FakeNvml)
        nvml.nvmlInit()
        self.nvml = nvml
        self.sampler = HealthSampler(nvml)

    def fault(self, **spec: Any) -> None:
        self.nvml.faults.apply_fault(spec)

    def report(self, at: float) -> HealthReport:
        """A sample as the controller gets it (the wire's fields are the same)."""
        sample = self.sampler.sample()
        gpus = tuple(GpuHealth(**{f: getattr(g, f) for f in GPU_FIELDS}) for g in sample.gpus)
        return HealthReport(sampled_at=at, gpus=gpus)


@contextlib.asynccontextmanager
async def fleet_of(
    make: Callable[..., Fleet], names: tuple[str, ...] = ("n1", "n2", "n3")
) -> AsyncIterator[tuple[Fleet, dict[str, Gpus]]]:
    fleet = make()
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(list(names), rack="r1")
        yield fleet, {n: Gpus(n) for n in names}
        await fleet.stop()


async def report_all(
    fleet: Fleet, gpus: dict[str, Gpus], nodes: tuple[str, ...], at: float
) -> None:
    for node in nodes:
        await fleet.agent_health(node, gpus[node].report(at))


def gpu(report: AllocationReport, node: str, index: int) -> GpuJobHealth:
    return next(g for g in report.gpus if g.node == node and g.index == index)


async def stored_reports(fleet: Fleet, allocation: str) -> list[EventInfo]:
    """The allocation's ``allocation.health_report`` events."""
    events = await fleet.events.since(0, allocation=allocation)
    return [e for e in events if e.kind == EventKind.ALLOCATION_HEALTH_REPORT]


@pytest.mark.timeout(60)
async def test_a_released_allocation_reports_an_injected_xid_and_throttle_time(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet) as (fleet, gpus):
        alloc = await fleet.create_allocation("job", AllocationSpec(nodes=2, topology="nvlink"))
        assert alloc.state == AllocationState.READY
        held = alloc.nodes
        hot, other = held
        await report_all(fleet, gpus, held, T0)  # the baseline, before anything happens
        gpus[hot].fault(kind="heat", gpu=0, target_c=90, rate_c_per_s=1e6)  # past slowdown
        gpus[hot].fault(kind="xid", gpu=1, code=13)
        gpus[hot].fault(kind="power_draw", gpu=2, watts=5000)  # capped: SwPowerCap
        gpus[hot].fault(kind="ecc", gpu=3, sbe=4)
        gpus[hot].fault(kind="row_remap", gpu=3, correctable=2, uncorrectable=0)
        gpus[hot].fault(kind="nvlink_errors", gpu=3, link=1, crc=5)
        await report_all(fleet, gpus, held, T0 + 5)
        await report_all(fleet, gpus, held, T0 + 10)
        free = next(n for n in gpus if n not in held)
        await fleet.agent_health(free, gpus[free].report(T0 + 10))  # not held: not counted
        with pytest.raises(FailedPrecondition, match="is still held; its report is written"):
            await fleet.allocations.report(alloc.id)

        await fleet.release(alloc.id)
        report = await fleet.allocations.report(alloc.id)

        assert report.allocation == alloc.id and not report.partial
        assert report.reports == 6  # three from each held node
        assert {(g.node, g.index) for g in report.gpus} == {(n, i) for n in held for i in range(4)}
        heated = gpu(report, hot, 0)
        # Set at T0+5 and T0+10: half of the first gap, all of the second.
        assert heated.throttled_s == {"hw_thermal": 7.5, "hw_slowdown": 7.5}
        assert heated.max_temp_c == 90
        assert gpu(report, hot, 1).xids == (13,)
        assert gpu(report, hot, 2).throttled_s == {"sw_power_cap": 7.5}
        counted = gpu(report, hot, 3)
        assert (counted.ecc_sbe, counted.ecc_dbe, counted.rows_remapped) == (4, 0, 2)
        assert counted.nvlink_errors == 5
        cool = gpu(report, other, 0)
        assert cool.throttled_s == {} and cool.xids == () and cool.max_temp_c is not None
        assert all(g.energy_j > 0 for g in report.gpus)
        # 10 s at the fake GB200's idle 140 W, at most: a GPU held at its power cap draws more.
        assert cool.energy_j == pytest.approx(1400, rel=0.01)
        assert gpu(report, hot, 2).energy_j == pytest.approx(1200 * 7.5 + 140 * 2.5, rel=0.01)
        assert gpu(report, hot, 0).uuid.startswith("GPU-")
        assert report.started_at <= report.ended_at and report.replacements == ()

        stored = await stored_reports(fleet, alloc.id)
        assert len(stored) == 1  # one event, recorded with the release
        assert report_from_event(stored[0]) == report
        (written,) = [g for g in stored[0].data["gpus"] if (g["node"], g["index"]) == (hot, 1)]
        assert written["xids"] == [13] and written["throttled_s"] == {}
        assert fleet.allocations.job_health.followed == 0 and len(fleet.allocations.job_health) == 0

        await fleet.release(alloc.id)  # idempotent: no second report
        assert len(await stored_reports(fleet, alloc.id)) == 1
        assert await fleet.allocations.report("job") == report  # by idempotency key too


@pytest.mark.timeout(60)
async def test_a_replacement_is_listed_and_the_failed_node_counts_only_while_held(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet) as (fleet, gpus):
        spec = AllocationSpec(nodes=2, topology="nvlink", spares_per_domain=1)
        alloc = await fleet.create_allocation("spare", spec)
        failed, kept = alloc.nodes
        spare = alloc.spares[0]
        await report_all(fleet, gpus, (failed, kept, spare), T0)
        gpus[failed].fault(kind="xid", gpu=0, code=31)
        await report_all(fleet, gpus, (failed, kept, spare), T0 + 5)
        await fleet.drain(failed, "XID 31")  # draining, still in the allocation: counts
        gpus[failed].fault(kind="xid", gpu=0, code=32)
        await fleet.agent_health(failed, gpus[failed].report(T0 + 7))

        await fleet.allocations.node_failed(failed, "GPU 0 XID 31")
        gpus[failed].fault(kind="xid", gpu=0, code=43)  # after it left: not the job's
        await report_all(fleet, gpus, (failed, kept, spare), T0 + 10)
        await fleet.release(alloc.id)
        report = await fleet.allocations.report(alloc.id)

        assert gpu(report, failed, 0).xids == (31, 32)
        assert len(report.replacements) == 1
        replaced = report.replacements[0]
        assert (replaced.failed, replaced.replacement) == (failed, spare)
        assert "GPU 0 XID 31" in replaced.reason and replaced.at > 0
        assert {g.node for g in report.gpus} == {failed, kept, spare}
        assert report.reports == 9  # the failed node's report after it left is not one


@pytest.mark.timeout(60)
async def test_a_replacement_made_before_a_restart_is_in_the_report_after_it(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet) as (fleet, _):
        spec = AllocationSpec(nodes=2, topology="nvlink", spares_per_domain=1)
        alloc = await fleet.create_allocation("spare", spec)
        failed, spare = alloc.nodes[0], alloc.spares[0]
        await fleet.drain(failed, "XID 79")
        await fleet.allocations.node_failed(failed, "GPU 0 XID 79")

        restarted = make_fleet()  # knows of the replacement from the store only
        await restarted.nodes.loaded()
        await restarted.release(alloc.id)
        report = await restarted.allocations.report(alloc.id)
        await restarted.stop()
        assert [(r.failed, r.replacement) for r in report.replacements] == [(failed, spare)]
        # Another allocation, admitted and released by this controller with no
        # replacement, reports none.
        other = await fleet.create_allocation("plain", AllocationSpec(nodes=1))
        await fleet.release(other.id)
        assert (await fleet.allocations.report(other.id)).replacements == ()


@pytest.mark.timeout(60)
async def test_reports_of_missing_pending_and_refused_allocations_are_refused(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet, ("n1",)) as (fleet, _):
        with pytest.raises(NotFound, match="allocation 'alloc-nope' not found"):
            await fleet.allocations.report("alloc-nope")
        first = await fleet.create_allocation("a", AllocationSpec(nodes=1))
        waiting = await fleet.create_allocation("b", AllocationSpec(nodes=1))
        assert waiting.state == AllocationState.PENDING
        with pytest.raises(FailedPrecondition, match="still pending"):
            await fleet.allocations.report(waiting.id)
        await fleet.release(waiting.id)  # cancelled while pending: an empty report
        empty = await fleet.allocations.report(waiting.id)
        assert empty.gpus == () and empty.reports == 0 and not empty.partial
        assert empty.started_at == 0.0
        await fleet.release(first.id)


@pytest.mark.timeout(60)
async def test_an_allocation_held_across_a_restart_gets_a_partial_report(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with fleet_of(make_fleet, ("n1",)) as (fleet, gpus):
        alloc = await fleet.create_allocation("long", AllocationSpec(nodes=1))
        await fleet.agent_health("n1", gpus["n1"].report(T0))
        gpus["n1"].fault(kind="xid", gpu=2, code=13)
        await fleet.agent_health("n1", gpus["n1"].report(T0 + 5))

        restarted = make_fleet()  # a new controller on the same database
        await restarted.nodes.loaded()
        await restarted.agent_health("n1", gpus["n1"].report(T0 + 10))
        gpus["n1"].fault(kind="xid", gpu=3, code=31)
        await restarted.agent_health("n1", gpus["n1"].report(T0 + 15))
        await restarted.release(alloc.id)
        report = await restarted.allocations.report(alloc.id)
        await restarted.stop()

        assert report.partial and report.reports == 2  # counts from the restart only
        assert gpu(report, "n1", 2).xids == () and gpu(report, "n1", 3).xids == (31,)
        assert report.started_at >= restarted.allocations.job_health.started_at
        # The first controller's report reads the same event.
        assert await fleet.allocations.report(alloc.id) == report


# -- the tally's arithmetic ------------------------------------------------------


def reading(**fields: Any) -> HealthReport:
    at = fields.pop("at")
    return HealthReport(sampled_at=at, gpus=(GpuHealth(index=0, uuid="GPU-0", **fields),))


def tallied(*reports: HealthReport) -> GpuJobHealth:
    health = JobHealth(clock=lambda: 0.0)
    for r in reports:
        health.observe("a", "n1", r, at=r.sampled_at)
    (only,) = health.snapshot("a").gpus
    return only


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("reports", "check"),
    [
        pytest.param(
            [reading(at=0, ecc_sbe_aggregate=5), reading(at=5, ecc_sbe_aggregate=7)],
            lambda g: g.ecc_sbe == 2,
            id="ecc-counts-growth-not-the-counter",
        ),
        pytest.param(
            [
                reading(at=0, ecc_sbe_volatile=5),
                reading(at=5, ecc_sbe_volatile=0),  # driver reload: volatile resets
                reading(at=10, ecc_sbe_volatile=3),
            ],
            lambda g: g.ecc_sbe == 3,
            id="a-counter-reset-restarts-from-its-value",
        ),
        pytest.param(
            [
                reading(at=0, ecc_dbe_volatile=1, ecc_dbe_aggregate=1),
                reading(at=5, ecc_dbe_volatile=3, ecc_dbe_aggregate=3),
            ],
            lambda g: g.ecc_dbe == 2,
            id="volatile-and-aggregate-never-count-twice",
        ),
        pytest.param(
            [
                reading(at=0, clock_event_reasons=0x20, power_w=100.0),
                reading(at=3600, clock_event_reasons=0x20, power_w=100.0),
            ],
            lambda g: g.throttled_s == {"sw_thermal": MAX_GAP_S} and g.energy_j == 100 * MAX_GAP_S,
            id="a-silent-agent-counts-at-most-the-capped-gap",
        ),
        pytest.param(
            [
                reading(at=0, clock_event_reasons=0x1 | 0x2),
                reading(at=5, clock_event_reasons=0x1 | 0x2),
            ],
            lambda g: g.throttled_s == {},
            id="idle-and-application-clocks-are-not-throttling",
        ),
        pytest.param(
            [
                reading(at=10, clock_event_reasons=0x80),
                reading(at=4, clock_event_reasons=0x80),  # out of order: no gap
            ],
            lambda g: g.throttled_s == {},
            id="a-report-older-than-the-last-counts-no-time",
        ),
        pytest.param(
            [reading(at=0, remap_correctable=None), reading(at=5, remap_correctable=None)],
            lambda g: g.rows_remapped == 0,
            id="remaps-not-read-count-nothing",
        ),
        pytest.param(
            [reading(at=0, xids=(13,) * XIDS_KEPT), reading(at=5, xids=(13, 31))],
            lambda g: len(g.xids) == XIDS_KEPT + 1 and g.xids[-1] == 31,
            id="past-the-xid-cap-only-new-codes-are-added",
        ),
        pytest.param(
            [reading(at=0, temp_c=None), reading(at=5, temp_c=None)],
            lambda g: g.max_temp_c is None,
            id="no-temperature-read-is-none-not-zero",
        ),
    ],
)
def test_tally(reports: list[HealthReport], check: Callable[[GpuJobHealth], bool]) -> None:
    assert check(tallied(*reports))


@pytest.mark.timeout(10)
def test_a_paced_agents_gaps_count_whole_and_a_silent_ones_still_capped() -> None:
    """The controller asked its agents for one report every 45 s: a gap of
    45 s counts whole, one of an hour is still capped (at two intervals)."""
    paced = JobHealth(clock=lambda: 0.0, report_interval=lambda: 45.0)
    for at in (0.0, 45.0, 3645.0):
        paced.observe("a", "n1", reading(at=at, clock_event_reasons=0x20, power_w=100.0), at=at)
    (gpu_health,) = paced.snapshot("a").gpus
    assert gpu_health.throttled_s == {"sw_thermal": 45.0 + 90.0}
    assert gpu_health.energy_j == 100.0 * (45.0 + 90.0)


@pytest.mark.timeout(30)
async def test_the_fleets_tallies_follow_its_pace(make_fleet: Callable[..., Fleet]) -> None:
    async with fleet_of(make_fleet, ("n1",)) as (fleet, _):
        fleet.pace.stretched = 50.0  # behind: every agent asked for one report each 50 s
        alloc = await fleet.create_allocation("paced", AllocationSpec(nodes=1))
        for at in (T0, T0 + 50):
            await fleet.agent_health("n1", reading(at=at, clock_event_reasons=0x20))
        (gpu_health,) = fleet.allocations.job_health.snapshot(alloc.id).gpus
        assert gpu_health.throttled_s == {"sw_thermal": 50.0}  # not capped at 30 s


@pytest.mark.timeout(10)
def test_the_report_round_trips_through_its_event_data() -> None:
    health = JobHealth(clock=lambda: 0.0)
    health.observe("a", "n1", reading(at=0, temp_c=50.0, xids=(79,)), at=0.0)
    report = AllocationReport(
        allocation="a", started_at=1.0, ended_at=2.0, gpus=health.snapshot("a").gpus, reports=1
    )
    data = report_data(report)
    event = EventInfo(1, 2.0, str(EventKind.ALLOCATION_HEALTH_REPORT), "", "a", "", "", data)
    assert report_from_event(event) == report
    assert set(data["gpus"][0]) == {f.name for f in dataclasses.fields(GpuJobHealth)}


@pytest.mark.timeout(10)
async def test_a_failing_listener_does_not_stop_a_report_landing(store: Store) -> None:
    live = LiveHealth(store)
    seen: list[str] = []

    def broken(node: str, health: HealthReport, at: float) -> None:
        raise RuntimeError("a bug")

    live.listen(broken)
    live.listen(lambda node, health, at: seen.append(node))
    live.note("n1", reading(at=1.0))
    live.note("n1", None)  # a sighting tells no listener
    assert live.health("n1") is not None and seen == ["n1"]
