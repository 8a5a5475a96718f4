"""Node rules in the core alone: enrolment checks, transitions, drain and
undrain, power sync decisions and health reports — on both stores."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import Racks, reconcile, spec
from core_fakes import FakeBmc

from controller.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import AllocationSpec
from controller.core.ports import Store
from controller.core.power_sync import pass_pacing, pause_before_next
from controller.core.profiles import ProfileCatalog, parse_profile
from controller.core.states import AllocationState, NodeState, PowerState
from controller.core.transitions import load_node, move

pytestmark = pytest.mark.timeout(60)

TRAIN = parse_profile({"version": "v1", "name": "train", "gpu": {"persistence_mode": True}}, "test")


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[tuple[Fleet, Racks]]:
    fleet = make_fleet(ProfileCatalog({"train": TRAIN}))
    async with contextlib.AsyncExitStack() as stack:
        yield fleet, Racks(fleet, stack)
        await fleet.stop()


async def test_enrolling_with_an_unknown_profile_stores_nothing(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, _ = fleet
    with pytest.raises(NotFound, match="profile 'nope'"):
        await f.enroll(spec("n1", profile="nope"))
    assert await f.list_nodes() == []
    assert await f.events.since(0) == []


@pytest.mark.parametrize(
    ("name", "rack", "url", "error"),
    [
        ("bad name!", "", "fake://x", "node name"),
        ("n1", "rack one", "fake://x", "rack name"),
        ("n1", "", "http://x", "must start with fake://"),
    ],
    ids=["node-name", "rack-name", "bmc-url"],
)
async def test_bad_enrolments_are_refused_and_store_nothing(
    fleet: tuple[Fleet, Racks], name: str, rack: str, url: str, error: str
) -> None:
    f, _ = fleet
    bad = spec(name, rack)
    bad = type(bad)(**{**bad.__dict__, "bmc_url": url})
    with pytest.raises(InvalidArgument, match=error):
        await f.enroll(bad)
    assert await f.list_nodes() == []


async def test_enrolment_is_idempotent_and_a_changed_bmc_conflicts(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, _ = fleet
    first = await f.enroll(spec("n1", "r1"))
    again = await f.enroll(spec("n1", "r1"))
    assert again.updated_at == first.updated_at
    moved = spec("n1", "r2")
    with pytest.raises(AlreadyExists):
        await f.enroll(moved)
    assert [e.kind for e in await f.events.since(0)] == ["node.enrolled"]


async def test_transitions_are_checked_recorded_and_idempotent(store: Store) -> None:
    fleet = Fleet(store, FakeBmc())
    await fleet.enroll(spec("n1"))

    def to_inspecting(tx: object) -> bool:
        return move(tx, load_node(tx, "n1"), NodeState.INSPECTING, "look")  # type: ignore[arg-type]

    assert await store.tx(to_inspecting) is True
    assert await store.tx(to_inspecting) is False  # already there: nothing recorded
    with pytest.raises(FailedPrecondition, match="cannot go from inspecting to allocated"):
        await store.tx(lambda tx: move(tx, load_node(tx, "n1"), NodeState.ALLOCATED, "skip ahead"))
    moves = [e.data for e in await fleet.events.since(0) if e.kind == "node.transition"]
    assert moves == [{"from_state": "enrolled", "to_state": "inspecting"}]
    assert (await fleet.get_node("n1")).state == NodeState.INSPECTING


async def test_a_failed_unit_of_work_leaves_nothing_behind(store: Store) -> None:
    fleet = Fleet(store, FakeBmc())
    await fleet.enroll(spec("n1"))

    def half_done(tx: object) -> None:
        node = load_node(tx, "n1")  # type: ignore[arg-type]
        move(tx, node, NodeState.INSPECTING, "look")  # type: ignore[arg-type]
        raise RuntimeError("crash mid-transaction")

    with pytest.raises(RuntimeError):
        await store.tx(half_done)
    assert (await fleet.get_node("n1")).state == NodeState.ENROLLED
    assert [e.kind for e in await fleet.events.since(0)] == ["node.enrolled"]


async def test_undrain_resumes_preparing_a_node_for_its_allocations_profile(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["n1", "n2"], rack="r1")
    alloc = await f.create_allocation("p", AllocationSpec(nodes=1, profile="train"))
    assert alloc.state == AllocationState.PREPARING
    (name,) = alloc.nodes
    record = await f.nodes.record(name)
    assert record.state == NodeState.PREPARING and record.allocation_profile == "train"
    await f.drain(name, "operator looks at it")
    await f.undrain(name)
    record = await f.nodes.record(name)
    assert record.state == NodeState.PREPARING and record.allocation_profile == "train"
    await reconcile(f)
    assert (await f.get_allocation(alloc.id)).state == AllocationState.READY
    record = await f.nodes.record(name)
    assert record.applied_profile == "train" and not record.mid_operation


async def test_a_drained_node_ends_in_maintenance_once_free_and_undrain_reinspects(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["n1"], rack="r1")
    drained = await f.drain("n1", "swap a fan")
    assert drained.state == NodeState.DRAINING and not drained.schedulable
    await reconcile(f)
    assert (await f.get_node("n1")).state == NodeState.MAINTENANCE
    await f.undrain("n1")
    await reconcile(f)
    node = await f.get_node("n1")
    assert node.state == NodeState.READY and node.schedulable


async def test_power_sync_tells_once_per_change_and_an_unreadable_bmc_only_changes_health(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["n1", "n2"], rack="r1")
    alloc = await f.create_allocation("job", AllocationSpec(nodes=1))
    (held,) = alloc.nodes
    bmc.power[held] = "off"  # someone pulled the plug behind Kiln's back ...
    f.agents.drop(held)  # ... and the node's agent went with its power
    assert await f.power_sync.run_once() == [held]
    assert await f.power_sync.run_once() == [held]  # still off: no second event
    drift = [e for e in await f.events.since(0) if e.kind == "node.drift"]
    assert len(drift) == 1 and drift[0].data == {"expected": "on", "actual": "off"}
    notices = [e for e in await f.events.since(0) if e.kind == "allocation.notice"]
    assert [e.allocation for e in notices] == [alloc.id]
    assert (await f.get_node(held)).power == PowerState.OFF

    other = next(n for n in ("n1", "n2") if n != held)
    bmc.unreachable.add(other)  # its agent still up: read every pass only with 1
    f.power_sync.vouched_every = 1
    before = (await f.get_node(other)).power
    await f.power_sync.run_once()
    node = await f.get_node(other)
    assert node.bmc_health == "unreachable" and node.power == before


async def test_power_sync_spreads_a_pass_and_a_fleet_beyond_its_rate_gets_a_longer_one(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, caplog: pytest.LogCaptureFixture
) -> None:
    f = make_fleet(power_sync_interval=60.0, power_sync_rate=200.0, power_sync_vouched_every=1)
    async with contextlib.AsyncExitStack() as stack:
        await Racks(f, stack).add(["n1", "n2", "n3"], rack="r1")
        await f.power_sync.run_once()
        assert bmc.spreads == [30.0]  # half the interval: 3 BMCs at 200/s fit in it
        caplog.set_level(logging.WARNING, logger="controller.core.power_sync")
        f.power_sync.rate = 0.04  # 3 BMCs at 0.04 a second: 75 s, beyond the 60 s interval
        await f.power_sync.run_once()
        await f.power_sync.run_once()
        assert bmc.spreads[1:] == [pytest.approx(75.0)] * 2
        (said,) = [r.getMessage() for r in caplog.records]  # once, not every pass
        assert said.startswith("power sync: 3 BMCs at 0.04 a second (--power-sync-rate)")
        assert "take 75s a pass, longer than the 60s interval" in said
        assert "each BMC is read about every 90s" in said  # the pass and a quarter interval
        f.power_sync.rate = 200.0  # back within the interval: said again if it outgrows it
        await f.power_sync.run_once()
        assert bmc.spreads[-1] == 30.0
        f.power_sync.spread = 0.0  # begun at once: only the rate paces the pass
        await f.power_sync.run_once()
        assert bmc.spreads[-1] == pytest.approx(3 / 200.0)
        await f.stop()
    with pytest.raises(ValueError, match="0 \\(no cap\\) or more"):
        make_fleet(power_sync_rate=-1.0)
    with pytest.raises(ValueError, match="a share of the interval, from 0 to 1"):
        make_fleet(power_sync_spread=1.5)


def test_a_pass_is_spread_and_capped_in_the_controller_and_begun_at_once_in_readers() -> None:
    assert pass_pacing(readers=False) == (0.5, 200.0)
    assert pass_pacing(readers=True) == (0.0, 0.0)
    assert pass_pacing(readers=True, spread=0.25, rate=50.0) == (0.25, 50.0)  # as the operator says
    assert pass_pacing(readers=False, spread=0.0) == (0.0, 200.0)


def bmc_reads(bmc: FakeBmc) -> list[str]:
    """The nodes whose power the fake BMC was asked, since the last call."""
    nodes = [node for node, op in bmc.calls if op == "status"]
    bmc.calls.clear()
    return nodes


async def test_power_sync_reads_a_node_its_agent_vouches_for_every_fifth_pass(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    names = [f"n{i:02d}" for i in range(20)]
    await racks.add(names, rack="r1")
    await reconcile(f)
    assert f.power_sync.vouched_every == 5  # the default
    await f.power_sync.run_once()  # every BMC answered once: health ok
    bmc_reads(bmc)
    per_node: dict[str, int] = dict.fromkeys(names, 0)
    for _ in range(5):
        await f.power_sync.run_once()
        for node in bmc_reads(bmc):
            per_node[node] += 1
        assert f.power_sync.skipped > 0
    # each read on its own pass of the five, not all of them on one
    assert per_node == dict.fromkeys(names, 1)

    # A node whose agent is gone is read every pass again ...
    f.agents.drop("n03")
    for _ in range(3):
        await f.power_sync.run_once()
        assert "n03" in bmc_reads(bmc)
    # ... and so is one whose BMC did not answer, until it does.
    bmc.unreachable.add("n04")
    await f.power_sync.run_once()  # n04's turn may not be now: read it whenever it is
    for _ in range(5):
        await f.power_sync.run_once()
    bmc_reads(bmc)
    assert (await f.get_node("n04")).bmc_health != "ok"
    await f.power_sync.run_once()
    assert "n04" in bmc_reads(bmc)
    bmc.unreachable.discard("n04")

    # 1: every BMC every pass, agents or not.
    f.power_sync.vouched_every = 1
    await f.power_sync.run_once()
    assert sorted(bmc_reads(bmc)) == names and f.power_sync.skipped == 0


async def test_power_sync_reads_a_vouched_node_kiln_expects_off(
    fleet: tuple[Fleet, Racks], bmc: FakeBmc
) -> None:
    f, racks = fleet
    await racks.add(["n1", "n2"], rack="r1")
    await reconcile(f)
    await f.power_sync.run_once()
    await f.power("n1", "off")  # Kiln powered it off: its agent has not gone yet
    bmc_reads(bmc)
    for _ in range(3):
        await f.power_sync.run_once()
        assert "n1" in bmc_reads(bmc)


async def test_power_sync_refuses_reading_vouched_nodes_less_than_every_pass(
    make_fleet: Callable[..., Fleet],
) -> None:
    with pytest.raises(ValueError, match="every 1 or more passes"):
        make_fleet(power_sync_vouched_every=0)


def test_power_sync_passes_begin_an_interval_apart_and_long_ones_a_quarter_apart() -> None:
    # A pass that began at 0 and ended at ``now``, the interval 60 s:
    assert pause_before_next(0.0, 0.2, 60.0) == pytest.approx(59.8)  # a few BMCs
    assert pause_before_next(0.0, 30.5, 60.0) == pytest.approx(29.5)  # spread over half
    assert pause_before_next(0.0, 50.0, 60.0) == 15.0  # slow BMCs: a quarter interval of quiet
    assert pause_before_next(0.0, 125.0, 60.0) == 15.0  # beyond the interval at the rate cap
    assert pause_before_next(100.0, 100.0, 60.0) == 60.0  # the first pass, an interval in


async def test_a_drift_report_is_stored_typed_and_wakes_event_watchers(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, racks = fleet
    await racks.add(["n1"], rack="r1")
    last = (await f.events.since(0))[-1].seq
    watcher = f.watch_events(last)
    next_event = asyncio.ensure_future(anext(watcher))
    await asyncio.sleep(0)
    report = HealthReport(
        sampled_at=1.0,
        gpus=(GpuHealth(index=0, temp_c=41.5, xids=(79,)),),
        drift=("gpu 0: persistence mode",),
    )
    await f.agent_health("n1", report)
    event = await asyncio.wait_for(next_event, 0.5)  # woken by the commit, not the 1 s poll
    assert event.kind == "node.gpu_drift" and event.data["drift"] == ["gpu 0: persistence mode"]
    stored = (await f.get_node("n1")).health
    assert stored == report
    await watcher.aclose()


async def test_a_report_from_an_agent_of_an_unknown_node_is_ignored(
    fleet: tuple[Fleet, Racks],
) -> None:
    f, _ = fleet
    await f.agent_health("ghost", HealthReport(gpus=(GpuHealth(index=0),)))
    assert await f.list_nodes() == []
    with pytest.raises(NotFound):
        await f.agent_connected("ghost", [], "")
    assert not f.agents.is_connected("ghost")
